"""Adaptive drafting (docs/method.md §3), per target: which draft source pays off.

A step can take its proposals from prompt lookup (free: the context's last n
tokens occurred before, propose what followed) or from the drafter (costs its
forward passes). Which one yields more tokens per second depends on the target
and on what the drafter has learned for it. While serving the 144 training
prompts to Gemma-3-270M (the adapt run in docs/learning.md, "draft_sources"):
a lookup on a 2-token match gained 1.8 target tokens per step (21 tokens/s),
on a 4-token match 3.9 (44/s), a drafter step 2.3 (16/s): for Gemma a free
lookup pays off at every match length, even where most of its tokens are
rejected. For a target where drafter steps gain more per second than
short-match lookups, the policy stops taking those lookups.

DraftPolicy keeps, for this target, decayed sums of (target tokens gained,
seconds) per source: the drafter, and lookup by match length. A lookup is
used when its measured tokens per second are at least the drafter's, or while
either has too few steps to tell (the prior: lookup, it is free). One eligible
step in EXPLORE_EVERY still takes the lookup, so its figure stays current as
the drafter changes. The decay lets the drafter's figure follow its learning.
Saved per target with the n-gram cache, encrypted like it: only numbers, but
which sources pay off says something about what the user writes.

DraftPrices decides how far the drafter drafts. Drafting one more token costs a
drafter forward and one more verification row; it is worth its chance of being
accepted times what a token costs at the current speed. So the drafter goes on
while Π P_i · P_next ≥ (forward + row) / (seconds per token), with P_next
estimated by the last token's P: a cheap drafter or a costly target token
drafts further, a slow drafter stops early. All three prices are this
machine's, for this target, measured as the engine runs (decayed means, not
saved: they are re-measured within a reply); until they are, the drafter's
fixed rules apply.

ChanceCalibration corrects the chances the stop rules use (the acceptance
head's, or the drafter's confidence) as the engine runs: one bias on their
logit, moved after each verification toward what was accepted (online Platt
scaling). A head trained on the learner's records is overconfident when serving
(on the Zen 3 adapt run it predicted 0.848 where 0.712 was accepted), so priced
drafting drafted further than paid; the bias takes it back to the observed rate
within a few replies, and follows the head as it changes. Measured, never saved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ..storage.persistence import CorruptStateError
from ..storage.secure_store import KeyStore, load_or_migrate, save_encrypted

DRAFTER = "drafter"
MIN_STEPS = 20.0  # decayed steps a source needs before its figure is trusted
DECAY = 0.995  # per recorded step of the same source: ~200 steps of memory
EXPLORE_EVERY = 16


def lookup_source(match: int) -> str:
    return f"lookup{match}"


@dataclass
class SourceStats:
    steps: float = 0.0
    tokens: float = 0.0  # target tokens the steps gained (accepted + the target's own)
    seconds: float = 0.0  # drafting + verification time of those steps

    def add(self, tokens: int, seconds: float) -> None:
        self.steps = self.steps * DECAY + 1
        self.tokens = self.tokens * DECAY + tokens
        self.seconds = self.seconds * DECAY + seconds

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


PRICE_DECAY = 0.97  # per measurement: prices follow the machine within ~30 steps
MIN_PRICE_WEIGHT = 3.0  # decayed measurements a price needs


@dataclass
class _Mean:
    weight: float = 0.0
    total: float = 0.0
    count: float = 0.0  # what total is per (forwards, tokens): a mean of total / count

    def add(self, total: float, count: float = 1.0) -> None:
        self.weight = self.weight * PRICE_DECAY + 1
        self.total = self.total * PRICE_DECAY + total
        self.count = self.count * PRICE_DECAY + count

    @property
    def value(self) -> float | None:
        return self.total / self.count if self.weight >= MIN_PRICE_WEIGHT and self.count > 0 else None


@dataclass
class DraftPrices:
    """Seconds a drafter forward, a verification row and a target token cost here
    (see the module docstring)."""

    forward: _Mean = field(default_factory=_Mean)
    token: _Mean = field(default_factory=_Mean)
    verify: dict[int, _Mean] = field(default_factory=dict)  # seconds of a verification, by rows

    def record_draft(self, forwards: int, seconds: float) -> None:
        if forwards:
            self.forward.add(seconds, forwards)

    def record_step(self, rows: int, verify_seconds: float, step_seconds: float, tokens: int) -> None:
        self.verify.setdefault(rows, _Mean()).add(verify_seconds)
        self.token.add(step_seconds, tokens)

    def row(self) -> float | None:
        """A verification row's marginal seconds: the slope of the line through the
        measured verification times by rows (None until two row counts are known)."""
        known = [(rows, m.weight, m.value) for rows, m in self.verify.items() if m.value is not None]
        if len(known) < 2:
            return None
        weight = sum(w for _, w, _ in known)
        mean_r = sum(w * r for r, w, _ in known) / weight
        mean_t = sum(w * t for _, w, t in known) / weight
        spread = sum(w * (r - mean_r) ** 2 for r, w, _ in known)
        return max(0.0, sum(w * (r - mean_r) * (t - mean_t) for r, w, t in known) / spread)

    def threshold(self) -> float | None:
        """Draft one more token while Π P_i · P_next is at least this (None: not
        measured yet)."""
        forward, token, row = self.forward.value, self.token.value, self.row()
        if forward is None or token is None or row is None or token <= 0:
            return None
        return (forward + row) / token


CALIBRATION_RATE = 0.03  # bias step per judged proposal: settles within ~300 of them (~5 replies)
MAX_BIAS = 4.0  # logit units: the head may be far off, never arbitrarily
_EPS = 1e-6


def calibrated(p: float, bias: float) -> float:
    """p with bias added to its logit."""
    if bias == 0.0:
        return p
    p = min(max(p, _EPS), 1 - _EPS)
    return 1.0 / (1.0 + math.exp(-(math.log(p / (1 - p)) + bias)))


@dataclass
class ChanceCalibration:
    """The stop rules' chances, corrected online (module docstring)."""

    bias: float = 0.0
    judged: int = 0  # proposals it has learned from

    def record(self, chances: list[float], accepted: int) -> None:
        """One drafter step's target proposals, with the (calibrated) chances the
        drafter used, of which the first `accepted` were accepted. A proposal after
        the first rejection was never judged and teaches nothing. Each is a step of
        logistic regression on the bias (exact for a one-token proposal; for an
        n-gram merge its chance is the product of its pieces' and the step follows
        that product)."""
        for i, chance in enumerate(chances[: accepted + 1]):
            self.bias += CALIBRATION_RATE * ((1.0 if i < accepted else 0.0) - chance)
            self.judged += 1
        self.bias = min(MAX_BIAS, max(-MAX_BIAS, self.bias))


