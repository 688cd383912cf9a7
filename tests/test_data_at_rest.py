"""Nothing derived from the user's text is readable on disk, and
damaged or wrong-shape learned state is set aside, reported, and the rest kept."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine
from omnidraft.core.events import TurnFinished
from omnidraft.core.learning.adapters import LEGACY_META_FILE, META_FILE
from omnidraft.core.learning.replay_buffer import LOG_MAGIC
from omnidraft.core.learning.target_state import (
    NGRAM_FILE,
    NGRAM_LEGACY,
    POLICY_FILE,
    POLICY_LEGACY,
)
from omnidraft.core.storage import paths
from omnidraft.core.storage.conversations import ConversationStore
from omnidraft.core.storage.secure_store import MAGIC, save_encrypted

from tests.tiny import LEARN_PROMPTS, drafter_prediction, learning_engine

SECRET = "My bank passphrase is Quixotic-Marmalade-93817, keep it safe."


def _engine(target_dir: Path) -> Engine:
    return learning_engine(target_dir)


def _chat(engine: Engine, text: str) -> TurnFinished:
    events = engine.chat([{"role": "user", "content": text}], GenerationConfig(max_new_tokens=12))
    return next(e for e in events if isinstance(e, TurnFinished))


def _learn(engine: Engine) -> None:
    while (p := engine.idle_step()) is not None and p.state == "running":
        pass


def _flat(data: bytes) -> bytes:
    """File bytes without whitespace, so indented JSON lists read like compact ones."""
    return re.sub(rb"\s+", b"", data)


def test_a_secret_typed_in_a_chat_is_nowhere_readable_on_disk(home, target_dir, gemma_tok):
    engine = _engine(target_dir)
    store = ConversationStore()
    conv = store.new()
    store.append_message(conv.id, "user", SECRET)
    done = _chat(engine, SECRET)
    store.append_message(conv.id, "assistant", done.text)
    for p in LEARN_PROMPTS:  # enough turns for a learning batch
        _chat(engine, p)
    _learn(engine)
    engine._save_state()
    target_id = engine.target.entry.id
    assert engine.adapters.has_saved(target_id)

    # The n-gram cache learned pieces of the secret: these are what leaked before.
    pieces = []
    for d_run, t_run in engine.bridge.cache.entries.items():
        text = gemma_tok.decode(list(t_run))
        if len(text.strip()) >= 2 and text.strip() in SECRET:
            pieces.append(b"[" + ",".join(map(str, d_run)).encode() + b"],[" + ",".join(map(str, t_run)).encode() + b"]")
    assert pieces, "the test needs the cache to hold pieces of the secret"
    secret_ids = gemma_tok(SECRET, add_special_tokens=False)["input_ids"]
    needles = [*pieces, ",".join(map(str, secret_ids[3:7])).encode()]
    words = [w.encode() for w in re.findall(r"[A-Za-z0-9]{5,}", SECRET)]

    files = [f for f in paths.data_dir().rglob("*") if f.is_file()]
    assert any(f.name == NGRAM_FILE for f in files) and any(f.name == POLICY_FILE for f in files)
    for f in files:
        data = f.read_bytes()
        flat = _flat(data)
        for word in words:
            assert word not in data, f"{f} holds the secret's text"
        for needle in needles:
            assert needle not in flat, f"{f} holds the secret's token ids"
    # Only the key and peft's hyperparameters stay plaintext; everything else is ours,
    # encrypted whole or (the replay buffer's log) record by record.
    plain = {f.name for f in files if not f.read_bytes().startswith((MAGIC, LOG_MAGIC))}
    assert plain <= {"key", "adapter_config.json"}, plain


def _old_format(engine: Engine) -> tuple[dict, dict]:
    """The n-gram cache and drafting statistics as versions before encryption wrote them."""
    cache = {"max_entries": engine.bridge.cache.max_entries,
             "entries": [[list(k), list(v)] for k, v in engine.bridge.cache.entries.items()]}
    policy = {"stats": {k: vars(v) for k, v in engine.draft_policy.stats.items()}}
    return cache, policy


def test_plaintext_state_from_an_older_version_is_migrated(home, target_dir):
    engine = _engine(target_dir)
    for p in LEARN_PROMPTS:
        _chat(engine, p)
    cache, policy = _old_format(engine)
    assert cache["entries"] and policy["stats"]
    folder = engine.state_dir(engine.target.entry.id)
    for name in (NGRAM_FILE, POLICY_FILE):
        (folder / name).unlink()
    (folder / NGRAM_LEGACY).write_text(json.dumps(cache, indent=2))
    (folder / POLICY_LEGACY).write_text(json.dumps(policy, indent=2))

    again = _engine(target_dir)
    assert dict(again.bridge.cache.entries) == dict(engine.bridge.cache.entries)
    assert again.draft_policy.summary() == engine.draft_policy.summary()
    assert not again.warnings
    # Rewritten encrypted, the plaintext gone.
    assert not (folder / NGRAM_LEGACY).exists() and not (folder / POLICY_LEGACY).exists()
    assert (folder / NGRAM_FILE).read_bytes().startswith(MAGIC)
    assert (folder / POLICY_FILE).read_bytes().startswith(MAGIC)


@pytest.mark.parametrize("encrypted", [False, True], ids=["old-plaintext", "encrypted"])
@pytest.mark.parametrize("bad", [[1, 2], *(pytest.param(bad, marks=pytest.mark.slow) for bad in (
    {"entries": 5}, {"entries": [[1, 2]]}, {"entries": [[["a"], [1]]]}))])
def test_a_wrong_shape_ngram_cache_is_set_aside_and_the_target_loads(home, target_dir, bad, encrypted):
    engine = _engine(target_dir)
    for p in LEARN_PROMPTS:
        _chat(engine, p)
    folder = engine.state_dir(engine.target.entry.id)
    (folder / NGRAM_FILE).unlink()
    if encrypted:
        save_encrypted(folder / NGRAM_FILE, bad)
    else:
        (folder / NGRAM_LEGACY).write_text(json.dumps(bad))
    stats = engine.draft_policy.summary()

    again = _engine(target_dir)  # before: AttributeError/ValueError at every start
    assert again.target is not None and len(again.bridge.cache) == 0
    assert any("n-gram cache was damaged" in w for w in again.warnings)
    name = NGRAM_FILE if encrypted else NGRAM_LEGACY
    assert list(folder.glob(f"{name}.corrupt*"))
    assert again.draft_policy.summary() == stats  # the rest is kept
    assert _chat(again, LEARN_PROMPTS[0]).token_ids  # and it still replies


def _learned(target_dir: Path) -> tuple[Engine, torch.Tensor, Path]:
    """An engine that served and learned from LEARN_PROMPTS, its drafter's first learned
    weight, and its adapter's folder."""
    engine = _engine(target_dir)
    for p in LEARN_PROMPTS:
        _chat(engine, p)
    _learn(engine)
    return engine, drafter_prediction(engine), engine.adapters.folder(engine.target.entry.id)


