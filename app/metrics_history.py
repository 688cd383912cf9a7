"""Per-reply and learning metrics, kept across sessions for the charts.

Qt-free so it can be tested and reused by scripts. Only numbers measured by
the engine are stored: a reply's speedup is the engine's (TurnStats.speedup),
recorded once the target's plain step was measured. These are not
the user's text (model ids and figures), so plain JSON is enough.

The file is JSON lines, one record each ({"reply": {...}} or {"learning":
{...}}), saved on the GUI thread: a save appends the records added since the
last one, so it costs what changed (re-saving the whole 5 MiB history at its
caps took 0.5-1 s, a visible freeze after every reply). Past the caps the
file is rewritten, atomically, from the kept records' lines (kept from when
they were written, so nothing is serialised again) once it holds twice what
is kept. A line cut short by a kill ends the file and is dropped; any other
unreadable or wrong-shaped line sets the file aside. The older whole-JSON
file (metrics_history.json) is read once and replaced.
"""

from __future__ import annotations

import csv
import json
import time
from bisect import bisect_right
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

from omnidraft.core.events import TurnStats
from omnidraft.core.storage import paths
from omnidraft.core.storage.persistence import (
    CorruptStateError,
    append_bytes,
    atomic_write_bytes,
    read_json,
)

FILE_NAME = "metrics_history.jsonl"
LEGACY_FILE_NAME = "metrics_history.json"  # versions before the log: one JSON document
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
    served: bool = False  # a reply of the local server (server/), not of the app's chat


