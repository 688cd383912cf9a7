"""The engine learns from its own traffic per target, in idle steps, and
learning changes speed, never answers (float32, tiny models)."""

from pathlib import Path

import pytest
import torch
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine, LearnSettings
from omnidraft.core.events import TurnFinished
from omnidraft.core.models.catalog import ModelCatalog

from tests.tiny import drafter_prediction, tiny_gemma3

PROMPTS = ["def add(a, b):\n    return", "The cat sat on the", "for i in range(10):\n    print("]


def tiny_target(folder: Path, gemma_tok) -> Path:
    """A tiny random Gemma-3 target with the real Gemma tokenizer, saved in folder."""
    tiny_gemma3(len(gemma_tok), seed=1).save_pretrained(folder)
    gemma_tok.save_pretrained(folder)
    return folder


@pytest.fixture
def target_dir(tmp_path, gemma_tok):
    return tiny_target(tmp_path / "tiny-gemma", gemma_tok)


def learning_engine(target_dir: Path) -> Engine:
    """An engine serving the tiny target, learning in small, fast batches."""
    engine = Engine(ModelCatalog(), dtype=torch.float32, learn_settings=LearnSettings(batch_size=2, lr=1e-3))
    engine.load_target(str(target_dir), measure_baseline=False)
    return engine


def _engine(home_dir, target_dir):
    return learning_engine(target_dir)


def _reply(engine, prompt, speculative):
    events = engine.complete(prompt, GenerationConfig(max_new_tokens=12), speculative=speculative)
    return next(e for e in events if isinstance(e, TurnFinished))


def test_turns_are_recorded_then_learned_in_idle_steps(home, target_dir):
    engine = _engine(home, target_dir)
    target_id = engine.target.entry.id
    for p in PROMPTS:
        _reply(engine, p, speculative=True)
    assert len(engine.buffer) == len(PROMPTS)
    assert (engine.state_dir(target_id) / "replay.bin").exists()
    before = drafter_prediction(engine)

    progress = []
    while (p := engine.idle_step()) is not None and p.state == "running":
        progress.append(p)
    # One round: nothing learned before to replay.
    assert progress and progress[-1].steps == 2 and progress[-1].samples == 3
    assert progress[-1].loss is not None
    assert len(engine.buffer) == 3 and not engine.buffer.new_samples()  # kept for replay
    assert engine.adapters.has_saved(target_id)
    # The learned adapter now drafts: the lean drafter's weights changed.
    assert not torch.equal(drafter_prediction(engine), before)

    # Learning changes speed, never answers.
    for p in PROMPTS:
        assert _reply(engine, p, True).token_ids == _reply(engine, p, False).token_ids


def test_learned_state_survives_a_restart_and_reset_forgets_it(home, target_dir):
    engine = _engine(home, target_dir)
    target_id = engine.target.entry.id
    for p in PROMPTS:
        _reply(engine, p, speculative=True)
    while (p := engine.idle_step()) is not None and p.state == "running":
        pass
    learned = drafter_prediction(engine)
    cache_entries = dict(engine.bridge.cache.entries)
    sources = engine.draft_policy.summary()
    assert sources  # every speculative step was measured for adaptive drafting
    engine._save_state()

    head = engine.drafter.head.state()
    assert head["labels_seen"] > 0  # the acceptance head learned from the same turns

    again = _engine(home, target_dir)
    assert torch.equal(drafter_prediction(again), learned)
    assert all(torch.equal(a, b) for a, b in zip(again.drafter.head.state().values(), head.values()))
    assert dict(again.bridge.cache.entries) == cache_entries
    assert again.draft_policy.summary() == sources

    again.reset_personalization(target_id)
    assert not again.adapters.has_saved(target_id)
    assert len(again.buffer) == 0 and len(again.bridge.cache) == 0 and not again.draft_policy.stats
    assert not again.state_dir(target_id).exists()
    assert not torch.equal(drafter_prediction(again), learned)
    assert again.drafter.head.labels_seen == 0


def test_a_waiting_request_interrupts_learning(home, target_dir):
    engine = _engine(home, target_dir)
    for p in PROMPTS:
        _reply(engine, p, speculative=True)
    p = engine.idle_step(should_stop=lambda: True)
    assert p.state == "waiting"
    assert len(engine.buffer) == len(PROMPTS)  # nothing consumed


def test_a_request_during_the_drafter_refresh_does_not_wait_for_it(home, target_dir):
    """Merging what was learned into the drafter gives way to a request too; the
    next idle step finishes it."""
    engine = _engine(home, target_dir)
    for p in PROMPTS:
        _reply(engine, p, speculative=True)
    before = drafter_prediction(engine)
    request_at_refresh = lambda: engine.learning.drafter_stale
    while not engine.learning.drafter_stale:
        assert engine.idle_step(should_stop=request_at_refresh).state == "running"
    assert torch.equal(drafter_prediction(engine), before)  # still the old weights
    reply = _reply(engine, PROMPTS[0], speculative=True)  # served meanwhile, with them
    assert reply.stats.new_tokens > 0
    p = engine.idle_step()
    assert p.state == "running" and not engine.learning.drafter_stale
    assert not torch.equal(drafter_prediction(engine), before)


def test_switching_away_and_back_keeps_learning_the_new_turns(home, target_dir, tmp_path, gemma_tok):
    """After A -> B -> A the learner trains on what A serves now (not on the
    buffer it had before the switch) and the vocabulary bridge is reused."""
    other = tmp_path / "tiny-gemma-2"
    tiny_gemma3(len(gemma_tok), seed=5).save_pretrained(other)
    gemma_tok.save_pretrained(other)
    engine = _engine(home, target_dir)
    first_id, first_bridge = engine.target.entry.id, engine.bridge
    _reply(engine, PROMPTS[0], speculative=True)
    while (p := engine.idle_step()) is not None and p.state == "running":
        pass
    assert not engine.buffer.new_samples()
    trained = engine.learner().samples

    engine.load_target(str(other), measure_baseline=False)
    engine.load_target(str(target_dir), measure_baseline=False)
    assert engine.target.entry.id == first_id
    assert engine.bridge.direct is first_bridge.direct  # not rebuilt
    for p in PROMPTS:
        _reply(engine, p, speculative=True)
    assert len(engine.buffer.new_samples()) == len(PROMPTS)
    progress = engine.idle_step()
    assert progress.state == "running" and progress.samples == trained + 2
    assert engine.learner().target_model is engine.target.model


def test_damaged_drafting_statistics_are_set_aside_with_a_message(home, target_dir):
    engine = _engine(home, target_dir)
    path = engine.state_dir(engine.target.entry.id) / "draft_policy.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{broken")
    again = _engine(home, target_dir)
    assert not again.draft_policy.stats
    assert any("learned drafting statistics was damaged" in w for w in again.warnings)
    assert list(path.parent.glob("draft_policy.json.corrupt*"))
    _reply(again, PROMPTS[0], speculative=True)  # decoding still works and measures afresh
    assert again.draft_policy.stats