def test_non_numeric_adapter_steps_are_set_aside_and_learning_goes_on(home, target_dir):
    _, learned, folder = _learned(target_dir)
    for name in (META_FILE, LEGACY_META_FILE):
        (folder / name).unlink(missing_ok=True)
    # As an older version (or a hand edit) left it; read by every version.
    (folder / LEGACY_META_FILE).write_text(json.dumps({"target_id": "x", "steps": "many", "samples": 3}))

    again = _engine(target_dir)
    assert torch.equal(drafter_prediction(again), learned)  # the weights are kept
    for p in LEARN_PROMPTS:
        _chat(again, p)
    progress = again.idle_step()  # before: ValueError at every learner step
    assert progress is not None and progress.state == "running" and progress.steps == 1
    assert any("counters" in w and "damaged" in w for w in again.warnings)
    assert list(folder.glob(f"{LEGACY_META_FILE}.corrupt*"))


def test_a_crash_between_the_adapter_saves_renames_loses_nothing(home, target_dir):
    engine, learned, folder = _learned(target_dir)
    steps = engine.learner().steps
    folder.rename(folder.with_name(f".{folder.name}.old"))  # as if killed between the renames

    again = _engine(target_dir)  # before: the drafter ran unlearned, the steps restarted
    assert torch.equal(drafter_prediction(again), learned)
    assert again.learner().steps == steps > 0
    assert folder.is_dir() and not folder.with_name(f".{folder.name}.old").exists()


def test_state_under_another_key_is_left_untouched(home, target_dir, tmp_path):
    from keyring.backends.fail import Keyring
    from omnidraft.core.storage.secure_store import KeyStore

    engine = _engine(target_dir)
    _chat(engine, LEARN_PROMPTS[0])
    folder = engine.state_dir(engine.target.entry.id)
    foreign = KeyStore(tmp_path / "another-machine", Keyring())
    engine.bridge.cache.save(folder / NGRAM_FILE, foreign)  # e.g. copied from another machine
    before = (folder / NGRAM_FILE).read_bytes()

    again = _engine(target_dir)
    assert any("key that is not available" in w for w in again.warnings)
    assert len(again.bridge.cache) == 0 and again.draft_policy.stats  # the rest is loaded
    _chat(again, LEARN_PROMPTS[1])  # saves the state after the turn
    assert (folder / NGRAM_FILE).read_bytes() == before  # never overwritten
    assert not list(folder.glob("*.corrupt*"))
