"""Plain (target-only) decoding with a KV cache, as a generator of events.

Also home of what both plain and speculative decoding share: ReplyStream turns
token ids into streamed text (it holds back an incomplete UTF-8 character and
any tail that could be the start of a stop string, and decides when to stop),
and Turn is the prologue and epilogue around either loop (stats, sampling
generator, clock, the finishing event).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from ..events import TokenChunk, TurnFinished, TurnStats
from ..models.target_runtime import TargetRunner
from ..stopping import ShouldStop, never
from .sampling import GenerationConfig, pick


class ReplyStream:
    """Accumulates reply token ids; yields the newly final text and the stop reason."""

    def __init__(self, tokenizer, cfg: GenerationConfig, stop_ids: set[int]):
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.stop_ids = stop_ids
        self.ids: list[int] = []
        self.text = ""  # text already emitted
        self.reason: str | None = None

    def push(self, new_ids: list[int], drafted: int = 0) -> list[TokenChunk]:
        """Append ids (the first `drafted` of them came from accepted drafts)."""
        chunks: list[TokenChunk] = []
        for i, tok in enumerate(new_ids):
            if tok in self.stop_ids:
                self.reason = "eos"
                break
            self.ids.append(tok)
            if len(self.ids) >= self.cfg.max_new_tokens:
                self.reason = "length"
            chunk = self._emit(i < drafted, final=self.reason is not None)
            if chunk:
                chunks.append(chunk)
            if self.reason:
                break
        if self.reason == "eos":
            chunk = self._emit(False, final=True)
            if chunk:
                chunks.append(chunk)
        return _merge(chunks)

    def _emit(self, drafted: bool, final: bool) -> TokenChunk | None:
        full = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        for s in self.cfg.stop_strings:
            at = full.find(s)
            if s and at >= 0:
                full, final, self.reason = full[:at], True, "stop"
        if not final:
            # Hold back a partial UTF-8 character and a possible stop-string prefix.
            if full.endswith("\ufffd"):
                return None
            hold = max((_overlap(full, s) for s in self.cfg.stop_strings), default=0)
            full = full[: len(full) - hold]
        if not full.startswith(self.text) or len(full) <= len(self.text):
            return None
        new, self.text = full[len(self.text) :], full
        return TokenChunk(new, drafted)


def _overlap(text: str, stop: str) -> int:
    """Length of the longest tail of text that is a proper prefix of stop."""
    for n in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0


def _merge(chunks: list[TokenChunk]) -> list[TokenChunk]:
    out: list[TokenChunk] = []
    for c in chunks:
        if out and out[-1].drafted == c.drafted:
            out[-1] = TokenChunk(out[-1].text + c.text, c.drafted)
        else:
            out.append(c)
    return out


class Turn:
    """One reply's bookkeeping, the same around every decode loop: its stats, the
    stream of its text, the sampling generator (seeded once per reply), its clock,
    and the TurnFinished that ends it."""

    def __init__(self, method: str, tokenizer, prompt_ids: list[int], cfg: GenerationConfig, stop_ids: set[int]):
        self.stats = TurnStats(method=method, prompt_tokens=len(prompt_ids))
        self.stream = ReplyStream(tokenizer, cfg, stop_ids)
        self.gen = cfg.generator()
        self.start = time.perf_counter()

    def push(self, new_ids: list[int], drafted: int = 0) -> list[TokenChunk]:
        """ReplyStream.push, timing the first token."""
        if not self.stream.ids and not self.stats.first_token_seconds:
            self.stats.first_token_seconds = time.perf_counter() - self.start
        return self.stream.push(new_ids, drafted)

    def finished(self) -> TurnFinished:
        stream = self.stream
        self.stats.new_tokens = len(stream.ids)
        self.stats.seconds = time.perf_counter() - self.start
        return TurnFinished(stream.text, stream.reason or "cancelled", self.stats, list(stream.ids))


def generate_plain(
    target: TargetRunner,
    tokenizer,
    prompt_ids: list[int],
    cfg: GenerationConfig,
    stop_ids: set[int],
    should_stop: ShouldStop = never,
) -> Iterator[TokenChunk | TurnFinished]:
    turn = Turn("target", tokenizer, prompt_ids, cfg, stop_ids)
    session = target.session()
    logits = session.forward(prompt_ids, last=1)[-1]
    history = list(prompt_ids) if cfg.penalized else []  # what the repetition penalty reads
    while not should_stop():
        tok = pick(logits, cfg, turn.gen, history)
        yield from turn.push([tok])
        if turn.stream.reason:
            break
        if cfg.penalized:
            history.append(tok)
        logits = session.forward([tok])[-1]
        turn.stats.steps += 1
    yield turn.finished()