@dataclass
class DraftPolicy:
    stats: dict[str, SourceStats] = field(default_factory=dict)
    _eligible: int = 0  # lookup-eligible steps seen (for exploration)
    prices: DraftPrices = field(default_factory=DraftPrices)  # measured, never saved
    calibration: ChanceCalibration = field(default_factory=ChanceCalibration)  # measured, never saved

    def use_lookup(self, match: int) -> bool:
        """Whether to propose a lookup continuation found on a match of this length."""
        self._eligible += 1
        lookup = self.stats.get(lookup_source(match))
        drafter = self.stats.get(DRAFTER)
        if lookup is None or drafter is None or min(lookup.steps, drafter.steps) < MIN_STEPS:
            return True
        if self._eligible % EXPLORE_EVERY == 0:
            return True
        return lookup.rate >= drafter.rate

    def record(self, source: str, tokens: int, seconds: float) -> None:
        self.stats.setdefault(source, SourceStats()).add(tokens, seconds)

    def summary(self) -> dict[str, dict[str, float]]:
        return {name: {"steps": round(s.steps, 1), "tokens_per_step": round(s.tokens / s.steps, 2),
                       "tokens_per_s": round(s.rate, 2)}
                for name, s in sorted(self.stats.items()) if s.steps}

    # ------------------------------------------------------------ persistence
    def save(self, path: Path, keys: KeyStore | None = None) -> None:
        save_encrypted(path, {"stats": {k: vars(v) for k, v in self.stats.items()}}, keys)

    @classmethod
    def load(cls, path: Path, keys: KeyStore | None = None, legacy: Path | None = None) -> DraftPolicy:
        """The saved policy (empty when none); CorruptStateError when unreadable.
        `legacy`: where an older version kept it as plaintext JSON (migrated once)."""
        return load_or_migrate(path, legacy or path, cls._from_raw, keys)

    @classmethod
    def _from_raw(cls, raw: object, path: Path) -> DraftPolicy:
        if raw is None:
            return cls()
        stats = raw.get("stats") if isinstance(raw, dict) else None
        if not isinstance(stats, dict):
            raise CorruptStateError(path, "it does not hold draft statistics")
        policy = cls()
        for name, values in stats.items():
            try:
                s = SourceStats(**{k: float(values[k]) for k in ("steps", "tokens", "seconds")})
            except (KeyError, TypeError, ValueError) as exc:
                raise CorruptStateError(path, f"bad statistics for {name!r}") from exc
            if not all(math.isfinite(v) and v >= 0 for v in (s.steps, s.tokens, s.seconds)):
                raise CorruptStateError(path, f"negative or infinite statistics for {name!r}")
            policy.stats[str(name)] = s
        return policy
