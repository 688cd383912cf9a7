"""Per-reply and learning metrics, kept across sessions for the charts.

Qt-free so it can be tested and reused by scripts. Only numbers measured by
the engine are stored: a speedup is recorded only when the reply's speed and
the target's measured plain-decoding baseline are both known. These are not
the user's text, so plain JSON (written atomically) is enough.
"""

from __future__ import annotations

import csv
import time
from bisect import bisect_right
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from omnidraft.core.events import TurnStats
from omnidraft.core.storage import paths
from omnidraft.core.storage.persistence import CorruptStateError, atomic_write_json, read_json

FILE_NAME = "metrics_history.json"
MAX_REPLIES = 5000
MAX_LEARNING = 20000
ROLLING_WINDOW = 10


@dataclass
class ReplyMetric:
    time: float
    model_id: str
    method: str
    new_tokens: int
    seconds: float
    tokens_per_s: float
    acceptance_rate: float | None
    tokens_per_step: float | None
    proposed: int
    accepted: int
    baseline_tokens_per_s: float | None
    speedup: float | None


@dataclass
class LearningMetric:
    time: float
    model_id: str
    steps: int
    samples: int
    loss: float | None
    acceptance: float | None


def _speedup(tokens_per_s: float | None, baseline: float | None) -> float | None:
    if not tokens_per_s or not baseline or baseline <= 0:
        return None
    return tokens_per_s / baseline


def rolling_mean(values: list[float], window: int = ROLLING_WINDOW) -> list[float]:
    """Mean of the last `window` values at every position (shorter at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def first_and_last(values: list[float], window: int = ROLLING_WINDOW) -> tuple[float, float, int] | None:
    """(mean of the first values, mean of the last, how many each): `window` each,
    or half of them each when there are fewer than 2 * window; None under 2.
    What "it got faster since I started" compares."""
    if len(values) < 2:
        return None
    n = min(window, len(values) // 2)
    return sum(values[:n]) / n, sum(values[-n:]) / n, n


def learner_marks(replies: list[ReplyMetric], learning: list[LearningMetric]) -> list[tuple[float, int]]:
    """Where the learner trained, on the replies' axis (reply i at x = i, from 1):
    one mark per gap between replies in which it took steps, at x = n + 0.5 after
    the n-th reply, with the learner's step count by then."""
    times = [r.time for r in replies]  # appended as they finished: in order
    marks: dict[int, int] = {}
    for m in learning:
        n = bisect_right(times, m.time)
        marks[n] = max(marks.get(n, 0), m.steps)
    return [(n + 0.5, steps) for n, steps in sorted(marks.items())]


class MetricsHistory:
    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path else paths.data_dir() / FILE_NAME
        self.replies: list[ReplyMetric] = []
        self.learning: list[LearningMetric] = []
        self.load_warning: str | None = None

    # ------------------------------------------------------------ recording

    def add_turn(self, stats: TurnStats, model_id: str, baseline_tokens_per_s: float | None) -> ReplyMetric:
        tps = stats.tokens_per_s
        metric = ReplyMetric(
            time=time.time(),
            model_id=model_id,
            method=stats.method,
            new_tokens=stats.new_tokens,
            seconds=stats.seconds,
            tokens_per_s=tps,
            acceptance_rate=stats.acceptance_rate,
            tokens_per_step=stats.tokens_per_step,
            proposed=stats.proposed,
            accepted=stats.accepted,
            baseline_tokens_per_s=baseline_tokens_per_s,
            speedup=_speedup(tps, baseline_tokens_per_s),
        )
        self.replies.append(metric)
        del self.replies[:-MAX_REPLIES]
        return metric

    def add_learning(
        self, model_id: str, steps: int, samples: int, loss: float | None, acceptance: float | None
    ) -> LearningMetric | None:
        """Record one learning point; repeated reports of the same step are ignored."""
        for m in reversed(self.learning):
            if m.model_id == model_id:
                if m.steps == steps and m.loss == loss and m.acceptance == acceptance:
                    return None
                break
        metric = LearningMetric(time.time(), model_id, steps, samples, loss, acceptance)
        self.learning.append(metric)
        del self.learning[:-MAX_LEARNING]
        return metric

    def clear(self) -> None:
        self.replies.clear()
        self.learning.clear()

    # ------------------------------------------------------------ queries

    def model_ids(self) -> list[str]:
        seen: dict[str, None] = {}
        for m in [*self.replies, *self.learning]:
            seen.setdefault(m.model_id, None)
        return list(seen)

    def replies_for(self, model_id: str | None) -> list[ReplyMetric]:
        return [r for r in self.replies if model_id is None or r.model_id == model_id]

    def drafted_for(self, model_id: str | None) -> list[ReplyMetric]:
        """The replies the drafter took part in (what learning can speed up)."""
        return [r for r in self.replies_for(model_id) if r.method == "omnidraft"]

    def learning_for(self, model_id: str | None) -> list[LearningMetric]:
        return [m for m in self.learning if model_id is None or m.model_id == model_id]

    # ------------------------------------------------------------ persistence

    def load(self) -> None:
        try:
            raw = read_json(self.path, {})
            self.replies = [ReplyMetric(**r) for r in raw.get("replies", [])]
            self.learning = [LearningMetric(**m) for m in raw.get("learning", [])]
        except CorruptStateError as exc:
            kept = exc.quarantine()
            self.load_warning = f"The chart history was damaged; it was kept as {kept.name}."
            self.clear()
        except (TypeError, AttributeError) as exc:
            # A file from a different version: start a fresh history, but say so.
            self.load_warning = f"The chart history could not be read ({exc}); starting afresh."
            self.clear()

    def save(self) -> None:
        atomic_write_json(
            self.path,
            {
                "version": 1,
                "replies": [asdict(r) for r in self.replies],
                "learning": [asdict(m) for m in self.learning],
            },
        )

    def export_csv(self, path: Path) -> None:
        """One table: a `kind` column tells reply rows from learning rows."""
        columns = ["kind"]
        for cls in (ReplyMetric, LearningMetric):
            columns += [f.name for f in fields(cls) if f.name not in columns]
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns, restval="")
            writer.writeheader()
            for r in self.replies:
                writer.writerow({"kind": "reply", **_blank_none(asdict(r))})
            for m in self.learning:
                writer.writerow({"kind": "learning", **_blank_none(asdict(m))})


def _blank_none(row: dict) -> dict:
    return {k: ("" if v is None else v) for k, v in row.items()}
