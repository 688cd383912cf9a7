"""`omnidraft-bench --stream FILE`: one person's stream of chats, scored prequentially.

Each turn (a user message; a follow-up carries its conversation's earlier turns
and replies, as the app sends them) is decoded three ways, interleaved in one
run on the one loaded target:

  plain    the target's plain decoding: the reference for speed and, under
           greedy, for the reply itself
  learner  omnidraft as the app runs it: the turn is recorded, the n-gram cache
           and the drafting policy learn from it, and after the reply the learner
           gets the idle budget (--idle-s) through the engine's own idle path
           (Engine.refresh_plain_step when due, then Engine.idle_step until the
           learner rests or the budget ends, a request then "arriving": the step
           gives way at its next layer boundary, as the worker's loop does)
  twin     a frozen twin: the same drafter, acceptance head, n-gram cache and
           drafting policy as the learner had at the start, its own copies; its
           n-gram cache and drafting policy learn from its own replies as the
           learner's do, but its adapter and head never train

The twin shares the engine (one target, one drafter model in memory): for its
turns its own lean drafter (the shipped weights and the adapter the run started
with), head, n-gram cache and drafting policy are swapped into the engine, with
recording and saving off. The learner decodes each turn before it learns from
it. The order of the three rotates turn by turn so drift of the machine hits
all alike, and before each decode the target's cache keeps only what the app's
would hold when the turn arrives: what it shares with the previous turn and its
reply.

`--then FILE[:N]` (repeatable) goes on with another stream's first N turns (or
all of them), the same learner and twin carried over: `--stream A --turns 200
--then B:50 --then A:50` is A, then B, then A's first 50 turns again.

`--oracle PASSES` measures the stream's ceiling for learning: before scoring,
the learner records every turn's reply (plain decoding's own, under greedy) and
trains PASSES passes over them, its n-gram cache and drafting policy left as
they were; it is then scored frozen (no idle budget) against the untrained twin.
Its gain over the twin is what a drafter that has seen the answers gets from
its adapter and acceptance head, more than any learning from the stream can.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from omnidraft.core.decoding.drafter import Drafter
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine
from omnidraft.core.events import TurnFinished, TurnStats
from omnidraft.core.learning.replay_buffer import Sample

from .runners import BenchError, count_forwards, swapped

WHO = ("plain", "twin", "learner")
DELAY_TARGET_MS = 300  # learning may hold up the next reply at most this long (docs/learning.md)
WINDOW = 10  # turns in a rolling mean (the chart, a segment's adaptation)


@dataclass
class Segment:
    path: Path
    turns: int | None  # None: all of the file's turns (from `first` on)
    first: int = 0  # the 0-based index of the segment's first turn in its file

    @property
    def name(self) -> str:
        return self.path.stem


def segment_arg(text: str) -> Segment:
    """argparse type of --then: FILE or FILE:N."""
    path, sep, count = text.rpartition(":")
    if sep and count.isdigit():
        if int(count) < 1:
            raise argparse.ArgumentTypeError(f"{text}: the number of turns must be at least 1")
        return Segment(Path(path), int(count))
    return Segment(Path(text), None)


def turns_arg(text: str) -> tuple[int, int | None]:
    """argparse type of --turns: N (the first N turns) or A-B (turns A to B, from 1):
    (index of the first turn, number of turns)."""
    first, sep, last = text.partition("-")
    try:
        a, b = (int(first), int(last)) if sep else (1, int(first))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: give N (the first N turns) or A-B (turns A to B)") from None
    if a < 1 or b < a:
        raise argparse.ArgumentTypeError(f"{text}: turns count from 1, and A-B needs A <= B")
    return a - 1, b - a + 1


def read_stream(segment: Segment) -> list[dict]:
    """A stream's turns: JSONL lines {"prompt", optional "id" and "conversation"}.
    A segment starting mid-conversation starts that conversation afresh."""
    from .cli import read_prompts  # the same reading and messages as --prompts

    path = segment.path
    end = None if segment.turns is None else segment.first + segment.turns
    rows = []
    for n, row in enumerate(read_prompts(path, end), 1):
        if not row["prompt"].strip():
            raise BenchError(f'{path}: turn {n} has an empty "prompt"')
        rows.append({"id": str(row.get("id", f"{path.stem}-{n}")),
                     "conversation": row.get("conversation"), "prompt": row["prompt"]})
    if len(rows) <= segment.first:
        raise BenchError(f"{path} has {len(rows)} turns: none from turn {segment.first + 1} on")
    return rows[segment.first:]


def with_history(rows: list[dict], reply: Callable[[dict, list[dict]], str]) -> None:
    """Each turn's messages as the app sends them: a follow-up carries its
    conversation's earlier turns and replies. reply(row, messages) decodes the
    turn and returns the reply's text."""
    history: list[dict] = []
    conversation = None
    for row in rows:
        if row["conversation"] is None or row["conversation"] != conversation:
            history = []
        conversation = row["conversation"]
        messages = [*history, {"role": "user", "content": row["prompt"]}]
        history = [*messages, {"role": "assistant", "content": reply(row, messages)}]


