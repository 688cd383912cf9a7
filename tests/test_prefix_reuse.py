"""A conversation's next turn reads only what is new: the target's and the
drafter's caches keep what the previous reply left that the new prompt shares,
and the replies are those of an engine that reads every prompt afresh.

Tiny random models (float32): a lean Qwen2 target with the real Qwen tokenizer,
and a Gemma 3 target on transformers' forward with the real Gemma tokenizer,
drafted for by the tiny SmolLM2-vocabulary drafter conftest sets up."""

from __future__ import annotations

import pytest
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.events import TurnFinished
from omnidraft.core.models import target_runtime

from tests.tiny import tiny_engine, tiny_gemma3, tiny_qwen2

CFG = GenerationConfig(max_new_tokens=12)


@pytest.fixture(scope="module", params=["lean", "transformers"])
def engines(request, tmp_path_factory, qwen_tok, gemma_tok):
    """Two engines on one tiny target: one keeps its caches, one is made to forget."""
    folder = tmp_path_factory.mktemp("models")
    if request.param == "lean":
        model, tokenizer = tiny_qwen2(len(qwen_tok), seed=4), qwen_tok
    else:
        model, tokenizer = tiny_gemma3(len(gemma_tok), seed=4), gemma_tok
    pair = tiny_engine(folder / "a", model, tokenizer), tiny_engine(folder / "b", model, tokenizer)
    assert pair[0].target.runner.kind == request.param
    return pair


def reply(engine, messages, speculative):
    done = [e for e in engine.chat(messages, CFG, speculative=speculative) if isinstance(e, TurnFinished)][-1]
    return done.text


def recorded_sessions(monkeypatch) -> list:
    sessions = []
    init = target_runtime.Session.__init__

    def recording(self, cache):
        init(self, cache)
        sessions.append(self)

    monkeypatch.setattr(target_runtime.Session, "__init__", recording)
    return sessions


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "omnidraft"])
def test_each_turn_reads_only_the_new_messages_and_replies_as_a_fresh_engine(engines, speculative, monkeypatch):
    reusing, fresh = engines
    sessions = recorded_sessions(monkeypatch)
    messages = [{"role": "user", "content": "def add(a, b):"}]
    previous: list[int] = []  # the last turn's prompt
    for turn in range(3):
        fresh.forget_context()
        expected = reply(fresh, messages, speculative)
        assert reply(reusing, messages, speculative) == expected
        read, prompt = sessions[-1], reusing.encode(messages).ids
        if previous:
            # At least the previous prompt came from the cache, and the reply's tokens
            # as far as the chat template re-tokenizes its text the same way (a random
            # model's text often re-tokenizes differently; a real model's mostly not).
            assert len(previous) <= read.reused < len(prompt)
        previous = prompt
        messages += [{"role": "assistant", "content": expected}, {"role": "user", "content": f"and {turn}?"}]
