"""The fault tier (marker `fault`): every refusal and failure a person reads is a
sentence about their situation, never an exception's class name or repr.

Each path is fed here: Add local model's refusals, a model that fails to load,
import's refusals, requests the engine refuses, failures nobody planned for in
a reply, a load, learning and timing, a full disk, a download, an engine that
keeps dying.
"""

from __future__ import annotations

import errno
import json
import os
import queue
from pathlib import Path

import pytest

from tests.test_faults_files import assert_sentence

pytestmark = pytest.mark.fault

RAW = ValueError("cannot reshape array of size 4662496 into shape (1536,7350)")


def _catalog_refusals(tmp_path: Path, smol_tok) -> list[str]:
    from omnidraft.core.models.catalog import ModelCatalog, ModelError

    from tests.tiny import tiny_smol_target, write_tiny_gguf

    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    not_model = tmp_path / "notes.txt"
    not_model.write_text("hello")
    fake_gguf = tmp_path / "fake.gguf"
    fake_gguf.write_bytes(b"GGUF" + os.urandom(200))
    wrong_magic = tmp_path / "wrong.gguf"
    wrong_magic.write_bytes(os.urandom(200))
    whole = write_tiny_gguf(tmp_path / "tiny.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    empty = tmp_path / "empty-folder"
    empty.mkdir()
    bad_config = tmp_path / "bad-config"
    bad_config.mkdir()
    (bad_config / "config.json").write_text("{ not json")
    folder = tmp_path / "junk"
    tiny_smol_target(folder, smol_tok)
    (folder / "tokenizer.json").write_bytes(os.urandom(512))
    random_weights = tmp_path / "random"
    tiny_smol_target(random_weights, smol_tok)
    (random_weights / "model.safetensors").write_bytes(os.urandom(4096))

    texts = []
    for path in (loop, tmp_path / "missing.gguf", not_model, fake_gguf, wrong_magic, cut, empty, bad_config,
                 folder, random_weights):
        with pytest.raises(ModelError) as refused:
            ModelCatalog().add(path)
        texts.append(str(refused.value))
    with pytest.raises(ModelError) as refused:
        ModelCatalog().get("no-such-model")
    texts.append(str(refused.value))
    return texts


def _import_refusals(tmp_path: Path) -> list[str]:
    from omnidraft.core.storage.chat_export import ChatImportError, read_chat_file

    files = {
        "broken.json": b'{"title": "x", "mess',
        "shape.json": b'{"title": "x", "messages": [{"role": "user", "content": 42}]}',
        "deep.json": b"[" * 100_000 + b"]" * 100_000,
        "binary.json": os.urandom(300),
        "notes.md": b"# My notes\n",
        "newer.json": json.dumps({"format": "omnidraft-chat", "version": 99, "conversation": {}}).encode(),
    }
    texts = []
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ChatImportError) as refused:
            read_chat_file(tmp_path / name)
        texts.append(str(refused.value))
    with pytest.raises(ChatImportError) as refused:
        read_chat_file(tmp_path / "gone.json")
    texts.append(str(refused.value))
    return texts


class _Catalog:
    load_warning = None

    def entries(self):
        return []

    def add(self, path):
        raise RAW

    def remove(self, model_id):
        raise KeyError(model_id)


class _FailingEngine:
    """An engine each of whose parts fails with a raw error."""

    catalog = _Catalog()
    target = None
    plain_step_due = True
    baseline_tokens_per_s = None
    evaluating = False

    def __init__(self, error: BaseException):
        self.error = error
        self.warnings: list[str] = []

    def __getattr__(self, name):
        def fail(*args, **kwargs):
            raise self.error
        return fail


def _worker_failures() -> list[str]:
    from omnidraft.core.worker.process import PLAIN_STEP_QUIET_S, WorkerLoop
    from omnidraft.core.worker.protocol import (
        AddModel,
        ChatRequest,
        DescribeTarget,
        ErrorEvent,
        RemoveModel,
        ResetPersonalization,
        SwitchTarget,
    )

    texts = []
    for error in (RAW, TypeError("TextEncodeInput must be Union[TextInputSequence, Tuple[...]]"),
                  RuntimeError("Error while serializing: IoError(Os { code: 28, message: \"No space left on device\" })"),
                  OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), KeyError("model.layers.0")):
        events: queue.Queue = queue.Queue()
        loop = WorkerLoop(queue.Queue(), events, _FailingEngine(error))
        for request in (ChatRequest(1, [{"role": "user", "content": "hi"}]), SwitchTarget(2, "x"),
                        AddModel(3, "/x"), RemoveModel(4, "x"), ResetPersonalization(5, "x"), DescribeTarget(6)):
            loop._handle_safely(request)
        loop.last_handled -= PLAIN_STEP_QUIET_S + 1
        loop._idle_step()  # timing plain steps
        loop.engine.plain_step_due = False
        loop._idle_step()  # learning
        texts += [e.message for e in events.queue if isinstance(e, ErrorEvent)]
    assert len(texts) >= 5 * 8
    return texts


def _engine_refusals(tmp_path: Path) -> list[str]:
    from omnidraft.core.models.catalog import BUNDLED, SMOLLM2_ID, ModelEntry, ModelError
    from omnidraft.core.models.context import InputError, fit_conversation
    from omnidraft.core.models.loader import load_failure
    from omnidraft.core.storage.persistence import DiskFullError, save_failure

    added = ModelEntry("mine-1", "Mine", str(tmp_path / "mine.gguf"))
    texts = []
    for entry in (added, BUNDLED[SMOLLM2_ID]):
        for error in (RAW, OSError(errno.ENOSPC, "No space left on device")):
            try:
                raise ModelError(f"{entry.name} could not be loaded: {error}") from error
            except ModelError as exc:
                texts.append(load_failure(entry, exc))
    for messages in ([{"role": "user", "content": "  "}], [{"role": "user", "content": "x" * 300_000}]):
        with pytest.raises(InputError) as refused:
            fit_conversation(messages, None, "template", 100, "Model")
        texts.append(str(refused.value))
    texts.append(str(DiskFullError(tmp_path / "chat.chat", 3 * 2**20)))
    texts.append(save_failure("what the drafter learned", tmp_path, OSError(errno.ENOSPC, "No space left")))
    texts.append(save_failure("what the drafter learned", tmp_path, PermissionError(errno.EACCES, "Permission denied")))
    return texts


def _app_texts() -> list[str]:
    from omnidraft.app.get_models_dialog import download_failure
    from omnidraft.app.worker_bridge import RESTART_HINT

    return [download_failure(RAW), download_failure(OSError(errno.ENOSPC, "No space left on device")),
            f"The engine stopped unexpectedly (signal 9) 4 times in a row; it was not restarted again. {RESTART_HINT}"]


def test_every_refusal_a_person_reads_is_a_sentence(home, tmp_path, smol_tok):
    texts = (_catalog_refusals(tmp_path, smol_tok) + _import_refusals(tmp_path) + _worker_failures()
             + _engine_refusals(tmp_path) + _app_texts())
    for text in texts:
        assert_sentence(text)
    disk = [t for t in texts if "disk is full" in t]
    assert len(disk) >= 8, "a full disk is named as such"