@dataclass
class Twin:
    """The frozen twin's own drafting state, swapped into the engine for its turns."""

    drafter: Drafter
    cache: object  # its NgramCache
    policy: object  # its DraftPolicy

    @classmethod
    def of(cls, engine: Engine) -> Twin:
        """The engine's drafting state as it stands now, copied (a drafter net of
        its own: the learner's is refreshed in place as it learns)."""
        learner = engine.drafter
        drafter = Drafter(engine.drafter_model, engine.draft_settings, max_len=learner.max_len)
        drafter.head = copy.deepcopy(learner.head)
        target_id = engine.target.entry.id
        if engine.adapters.has_saved(target_id) or engine.adapters.is_loaded(target_id):
            drafter.load_adapter(engine.adapters.low_rank_state(target_id))
        return cls(drafter, copy.deepcopy(engine.bridge.cache), copy.deepcopy(engine.draft_policy))

    @contextmanager
    def in_engine(self, engine: Engine) -> Iterator[None]:
        """The engine drafts as the twin for the block: nothing recorded, nothing saved."""
        with swapped(engine, drafter=self.drafter, draft_policy=self.policy, buffer=None), \
                swapped(engine.bridge, cache=self.cache):
            engine.target_state.save = _no_save  # the learner's saved state stays the learner's
            try:
                yield
            finally:
                del engine.target_state.save


def _no_save(*_args, **_kwargs) -> None:
    pass


@dataclass
class Decoded:
    ids: list[int]
    seconds: float
    forwards: int
    stats: TurnStats