@dataclass
class LearningMetric:
    time: float
    model_id: str
    steps: int
    samples: int
    loss: float | None
    acceptance: float | None


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
        self.legacy = self.path.with_name(LEGACY_FILE_NAME)
        self.replies: list[ReplyMetric] = []
        self.learning: list[LearningMetric] = []
        self.load_warning: str | None = None
        # Each kept record's line as in the file, in step with replies/learning.
        self._reply_lines: list[bytes] = []
        self._learning_lines: list[bytes] = []
        self._unsaved: list[bytes] = []  # lines of records added since the last save
        self._file_lines = 0  # lines in the file, as written or read
        self._rewrite = False  # the next save writes the whole file

    # ------------------------------------------------------------ recording

    def add_turn(self, stats: TurnStats, model_id: str, baseline_tokens_per_s: float | None,
                 served: bool = False) -> ReplyMetric:
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
            speedup=stats.speedup,
            served=served,
        )
        self._keep(self.replies, self._reply_lines, metric, MAX_REPLIES, self._line("reply", metric))
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
        self._keep(self.learning, self._learning_lines, metric, MAX_LEARNING, self._line("learning", metric))
        return metric

    def _keep(self, metrics: list, lines: list[bytes], metric, cap: int, line: bytes) -> None:
        metrics.append(metric)
        lines.append(line)
        del metrics[:-cap], lines[:-cap]
        self._unsaved.append(line)

    @staticmethod
    def _line(kind: str, metric) -> bytes:
        return json.dumps({kind: asdict(metric)}, separators=(",", ":")).encode("utf-8") + b"\n"

    def clear(self) -> None:
        self.replies.clear()
        self.learning.clear()
        self._reply_lines.clear()
        self._learning_lines.clear()
        self._unsaved.clear()
        self._rewrite = True

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
            if self.path.exists() or not self.legacy.exists() or self.legacy == self.path:
                self._read()
            else:
                self._read_legacy()
        except CorruptStateError as exc:
            kept = exc.quarantine()
            self.load_warning = f"The chart history was damaged; it was kept as {kept.name}."
            self.clear()
            self._rewrite = False  # nothing to rewrite: new records start a new file

    def _read(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        lines = data.splitlines(keepends=True)
        if lines and not lines[-1].endswith(b"\n"):  # an append cut short by a kill
            lines.pop()
            self._rewrite = True
        for number, (line, record) in enumerate(zip(lines, self._parse(lines), strict=True), 1):
            kind, metric = _metric(record, self.path, number)
            if kind == "reply":
                self._keep(self.replies, self._reply_lines, metric, MAX_REPLIES, line)
            elif kind == "learning":
                self._keep(self.learning, self._learning_lines, metric, MAX_LEARNING, line)
        self._unsaved.clear()
        self._file_lines = len(lines)

    def _parse(self, lines: list[bytes]) -> list:
        try:  # one call for the whole file: a quarter of the time of one per line
            return json.loads(b"[" + b",".join(lines) + b"]")
        except ValueError:
            pass
        for number, line in enumerate(lines, 1):
            try:
                json.loads(line)
            except ValueError as exc:
                raise CorruptStateError(self.path, f"line {number} is not JSON") from exc
        raise CorruptStateError(self.path, "a line holds more than one record")

    def _read_legacy(self) -> None:
        raw = read_json(self.legacy, {})
        if not isinstance(raw, dict):
            raise CorruptStateError(self.legacy, "not a chart history")
        for kind, key in (("reply", "replies"), ("learning", "learning")):
            items = raw.get(key, [])
            if not isinstance(items, list):
                raise CorruptStateError(self.legacy, f"its {key} are not a list")
            for number, item in enumerate(items, 1):
                _, metric = _metric({kind: item}, self.legacy, number)
                metrics, lines, cap = ((self.replies, self._reply_lines, MAX_REPLIES) if kind == "reply"
                                       else (self.learning, self._learning_lines, MAX_LEARNING))
                self._keep(metrics, lines, metric, cap, self._line(kind, metric))
        self._rewrite = True  # the next save writes the log and removes this file

    def save(self) -> None:
        """Append what was added since the last save; rewrite the file when asked
        (cleared, older format, a cut-short line) or once it is half dropped records."""
        kept = len(self._reply_lines) + len(self._learning_lines)
        if self._rewrite or self._file_lines + len(self._unsaved) > 2 * kept + 1000:
            data = b"".join(self._reply_lines + self._learning_lines)
            atomic_write_bytes(self.path, data)
            self._file_lines = kept
            self._rewrite = False
            if self.legacy != self.path:
                self.legacy.unlink(missing_ok=True)
        elif self._unsaved:
            # Not fsynced: a chart point lost to a power cut costs nothing; a kill
            # keeps what was written.
            append_bytes(self.path, b"".join(self._unsaved), sync=False)
            self._file_lines += len(self._unsaved)
        self._unsaved.clear()

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


def _allowed_types(cls) -> dict[str, tuple[type, ...]]:
    """Each field's allowed JSON value types, from its annotation ("float | None")."""
    names = {"float": (int, float), "int": (int,), "str": (str,), "bool": (bool,), "None": (type(None),)}
    return {f.name: tuple(t for part in str(f.type).split(" | ") for t in names[part]) for f in fields(cls)}


_FIELDS = {"reply": (ReplyMetric, _allowed_types(ReplyMetric)),
           "learning": (LearningMetric, _allowed_types(LearningMetric))}


def _metric(record: object, path: Path, number: int) -> tuple[str, ReplyMetric | LearningMetric]:
    """One saved record, its fields checked against the dataclass's types;
    CorruptStateError names the line."""
    if not isinstance(record, dict) or len(record) != 1 or next(iter(record)) not in _FIELDS:
        raise CorruptStateError(path, f"line {number} is not a chart record")
    (kind, values), = record.items()
    cls, allowed = _FIELDS[kind]
    # Fields with a default (added later: `served`) may be missing from older lines.
    required = {f.name for f in fields(cls) if f.default is MISSING}
    if not isinstance(values, dict) or not required <= values.keys() <= allowed.keys():
        raise CorruptStateError(path, f"line {number} does not have a {kind}'s fields")
    if not all(type(values[name]) in allowed[name] for name in values):
        bad = next(name for name in values if type(values[name]) not in allowed[name])
        raise CorruptStateError(path, f"line {number}: {bad} has the wrong type")
    return kind, cls(**values)


def _blank_none(row: dict) -> dict:
    return {k: ("" if v is None else v) for k, v in row.items()}
