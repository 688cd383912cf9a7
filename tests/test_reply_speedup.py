"""The speedup the app shows for a reply: what plain decoding would have taken
for it here (its own prompt read, then the target's measured plain step for
each later token) over what it took. The plain step is measured when a target
loads, without its prompt read and robust to a slow run; it follows the plain
replies the person asks for, and is timed again in idle time after a drafted
reply, where that reply left the target's cache, which is then put back.

Tiny random models (float32): cross-vocabulary targets (Gemma's and Qwen2's
tokenizers; transformers' cache and the lean runtime's) drafted for by the tiny
SmolLM2-vocabulary drafter conftest sets up."""

from __future__ import annotations

import types

import pytest
from omnidraft.app.message_widget import describe_stats
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.decoding.speed_baseline import BASELINE_TOKENS
from omnidraft.core.engine import Engine
from omnidraft.core.events import TokenChunk, TurnFinished, TurnStats
from omnidraft.core.models.catalog import ModelCatalog

from tests.tiny import tiny_engine, tiny_gemma3, tiny_qwen2


@pytest.fixture(scope="module")
def engine(tmp_path_factory, gemma_tok) -> Engine:
    folder = tmp_path_factory.mktemp("models") / "tiny-gemma-speedup"
    engine = tiny_engine(folder, tiny_gemma3(len(gemma_tok), seed=5), gemma_tok)
    engine.measure_baseline()
    return engine


def turn(engine: Engine, messages: list[dict], speculative: bool = True, tokens: int = 16) -> TurnFinished:
    events = engine.chat(messages, GenerationConfig(max_new_tokens=tokens), speculative=speculative)
    return [e for e in events if isinstance(e, TurnFinished)][-1]


def reply(engine: Engine, text: str, speculative: bool, tokens: int = 16) -> TurnStats:
    return turn(engine, [{"role": "user", "content": text}], speculative, tokens).stats


def test_a_drafted_replys_plain_time_is_its_own_prompt_read_then_plain_steps(engine):
    step = engine.plain_step_seconds
    assert step and engine.baseline_tokens_per_s == pytest.approx(1 / step)
    long_prompt = " ".join(f"word{i}" for i in range(300))
    for text in ("hi", long_prompt):  # a longer prompt read counts in both alike
        engine.forget_context()
        stats = reply(engine, text, speculative=True)
        assert stats.method == "omnidraft" and stats.new_tokens > 1
        expected = stats.first_token_seconds + (stats.new_tokens - 1) * step
        assert stats.plain_seconds == pytest.approx(expected)
        assert stats.speedup == pytest.approx(expected / stats.seconds)
        assert stats.as_dict()["speedup"] == stats.speedup
        line = describe_stats(stats.as_dict(), engine.baseline_tokens_per_s)
        assert f"{stats.speedup:.2f}x plain speed" in line


def test_a_plain_reply_is_plain_speed_and_refines_the_step(engine):
    before = engine.plain_step_seconds
    engine.forget_context()
    stats = reply(engine, "Tell me a story.", speculative=False, tokens=12)
    assert stats.method == "target" and stats.new_tokens >= 8
    assert stats.speedup == 1.0
    own = (stats.seconds - stats.first_token_seconds) / (stats.new_tokens - 1)
    assert engine.plain_step_seconds == pytest.approx(0.7 * before + 0.3 * own)
    # A plain reply's line claims no speedup.
    assert "plain speed" not in describe_stats(stats.as_dict(), engine.baseline_tokens_per_s)


def test_the_plain_step_leaves_out_the_prompt_read_and_a_slow_run(monkeypatch):
    """Right after a load a whole run can read slow; the prompt read is no step.
    The steps take time on a clock of the test's own: exact figures, no sleeping."""
    from omnidraft.core.decoding import speed_baseline

    engine = Engine(ModelCatalog())
    runs = []
    clock = [0.0]
    monkeypatch.setattr(speed_baseline, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def complete(prompt, cfg, should_stop=None, speculative=False):
        runs.append(cfg.max_new_tokens)
        if cfg.max_new_tokens < BASELINE_TOKENS:
            return  # the untimed warm-up
        slow = len(runs) == 2  # the first timed run
        clock[0] += 0.3  # the prompt read
        for _ in range(cfg.max_new_tokens):
            clock[0] += 0.03 if slow else 0.004
            yield TokenChunk("x")
        yield TurnFinished("x" * cfg.max_new_tokens, "length", TurnStats("target"))

    monkeypatch.setattr(engine, "complete", complete)
    assert engine.measure_baseline() == pytest.approx(1 / engine.plain_step_seconds)
    assert len(runs) == 3
    assert engine.plain_step_seconds == pytest.approx(0.004)


def test_replies_saved_before_the_estimate_keep_their_figure():
    old = {"method": "omnidraft", "new_tokens": 64, "tokens_per_s": 30.0, "seconds": 64 / 30}
    assert "1.50x plain speed" in describe_stats(old, 20.0)
    assert "plain speed" not in describe_stats(old, None)
    # One saved while the plain step was not measured yet: no figure.
    assert "plain speed" not in describe_stats({**old, "plain_seconds": 0.0, "speedup": None}, 20.0)


@pytest.mark.parametrize("runtime", ["transformers", "lean"])
def test_plain_steps_timed_after_a_reply_leave_the_conversation_as_it_was(tmp_path, gemma_tok, qwen_tok, runtime):
    if runtime == "lean":
        engine = tiny_engine(tmp_path / "qwen", tiny_qwen2(len(qwen_tok), seed=2), qwen_tok)
    else:
        engine = tiny_engine(tmp_path / "gemma", tiny_gemma3(len(gemma_tok), seed=2), gemma_tok)
    assert engine.target.runner.kind == runtime
    engine.plain_step_seconds = 1.0  # far from any tiny model's step: the timing must move it
    ask = [{"role": "user", "content": "Tell me about the sea."}]
    first = turn(engine, ask)
    assert engine.plain_step_due  # a drafted reply: time plain steps again when idle
    cache = engine.target.runner.cache
    held = list(cache.ids)
    engine.refresh_plain_step()
    assert not engine.plain_step_due and cache.ids == held
    # Half the old figure, half the new median: a tiny model's step, far under the old 1 s.
    assert 0.5 < engine.plain_step_seconds < 0.75
    more = ask + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And rivers?"}]
    after_timing = turn(engine, more)
    engine.forget_context()
    turn(engine, ask)
    assert turn(engine, more).text == after_timing.text  # what the next turn reused was intact


def test_timing_plain_steps_gives_way_and_needs_a_reply_to_continue(engine):
    engine.forget_context()
    before = engine.plain_step_seconds
    engine.plain_step_due = True
    engine.refresh_plain_step()  # an empty cache: nothing to continue from
    assert not engine.plain_step_due and engine.plain_step_seconds == before
    reply(engine, "hi", speculative=True)
    held = list(engine.target.runner.cache.ids)
    engine.refresh_plain_step(should_stop=lambda: True)  # a request waits: no step taken
    assert engine.plain_step_seconds == before and engine.target.runner.cache.ids == held
