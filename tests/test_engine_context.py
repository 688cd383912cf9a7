"""A long conversation never breaks chat: the target reads the latest turns that
fit its context, the drafter reads the same turns (and never overflows its own
context), and a refused over-long message in the history is left out.

Tiny random models (float32): a cross-vocabulary target (Gemma's tokenizer)
drafted for by the tiny SmolLM2-vocabulary drafter conftest sets up."""

from __future__ import annotations

import pytest
from omnidraft.core.decoding.drafter import Drafter, DraftSettings
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine, InputError
from omnidraft.core.events import TurnFinished
from omnidraft.core.models.chat_format import encode_chat
from omnidraft.core.models.context import MAX_MESSAGE_CHARS

from tests.tiny import tiny_engine, tiny_gemma3

SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in one line."}


@pytest.fixture(scope="module")
def engine(tmp_path_factory, gemma_tok) -> Engine:
    folder = tmp_path_factory.mktemp("models") / "tiny-gemma-context"
    engine = tiny_engine(folder, tiny_gemma3(len(gemma_tok), seed=3), gemma_tok)
    # Every step asks the drafter (a prompt lookup could otherwise spare it the prompt).
    engine.spec_options.prompt_lookup = False
    assert engine.drafter is not None and not engine.bridge.same_vocab
    return engine


def conversation(turns: int, words: int = 150, system: bool = False, last: str = "hi") -> list[dict]:
    """`turns` long question/answer pairs, then the new message."""
    messages = [dict(SYSTEM)] if system else []
    for i in range(turns):
        question = f"Question {i}: " + " ".join(f"item{i}x{j}" for j in range(words))
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": f"Answer {i}."}]
    return messages + [{"role": "user", "content": last}]


def drafter_reads(engine: Engine, monkeypatch) -> list[list[int]]:
    """Records every prefix the drafter starts reading."""
    seen: list[list[int]] = []
    drafter = engine.drafter
    start = drafter.start

    def recording(prefix_ids: list[int]) -> None:
        seen.append(list(prefix_ids))
        start(prefix_ids)

    monkeypatch.setattr(drafter, "start", recording)
    return seen


def finish(events) -> TurnFinished:
    return [e for e in events if isinstance(e, TurnFinished)][-1]


def reply(engine: Engine, messages: list[dict], max_new_tokens: int = 16, speculative: bool = True) -> TurnFinished:
    return finish(engine.chat(messages, GenerationConfig(max_new_tokens=max_new_tokens), speculative=speculative))


def small_drafter(engine: Engine, monkeypatch, max_len: int, **settings) -> Drafter:
    """The engine's drafter with a small context, so overflowing it is cheap."""
    drafter = Drafter(engine.drafter_model, DraftSettings(**settings), max_len=max_len)
    monkeypatch.setattr(engine, "drafter", drafter)
    return drafter


# ---------------------------------------------------------------- trimming


def test_the_drafter_reads_the_same_trimmed_messages_as_the_target(engine, monkeypatch):
    messages = conversation(turns=8)
    assert len(encode_chat(engine.target.tokenizer, messages, engine.target.entry.chat_format)) > engine.context_limit()
    encoded = engine.encode(messages)
    assert 0 < encoded.omitted < len(messages) - 1
    assert encoded.messages == messages[encoded.omitted:]

    seen = drafter_reads(engine, monkeypatch)
    done = reply(engine, messages)
    assert done.stats.method == "omnidraft" and done.stats.new_tokens == 16
    assert done.omitted_messages == encoded.omitted
    assert seen[0] == encode_chat(engine.drafter_model.tokenizer, encoded.messages, "template")


def test_the_system_message_is_kept_when_old_turns_are_dropped(engine, monkeypatch):
    messages = conversation(turns=8, system=True)
    encoded = engine.encode(messages)
    tok, chat_format = engine.target.tokenizer, engine.target.entry.chat_format
    kept = len(messages) - 1 - encoded.omitted
    assert encoded.omitted > 0 and encoded.omitted % 2 == 0  # whole question/answer turns
    assert encoded.messages == [messages[0]] + messages[-kept:]
    assert encoded.ids == encode_chat(tok, encoded.messages, chat_format)
    assert len(encoded.ids) <= engine.context_limit()
    # As much as fits is kept: one more turn would not fit.
    one_more = [messages[0]] + messages[-kept - 2:]
    assert len(encode_chat(tok, one_more, chat_format)) > engine.context_limit()

    seen = drafter_reads(engine, monkeypatch)
    reply(engine, messages)
    assert seen[0] == encode_chat(engine.drafter_model.tokenizer, encoded.messages, "template")