@dataclass
class StreamRun:
    """The learner, its frozen twin and plain decoding over one or more streams."""

    engine: Engine
    max_new_tokens: int = 64
    temperature: float = 0.0
    seed: int = 0
    idle_s: float = 20.0
    twin: Twin | None = None
    records: list[dict] = field(default_factory=list)
    _previous: list[int] | None = None  # the target ids of the previous turn and its reply
    after_turn: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        if self.engine.drafter is None or self.engine.bridge is None:
            why = "; ".join(self.engine.warnings) or "no drafter loaded"
            raise BenchError(f"--stream needs drafting, and the engine decodes plainly ({why})")
        if not self.engine.learn_settings.enabled:
            raise BenchError("--stream needs learning on")
        self.twin = Twin.of(self.engine)

    def run(self, segment: int, rows: list[dict]) -> None:
        def scored(row: dict, messages: list[dict]) -> str:
            record = self.turn(len(self.records), segment, row, messages)
            if self.after_turn is not None:
                self.after_turn()
            return record["reply"]

        with_history(rows, scored)

    def study(self, streams: list[list[dict]], passes: int) -> dict:
        """The oracle (module doc): record every turn's reply, then train `passes`
        passes over them, each turn once a pass. The n-gram cache and drafting
        policy decode the turns as copies, so they learn nothing here."""
        engine = self.engine
        start = time.perf_counter()
        cfg = GenerationConfig(max_new_tokens=self.max_new_tokens, temperature=self.temperature, seed=self.seed)

        def recorded(_row: dict, messages: list[dict]) -> str:
            engine.target.runner.cache.reset()
            ids = self._decode(messages, cfg, True).ids  # recorded as the app records a turn
            return engine.target.tokenizer.decode(ids, skip_special_tokens=True)

        with swapped(engine, draft_policy=copy.deepcopy(engine.draft_policy)), \
                swapped(engine.bridge, cache=copy.deepcopy(engine.bridge.cache)):
            for rows in streams:
                with_history(rows, recorded)
        samples = engine.buffer.samples()
        decoded = time.perf_counter() - start
        learner = engine.learner()
        reviews, learner.reviews = learner.reviews, 0  # a pass is each turn once; its turns then leave
        threads = engine.learn_settings.threads
        engine.learning.set_threads(os.cpu_count() or 1)  # nothing else runs yet: every core learns
        try:
            for p in range(passes):
                for s in samples if p else ():
                    engine.buffer.add(Sample(**{**s.__dict__, "seq": -1}))
                while (status := engine.idle_step()) is not None and status.state == "running":
                    pass
                print(f"oracle: pass {p + 1}/{passes} over {len(samples)} turns, "
                      f"{time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        finally:
            learner.reviews = reviews
            engine.learning.set_threads(threads)
        engine.target.runner.cache.reset()
        return {"passes": passes, "turns": len(samples), "decode_seconds": decoded,
                "learn_seconds": time.perf_counter() - start - decoded, "learner_steps": learner.steps}

    def turn(self, index: int, segment: int, row: dict, messages: list[dict]) -> dict:
        engine = self.engine
        cfg = GenerationConfig(max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                               seed=self.seed + index)
        out: dict[str, Decoded] = {}
        for who in WHO[index % 3:] + WHO[: index % 3]:
            self._rewind()
            if who == "twin":
                with self.twin.in_engine(engine):
                    out[who] = self._decode(messages, cfg, True)
            else:
                out[who] = self._decode(messages, cfg, who == "learner")
        learn = self._idle()
        self._previous = engine.encode(messages).ids + out["learner"].ids
        plain = out["plain"]
        greedy = self.temperature <= 0
        record = {
            "index": index, "segment": segment, "id": row["id"], "conversation": row["conversation"],
            "messages": len(messages), "prompt_tokens": out["learner"].stats.prompt_tokens,
            "plain": {"seconds": plain.seconds, "new_tokens": len(plain.ids),
                      "first_token_s": plain.stats.first_token_seconds},
            **{who: self._figures(out[who], plain, greedy) for who in ("learner", "twin")},
            "learn": learn,
            "reply": engine.target.tokenizer.decode(out["learner"].ids, skip_special_tokens=True),
        }
        self.records.append(record)
        lr, tw = record["learner"], record["twin"]
        print(f"turn {index + 1} ({row['id']}): plain {plain.seconds:.2f} s, learner {_fmt(lr['speedup'])}x "
              f"own {_fmt(lr['own_acceptance'], '.2f')}, twin {_fmt(tw['speedup'])}x own "
              f"{_fmt(tw['own_acceptance'], '.2f')}; learned {learn['seconds']:.1f} s, {learn['steps']} steps, "
              f"delay {learn['delay_ms']:.0f} ms", file=sys.stderr, flush=True)
        return record

    def _rewind(self) -> None:
        """The target's cache as the app's holds it when this turn arrives: what it
        shares with the previous turn and its reply (each decode here leaves the
        turn's own reply in it)."""
        cache = self.engine.target.runner.cache
        if self._previous is None:
            cache.reset()
        else:
            cache.reuse(self._previous, compute=0)

    def _decode(self, messages: list[dict], cfg: GenerationConfig, speculative: bool) -> Decoded:
        engine = self.engine
        with count_forwards(engine.target.model) as calls:
            start = time.perf_counter()
            done = [e for e in engine.chat(messages, cfg, speculative=speculative) if isinstance(e, TurnFinished)]
            seconds = time.perf_counter() - start
        stats = done[-1].stats
        if speculative and stats.method != "omnidraft":
            raise BenchError("the engine decoded plainly where it should have drafted")
        return Decoded(list(done[-1].token_ids), seconds, calls[0], stats)

    def _idle(self) -> dict:
        """The idle budget after a reply, spent as the worker spends it: the plain
        step's timing when due, then learner steps until the learner rests or the
        next request arrives (the budget's end), which the step gives way to."""
        engine = self.engine
        start = time.perf_counter()
        deadline = start + self.idle_s

        def next_request() -> bool:
            return time.perf_counter() >= deadline

        if engine.plain_step_due:
            engine.refresh_plain_step(should_stop=next_request)
        steps = 0
        progress = None
        while not next_request():
            progress = engine.idle_step(should_stop=next_request)
            if progress is None or progress.state != "running":
                break
            steps += 1
        end = time.perf_counter()
        return {"seconds": end - start, "steps": steps,
                "state": progress.state if progress is not None else "idle",
                "learner_steps": progress.steps if progress is not None else None,
                "samples": progress.samples if progress is not None else None,
                "loss": progress.loss if progress is not None else None,
                # How long learning held up the next reply: from the request's arrival
                # to the engine being free (0 when the learner had rested before).
                "delay_ms": max(0.0, end - deadline) * 1000}

    @staticmethod
    def _figures(mine: Decoded, plain: Decoded, greedy: bool) -> dict:
        s = mine.stats
        own_proposed = s.proposed - s.lookup_proposed
        return {
            "seconds": mine.seconds,
            "new_tokens": len(mine.ids),
            "forwards": mine.forwards,
            "tokens_per_step": len(mine.ids) / mine.forwards if mine.forwards else None,
            "speedup": plain.seconds / mine.seconds if mine.seconds > 0 else None,
            # The engine's own figure for the reply, against its SpeedBaseline.
            "speedup_baseline": s.speedup,
            "proposed": s.proposed, "accepted": s.accepted,
            "own_proposed": own_proposed, "own_accepted": s.accepted - s.lookup_accepted,
            "own_acceptance": (s.accepted - s.lookup_accepted) / own_proposed if own_proposed else None,
            # Where a step's time goes: a learned adapter and head may draft further
            # and cost more a step than they gain in acceptance.
            "draft_seconds": s.draft_seconds, "drafter_prompt_seconds": s.drafter_prompt_seconds,
            "verify_seconds": s.verify_seconds, "first_token_seconds": s.first_token_seconds,
            "identical": mine.ids == plain.ids if greedy else None,
        }


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


# ---------------------------------------------------------------- figures


def _share(top: float, bottom: float) -> float | None:
    return top / bottom if bottom else None


def totals(records: list[dict], who: str) -> dict:
    """Over some turns: the drafter's own acceptance (token-weighted), target
    tokens a step, and the speedup over plain decoding (their seconds summed)."""
    mine = [r[who] for r in records]
    return {
        "turns": len(records),
        "own_acceptance": _share(sum(m["own_accepted"] for m in mine), sum(m["own_proposed"] for m in mine)),
        "tokens_per_step": _share(sum(m["new_tokens"] for m in mine), sum(m["forwards"] for m in mine)),
        "speedup": _share(sum(r["plain"]["seconds"] for r in records), sum(m["seconds"] for m in mine)),
    }


def thirds(records: list[dict]) -> tuple[list[dict], list[dict]]:
    n = max(1, len(records) // 3)
    return records[:n], records[-n:]


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def segment_figures(records: list[dict]) -> dict:
    first, last = thirds(records)
    fig = {who: {"first_third": totals(first, who), "last_third": totals(last, who), "all": totals(records, who)}
           for who in ("learner", "twin")}
    lr, tw = fig["learner"], fig["twin"]
    return {
        "turns": len(records),
        "speedup_ratio_first_third": _share(lr["first_third"]["speedup"] or 0, tw["first_third"]["speedup"] or 0),
        "speedup_ratio_last_third": _share(lr["last_third"]["speedup"] or 0, tw["last_third"]["speedup"] or 0),
        "speedup_ratio_all": _share(lr["all"]["speedup"] or 0, tw["all"]["speedup"] or 0),
        "own_acceptance_first_third": lr["first_third"]["own_acceptance"],
        "own_acceptance_last_third": lr["last_third"]["own_acceptance"],
        "own_acceptance_delta": _minus(lr["last_third"]["own_acceptance"], lr["first_third"]["own_acceptance"]),
        "twin_own_acceptance_first_third": tw["first_third"]["own_acceptance"],
        "twin_own_acceptance_last_third": tw["last_third"]["own_acceptance"],
        "twin_own_acceptance_delta": _minus(tw["last_third"]["own_acceptance"], tw["first_third"]["own_acceptance"]),
        # The learner's own acceptance above the twin's on the same turns.
        "gain_over_twin_first_third": _minus(lr["first_third"]["own_acceptance"], tw["first_third"]["own_acceptance"]),
        "gain_over_twin_last_third": _minus(lr["last_third"]["own_acceptance"], tw["last_third"]["own_acceptance"]),
        "learner": lr,
        "twin": fig["twin"],
    }


def gain_curve(records: list[dict], window: int = WINDOW) -> list[float | None]:
    """The learner's own acceptance above the twin's over the last `window` turns, turn by turn."""
    out = []
    for i in range(len(records)):
        part = records[max(0, i - window + 1): i + 1]
        out.append(_minus(totals(part, "learner")["own_acceptance"], totals(part, "twin")["own_acceptance"]))
    return out


def adaptation(records: list[dict]) -> dict:
    """How fast the learner pulled ahead of the twin in a segment: its gain over
    the first `WINDOW` turns, and the first turn by which the rolling gain reached
    half its last third's."""
    final = segment_figures(records)["gain_over_twin_last_third"]
    curve = gain_curve(records)
    half = None
    if final is not None and final > 0:
        half = next((i + 1 for i, g in enumerate(curve) if g is not None and g >= final / 2), None)
    head = records[:WINDOW]
    return {"gain_first_turns": _minus(totals(head, "learner")["own_acceptance"], totals(head, "twin")["own_acceptance"]),
            "first_turns": len(head), "gain_last_third": final, "turns_to_half_gain": half}


def returning(earlier: list[dict], now: list[dict]) -> dict:
    """A stream met again after others: the learner's gain over the twin on its
    turns now, on the same turns when first met, and at the end of that earlier
    segment; kept_share = now / the earlier segment's last third."""
    ids = {r["id"] for r in now}
    same = [r for r in earlier if r["id"] in ids]
    first_now, _ = thirds(now)
    _, end = thirds(earlier)

    def gain(rs: list[dict]) -> float | None:
        return _minus(totals(rs, "learner")["own_acceptance"], totals(rs, "twin")["own_acceptance"]) if rs else None

    now_gain, end_gain = gain(first_now), gain(end)
    return {"gain_on_return_first_third": now_gain, "gain_on_return": gain(now),
            "gain_same_turns_first_met": gain(same), "gain_end_of_earlier": end_gain,
            "kept_share": now_gain / end_gain if now_gain is not None and end_gain else None}


def stream_report(records: list[dict], segments: list[Segment], idle_s: float, oracle: dict | None = None) -> dict:
    by_segment = [[r for r in records if r["segment"] == s] for s in range(len(segments))]
    parts = []
    for s, (segment, rs) in enumerate(zip(segments, by_segment)):
        part = {"file": str(segment.path), "name": segment.name, "first_turn": rs[0]["index"] if rs else None,
                **segment_figures(rs)}
        if s > 0:
            part["adaptation"] = adaptation(rs)
        before = [i for i in range(s) if segments[i].path.resolve() == segment.path.resolve()]
        if before:
            part["returning"] = {"earlier_segment": before[-1], **returning(by_segment[before[-1]], rs)}
        parts.append(part)
    delays = [r["learn"]["delay_ms"] for r in records]
    greedy = records[0]["learner"]["identical"] is not None if records else False

    def same(who: str) -> int | None:
        return sum(bool(r[who]["identical"]) for r in records) if greedy else None

    first = parts[0]
    return {
        "file": str(segments[0].path),
        "first_turn_in_file": segments[0].first + 1,
        "idle_s": idle_s,
        "oracle": oracle,
        "turns": len(records),
        "first_segment_turns": first["turns"],
        # The headline figures: the first stream's segment.
        **{k: v for k, v in first.items() if k not in ("file", "name", "first_turn", "turns")},
        "greedy_identical": {"learner": same("learner"), "twin": same("twin"), "turns": len(records)},
        "learn_delay_ms_max": max(delays, default=None),
        "learn_delays_over_target": sum(d > DELAY_TARGET_MS for d in delays),
        "learn_seconds": sum(r["learn"]["seconds"] for r in records),
        "learner_steps": sum(r["learn"]["steps"] for r in records),
        "segments": parts,
        "curves": {
            "learner_own_acceptance": [r["learner"]["own_acceptance"] for r in records],
            "twin_own_acceptance": [r["twin"]["own_acceptance"] for r in records],
            "learner_speedup": [r["learner"]["speedup"] for r in records],
            "twin_speedup": [r["twin"]["speedup"] for r in records],
            "learner_tokens_per_step": [r["learner"]["tokens_per_step"] for r in records],
            "twin_tokens_per_step": [r["twin"]["tokens_per_step"] for r in records],
            "learner_speedup_baseline": [r["learner"]["speedup_baseline"] for r in records],
            "learn_delay_ms": delays,
            "segment": [r["segment"] for r in records],
        },
    }


def format_stream(stream: dict) -> str:
    lines = [(f"stream {stream['file']}: {stream['turns']} turns from turn {stream['first_turn_in_file']}, "
              f"idle budget {stream['idle_s']:g} s a turn"),
             (f"{'segment':<24} {'turns':>5} {'own acc first->last (learner)':>30} {'(twin)':>14} "
              f"{'speedup last third learner/twin':>32} {'ratio':>6}")]
    for part in stream["segments"]:
        lr, tw = part["learner"]["last_third"], part["twin"]["last_third"]
        lines.append(
            f"{part['name'][:24]:<24} {part['turns']:>5} "
            f"{_fmt(part['own_acceptance_first_third'], '.3f') + ' -> ' + _fmt(part['own_acceptance_last_third'], '.3f'):>30} "
            f"{_fmt(part['twin_own_acceptance_first_third'], '.3f') + '->' + _fmt(part['twin_own_acceptance_last_third'], '.3f'):>14} "
            f"{_fmt(lr['speedup']) + 'x / ' + _fmt(tw['speedup']) + 'x':>32} {_fmt(part['speedup_ratio_last_third'], '.3f'):>6}")
    same = stream["greedy_identical"]
    if same["learner"] is not None:
        lines.append(f"replies identical to plain decoding: learner {same['learner']}/{same['turns']}, "
                     f"twin {same['twin']}/{same['turns']}")
    if (oracle := stream["oracle"]) is not None:
        lines.append(f"oracle: {oracle['passes']} passes over the {oracle['turns']} turns' replies before scoring "
                     f"({oracle['learn_seconds']:.0f} s); speedup over the twin on all turns "
                     f"{_fmt(stream['speedup_ratio_all'], '.3f')}")
    lines.append(f"learning: {stream['learner_steps']} steps, {stream['learn_seconds']:.1f} s; longest delay of a "
                 f"reply {_fmt(stream['learn_delay_ms_max'], '.0f')} ms ({stream['learn_delays_over_target']} over "
                 f"{DELAY_TARGET_MS} ms)")
    return "\n".join(lines)


# ---------------------------------------------------------------- the chart


def write_chart(stream: dict, path: Path) -> None:
    """The curves as a PNG: the drafter's own acceptance and the speedup over plain
    decoding, learner against twin, each the rolling mean of WINDOW turns, with a
    line where a segment starts (pyqtgraph, offscreen)."""
    import os

    import pyqtgraph as pg
    import pyqtgraph.exporters
    from omnidraft.app.charts import CountAxis
    from omnidraft.app.metrics_history import rolling_mean

    if pg.QtWidgets.QApplication.instance() is None:
        os.environ["QT_QPA_PLATFORM"] = "offscreen"  # drawn into a file: no window, no display needed
    app = pg.mkQApp()
    pg.setConfigOptions(antialias=True, background="w", foreground="k")
    view = pg.GraphicsLayoutWidget()
    view.resize(1000, 720)
    curves = stream["curves"]
    turns = list(range(1, stream["turns"] + 1))
    starts = [p["first_turn"] for p in stream["segments"][1:] if p["first_turn"] is not None]
    panels = (("The drafter's own acceptance", "own_acceptance"), ("Speedup over plain decoding", "speedup"),
              ("Target tokens a step", "tokens_per_step"))
    for row, (title, key) in enumerate(panels):
        plot = view.addPlot(row=row, col=0, title=title, axisItems={"bottom": CountAxis("bottom")})
        plot.addLegend(offset=(10, 5))
        plot.showGrid(y=True, alpha=0.3)
        for who, colour in (("twin", "#1f77b4"), ("learner", "#d62728")):  # the learner's on top
            values = curves[f"{who}_{key}"]
            xs = [x for x, v in zip(turns, values) if v is not None]
            ys = [v for v in values if v is not None]
            if not ys:
                continue
            plot.plot(xs, ys, pen=None, symbol="o", symbolSize=3, symbolBrush=colour, symbolPen=None)
            plot.plot(xs, rolling_mean(ys, WINDOW), pen=pg.mkPen(colour, width=2),
                      name=f"{who} (mean of {WINDOW} turns)")
        for start in starts:
            plot.addLine(x=start + 0.5, pen=pg.mkPen("#888", width=1, style=pg.QtCore.Qt.PenStyle.DashLine))
        if row == len(panels) - 1:
            plot.setLabel("bottom", "turn")
    view.show()  # laid out at its size (offscreen: no window appears)
    app.processEvents()
    path.parent.mkdir(parents=True, exist_ok=True)
    exporter = pyqtgraph.exporters.ImageExporter(view.scene())
    exporter.parameters()["width"] = 1600
    exporter.export(str(path))
    view.close()


# ---------------------------------------------------------------- the command


def measure_stream(args: argparse.Namespace, engine: Engine) -> dict:
    """The whole --stream run: every segment's turns, then the report. With --json
    the report so far is rewritten after every turn (`complete` false until the
    last), so a run cut off after an hour keeps what it measured."""
    from .report import load_average, machine_info

    segments = [args.stream_segment, *args.then]
    streams = [read_stream(s) for s in segments]  # every file checked before any decoding
    load_before = load_average()
    start = time.perf_counter()
    engine.evaluating = True  # the warm-ups teach nothing
    run = StreamRun(engine, args.max_new_tokens, args.temperature, args.seed, args.idle_s)
    warm = [{"role": "user", "content": "Say hello."}]
    cfg = GenerationConfig(max_new_tokens=4)
    for speculative in (False, True):
        run._decode(warm, cfg, speculative)
    with run.twin.in_engine(engine):
        run._decode(warm, cfg, True)
    engine.evaluating = False
    oracle = run.study(streams, args.oracle) if args.oracle else None
    if oracle is not None:
        run.idle_s = 0.0  # scored frozen: it learned the answers beforehand

    def report(complete: bool) -> dict:
        return {
            "mode": "stream",
            "complete": complete,
            "target": engine.target.entry.name,
            "target_id": engine.target.entry.id,
            "drafter": engine.drafter_model.entry.name,
            "drafter_runtime": engine.drafter_description,
            "dtype": args.dtype,
            "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature,
            "seed": args.seed,
            "chat": True,
            "stream": stream_report(run.records, segments, run.idle_s, oracle),
            "turns": run.records,
            "state_dir": str(args.state_dir) if args.state_dir else None,
            "wall_seconds": time.perf_counter() - start,
            "command": shlex.join(["omnidraft-bench", *args.argv]),
            "machine": machine_info(load_before),
        }

    if args.json:
        run.after_turn = lambda: _write_partial(args.json, report(complete=False))
    for s, rows in enumerate(streams):
        run.run(s, rows)
    return report(complete=True)


def _write_partial(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    part.replace(path)  # a reader never sees half a file
