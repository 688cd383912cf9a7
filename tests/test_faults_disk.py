"""The fault tier (marker `fault`): a full disk (ENOSPC, injected) during a save
or a model load is reported as a sentence naming the space needed, and nothing
already saved is lost.
"""

from __future__ import annotations

import errno
import os
import queue

import pytest
import torch

from tests.test_faults_files import assert_sentence

pytestmark = pytest.mark.fault


def _no_space(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_chat_saved_on_a_full_disk_keeps_what_was_saved(home, monkeypatch, no_real_keyring):
    from omnidraft.core.storage.conversations import ConversationStore

    store = ConversationStore()
    conv = store.new()
    store.append_message(conv.id, "user", "kept")
    with monkeypatch.context() as disk, pytest.raises(OSError) as full:
        disk.setattr(os, "fsync", _no_space)
        store.append_message(conv.id, "user", "lost to the full disk")
    assert "disk is full" in str(full.value) and "MB" in str(full.value)
    assert_sentence(str(full.value))
    again = ConversationStore()
    assert [m["content"] for m in again.get(conv.id).messages] == ["kept"] and not again.warnings
    assert not [p for p in store.folder.iterdir() if p.name.endswith(".tmp")]


def test_a_log_append_on_a_full_disk_leaves_no_damage_inside_the_log(home, monkeypatch, no_real_keyring):
    """A record cut short by a full disk is cut off again: the next append would
    otherwise leave it in the middle, where the reader takes it for damage."""
    from omnidraft.core.learning.replay_buffer import ReplayBuffer, Sample
    from omnidraft.core.storage import paths

    buffer = ReplayBuffer(paths.data_dir() / "replay.bin")
    buffer.add(Sample([1, 2, 3], 2, [4, 5], 1))
    buffer.save()
    real_write = os.write

    def half_then_full(fd, data):
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    buffer.add(Sample([1, 2, 3, 4], 2, [4, 5], 1))
    with monkeypatch.context() as disk, pytest.raises(OSError):
        disk.setattr(os, "write", half_then_full)
        buffer.save()
    buffer.add(Sample([1, 2, 3, 5], 2, [4, 5], 1))
    buffer.save()
    loaded = ReplayBuffer.load(buffer.path)
    ids = [s.target_ids for s in loaded.samples()]
    # The sample the full disk cut short was never saved; the ones around it are whole.
    assert loaded.warning is None and ids[0] == [1, 2, 3] and ids[-1] == [1, 2, 3, 5]


def _learn(engine) -> None:
    from omnidraft.core.decoding.sampling import GenerationConfig
    from omnidraft.core.events import TurnFinished

    from tests.tiny import PROMPTS

    for prompt in PROMPTS:
        events = engine.complete(prompt, GenerationConfig(max_new_tokens=12), speculative=True)
        next(e for e in events if isinstance(e, TurnFinished))


def test_learning_on_a_full_disk_tells_the_person_and_keeps_the_saved_adapter(home, target_dir, monkeypatch):
    """Before: "trained 1 steps", then the adapter failed to save and nothing was shown."""
    from omnidraft.core.learning import adapters
    from omnidraft.core.worker.process import WorkerLoop
    from omnidraft.core.worker.protocol import Notice

    from tests.tiny import learning_engine

    engine = learning_engine(target_dir)
    target_id = engine.target.entry.id
    _learn(engine)
    while (p := engine.idle_step()) is not None and p.state == "running":
        pass
    saved = engine.adapters.meta(target_id)["steps"]
    _learn(engine)  # a second round, saved onto a full disk
    events: queue.Queue = queue.Queue()
    loop = WorkerLoop(queue.Queue(), events, engine)
    with monkeypatch.context() as disk:
        disk.setattr(adapters, "_write", _no_space)
        while loop.learning_has_work:
            loop._idle_step()
            loop._forward_warnings()
    notices = [e.message for e in list(events.queue) if isinstance(e, Notice)]
    full = [n for n in notices if "disk is full" in n]
    assert full and "MB" in full[0], notices
    assert_sentence(full[0])
    assert engine.adapters.meta(target_id)["steps"] == saved  # the copy saved before is intact


def test_a_model_load_on_a_full_disk_names_the_space_and_keeps_the_old_model(home, target_dir, tmp_path,
                                                                               monkeypatch):
    """Before: "Something went wrong in the engine (SafetensorError …)"."""
    from omnidraft.core.models import loader
    from omnidraft.core.worker.process import WorkerLoop
    from omnidraft.core.worker.protocol import ErrorEvent, ModelLoaded, SwitchTarget
    from safetensors import SafetensorError

    from tests.tiny import learning_engine, write_tiny_gguf

    engine = learning_engine(target_dir)
    old = engine.target.entry.id
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")

    def full(*_args, **_kwargs):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                              'message: "No space left on device" })')

    monkeypatch.setattr(loader, "_load_gguf", full)
    requests, events = queue.Queue(), queue.Queue()
    loop = WorkerLoop(requests, events, engine)
    loop._handle_safely(SwitchTarget(7, str(gguf)))
    answers = [e for e in list(events.queue) if getattr(e, "request_id", None) == 7]
    assert not any(isinstance(e, ModelLoaded) for e in answers)
    errors = [e.message for e in answers if isinstance(e, ErrorEvent)]
    assert errors and "disk is full" in errors[0] and "MB" in errors[0], errors
    assert_sentence(errors[0])
    assert engine.target.entry.id == old
    assert torch.is_tensor(next(engine.target.model.parameters()))