def test_the_context_length_setting_is_bounded_by_the_models(engine):
    from omnidraft.core.storage.settings import Settings

    window = engine.context_window()
    messages = conversation(turns=2, words=80)
    assert window == 2048 and engine.encode(messages).omitted == 0  # all fits the model's
    try:
        engine.apply_settings(Settings(context_tokens=1024))
        assert engine.context_limit() == 1024 - 512
        shorter = engine.encode(messages)
        assert shorter.omitted > 0 and len(shorter.ids) <= 512
        engine.apply_settings(Settings(context_tokens=100_000))  # more than the model reads
        assert engine.context_limit() == window - 512
    finally:
        engine.apply_settings(Settings())
    assert engine.context_limit() == window - 512


def test_choosing_gamma_in_settings_makes_the_drafter_stop_by_it(engine):
    """Settings' γ rule replaces priced drafting (which would otherwise decide once
    this machine's costs are measured); the default goes back to priced."""
    from omnidraft.core.storage.settings import Settings

    try:
        engine.apply_settings(Settings(adaptive_gamma=0.3))
        assert engine.drafter.settings is engine.draft_settings and not engine.draft_settings.priced
        # A price every chance covers would draft on; γ stops once the risk passes 0.3.
        assert engine.drafter._stop(0.9, 0.6, price=0.0)
        assert not engine.drafter._stop(0.9, 0.8, price=0.0)
    finally:
        engine.apply_settings(Settings())
    assert engine.draft_settings.priced and engine.draft_settings.gamma is None
    assert not engine.drafter._stop(0.9, 0.6, price=0.0)


@pytest.mark.parametrize("refused", [
    "x " * (MAX_MESSAGE_CHARS // 2 + 1),  # refused for its length in characters
    " ".join(f"w{j}" for j in range(4000)),  # beyond the model's context on its own
])
def test_a_refused_over_long_message_in_the_history_does_not_break_the_next_turn(engine, refused):
    with pytest.raises(InputError, match="too long"):
        engine.encode([{"role": "user", "content": refused}])
    history = [
        {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there."},
        {"role": "user", "content": refused},
    ]
    for _ in range(2):  # and the turn after that
        done = reply(engine, [*history, {"role": "user", "content": "hi"}])
        assert done.reason == "length" and done.stats.method == "omnidraft"
        assert done.omitted_messages == 3  # up to the refused message; the turns after it are kept
        history += [{"role": "user", "content": "hi"}, {"role": "assistant", "content": done.text}]


def test_the_last_message_too_long_is_still_refused(engine):
    too_many_chars = "x" * (MAX_MESSAGE_CHARS + 1)
    with pytest.raises(InputError, match=r"too long \(200,001 characters"):
        engine.encode(conversation(turns=1, last=too_many_chars))
    too_many_tokens = " ".join(f"w{j}" for j in range(4000))
    with pytest.raises(InputError, match=f"reads at most {engine.context_limit():,}"):
        engine.encode(conversation(turns=1, system=True, last=too_many_tokens))


# ---------------------------------------------------------------- the drafter's context


def test_a_conversation_longer_than_the_drafters_context_still_drafts(engine, monkeypatch):
    drafter = small_drafter(engine, monkeypatch, max_len=128)
    messages = conversation(turns=2, words=60)
    full = encode_chat(engine.drafter_model.tokenizer, messages, "template")
    assert len(full) > drafter.max_len  # though the target reads it all:
    assert len(encode_chat(engine.target.tokenizer, messages, engine.target.entry.chat_format)) <= engine.context_limit()
    seen = drafter_reads(engine, monkeypatch)
    done = reply(engine, messages, max_new_tokens=24)
    assert done.stats.method == "omnidraft" and done.stats.new_tokens == 24
    # It read the context's first token and the most recent part that fits.
    assert seen[0][0] == full[0] and seen[0][1:] == full[len(full) - len(seen[0]) + 1:]
    assert len(seen[0]) <= drafter.max_len
    assert done.token_ids == reply(engine, messages, max_new_tokens=24, speculative=False).token_ids


def test_a_reply_that_fills_the_drafters_context_goes_on_without_drafts(engine, monkeypatch):
    small_drafter(engine, monkeypatch, max_len=48, min_confidence=0.0)
    messages = conversation(turns=1, words=30)
    done = reply(engine, messages, max_new_tokens=80)
    assert done.stats.method == "omnidraft" and done.stats.new_tokens == 80
    assert done.token_ids == reply(engine, messages, max_new_tokens=80, speculative=False).token_ids


def test_drafting_stops_at_a_full_context_instead_of_failing(engine):
    drafter = Drafter(engine.drafter_model, DraftSettings(k=4, min_confidence=0.0), max_len=16)
    cfg = GenerationConfig()
    drafter.start(list(range(1000, 1014)))  # two positions left
    assert 1 <= len(drafter.draft(cfg, None).ids) <= 3
    drafter.sync_text("a reply longer than the room the context has left")
    assert drafter.draft(cfg, None).ids == []
    drafter.start(list(range(1000, 1008)))  # the next turn drafts again
    assert len(drafter.draft(cfg, None).ids) == 4
