"""The target's plain decoding speed on this machine: what each reply's speedup
is reported against (TurnStats.plain_seconds, core/events.py).

Measured when a target loads, folded with the steps of every plain reply, and
timed again in idle time after a drafted reply, so it follows this machine's
speed now (other programs, heat, a conversation's length).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..events import TokenChunk
from ..stopping import ShouldStop, never
from .sampling import GenerationConfig

if TYPE_CHECKING:
    from ..events import TurnStats

BASELINE_PROMPT = "Here is a short story about a lighthouse keeper and the sea.\n\n"
BASELINE_TOKENS = 24
BASELINE_RUNS = 2
PLAIN_PROBE_STEPS = 8  # plain steps timed in idle time after a drafted reply (~0.2 s)


class SpeedBaseline:
    """The current target's plain step time here, and whether it is due a new timing."""

    def __init__(self) -> None:
        # Seconds a token of the target's plain decoding past the prompt read, measured
        # here; None until measured.
        self.step_seconds: float | None = None
        # Set by a drafted reply: refresh() times plain steps again in idle time.
        self.due = False

    @property
    def tokens_per_s(self) -> float | None:
        """The target's plain decoding speed here past the prompt read (tokens/s)."""
        return 1.0 / self.step_seconds if self.step_seconds else None

    def measure(self, complete: Callable[..., Iterator], forget_context: Callable[[], None],
                should_stop: ShouldStop = never) -> None:
        """Time plain decoding steps of BASELINE_PROMPT's completion (`complete`, the
        engine's, reading the prompt afresh after forget_context())."""
        # Untimed first: a freshly loaded model's first forwards fault its weights in
        # from the mapped file (a 1.5B model measured 1.07 tokens/s cold against 3.5
        # warm). Under 8 tokens, account() leaves this turn out of the baseline.
        for _ in complete(BASELINE_PROMPT, GenerationConfig(max_new_tokens=4), should_stop):
            pass
        # A step's median in each run, the faster run's: right after a load a whole run
        # can read ~40% slow (measured on the EPYC: 36.5 ms a step, then 24-25).
        steps = []
        for _ in range(BASELINE_RUNS):
            forget_context()
            stamps = [time.perf_counter() for event in complete(
                BASELINE_PROMPT, GenerationConfig(max_new_tokens=BASELINE_TOKENS), should_stop)
                if isinstance(event, TokenChunk)]
            if len(stamps) >= 4:
                steps.append(statistics.median(b - a for a, b in itertools.pairwise(stamps)))
        if steps:
            self.step_seconds = min(steps)

    def refresh(self, cache, window: Callable[[], int], should_stop: ShouldStop = never) -> None:
        """Time a few plain steps where the last reply left the target's KV `cache`
        (None: no target), then put the cache back: the next turn still reads only
        what is new. `window()`: the most tokens the target reads. Between steps it
        gives way to should_stop()."""
        self.due = False
        if cache is None or not cache.length or cache.length + PLAIN_PROBE_STEPS > window():
            return
        start, token, steps = cache.length, cache.ids[-1], []
        try:
            for _ in range(PLAIN_PROBE_STEPS):
                if should_stop():
                    break
                t0 = time.perf_counter()
                token = int(cache.forward([token], 1)[0][-1].argmax())  # as a plain step picks
                steps.append(time.perf_counter() - t0)
        finally:
            cache.rollback(start)
        if len(steps) >= PLAIN_PROBE_STEPS // 2:
            self._fold(statistics.median(steps), 0.5)

    def account(self, stats: TurnStats) -> None:
        """A finished reply: a plain one's steps are a new timing; every reply gets
        the seconds plain decoding would have taken (stats.plain_seconds)."""
        if stats.method == "target" and stats.new_tokens >= 8:
            self._fold((stats.seconds - stats.first_token_seconds) / (stats.new_tokens - 1), 0.3)
        if stats.method == "target":
            stats.plain_seconds = stats.seconds
        elif self.step_seconds is not None and stats.new_tokens:
            # Plain decoding reads the same prompt (the same part of it, with the same
            # cache) and then takes a step a token: only what follows the first token differs.
            stats.plain_seconds = stats.first_token_seconds + (stats.new_tokens - 1) * self.step_seconds

    def _fold(self, step: float, weight: float) -> None:
        """A new timing of the plain step, given `weight` beside what was measured before."""
        old = self.step_seconds
        self.step_seconds = step if old is None else (1 - weight) * old + weight * step
