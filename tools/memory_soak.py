"""The engine worker's memory over a long session: many turns, learning on.

Starts a real engine worker (as the app does) on a fresh data folder, loads a
small target, then serves --turns chat turns: conversations of up to 8 turns
(then a new chat), each reply followed by one step of idle learning (Learn
now, as the idle worker does by itself after its idle delay). The worker's RSS (psutil) is sampled after every
turn. Reported: RSS after warm-up and at the end, the growth per 100 turns
after warm-up (a least-squares slope), the learner's steps, and the series.

    .venv/bin/python -m omnidraft.tools.memory_soak --turns 400 --json soak.json
    .venv/bin/python -m omnidraft.tools.memory_soak --turns 400 --no-learning
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time

import psutil
from omnidraft.core.worker.process import WorkerHandle
from omnidraft.core.worker.protocol import (
    ChatRequest,
    ErrorEvent,
    LearningProgress,
    LearnNow,
    ModelLoaded,
    PauseLearning,
    SwitchTarget,
    TurnDone,
    WorkerReady,
)

from .common import non_negative_int, output_file, positive_float, positive_int, tool_parser

TOPICS = ["a lighthouse", "binary search", "sourdough bread", "the moon landing", "a python decorator",
          "tide pools", "hash tables", "a chess opening", "compound interest", "a haiku about rain"]
ASKS = ["Tell me about {}.", "Explain {} to a beginner.", "Write three sentences on {}.",
        "What is surprising about {}?", "Give an example involving {}."]


class Soak:
    def __init__(self, handle: WorkerHandle):
        self.handle = handle
        self.steps = 0

    def wait(self, match, timeout: float) -> object | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.handle.poll(0.05):
                if isinstance(event, ErrorEvent):
                    print(f"worker: {event.message}", file=sys.stderr)
                if isinstance(event, LearningProgress):
                    self.steps = max(self.steps, event.steps)
                if match(event):
                    return event
        return None

    def chat(self, messages: list[dict], max_new_tokens: int) -> str:
        request = ChatRequest(self.handle.next_id(), messages, max_new_tokens=max_new_tokens)
        self.handle.send(request)
        done = self.wait(lambda e: isinstance(e, TurnDone) and e.request_id == request.request_id, 600)
        if done is None:
            raise SystemExit("no reply within 10 minutes")
        return done.text

    def learn(self, seconds: float) -> None:
        """Learn now, until the learner reports one step (or that it has nothing to do)."""
        self.handle.send(LearnNow(self.handle.next_id()))
        self.wait(lambda e: isinstance(e, LearningProgress) and e.state != "waiting", seconds)


def slope_per_100(turns: list[int], mib: list[float]) -> float:
    n = len(turns)
    mx, my = sum(turns) / n, sum(mib) / n
    var = sum((x - mx) ** 2 for x in turns)
    return 100 * sum((x - mx) * (y - my) for x, y in zip(turns, mib, strict=True)) / var if var else 0.0


def report(args: argparse.Namespace, steps: int, series: list[tuple[int, float]], final: bool = False) -> None:
    after = [(t, m) for t, m in series if t >= args.warmup]
    result = {
        "target": args.target, "turns": len(series), "learning": not args.no_learning,
        "learner_steps": steps, "max_new_tokens": args.max_new_tokens,
        "rss_mib_at_warmup": after[0][1] if after else None, "rss_mib_at_end": series[-1][1],
        "rss_mib_max": max(m for _, m in series),
        "growth_mib_per_100_turns_after_warmup": round(slope_per_100(*zip(*after, strict=True)), 1) if len(after) > 1 else None,
        "series": series,
    }
    if final:
        print(json.dumps({k: v for k, v in result.items() if k != "series"}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = tool_parser(__file__, __doc__)
    parser.add_argument("--target", default="smollm2-135m-instruct", help="catalog id or model path")
    parser.add_argument("--turns", type=positive_int, default=400)
    parser.add_argument("--max-new-tokens", type=positive_int, default=48)
    parser.add_argument("--learn-s", type=positive_float, default=60.0,
                        help="at most this long for a learner step after each reply")
    parser.add_argument("--no-learning", action="store_true")
    parser.add_argument("--warmup", type=non_negative_int, default=50, help="turns before memory should be flat")
    parser.add_argument("--threads", type=positive_int, default=None)
    parser.add_argument("--json", type=output_file, help="write the report here (also while it runs)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="omnidraft-soak-") as home:
        handle = WorkerHandle(home=home, threads=args.threads)
        handle.start()
        soak = Soak(handle)
        try:
            soak.wait(lambda e: isinstance(e, WorkerReady), 300)
            handle.send(PauseLearning(handle.next_id(), args.no_learning))
            handle.send(SwitchTarget(handle.next_id(), args.target))
            if soak.wait(lambda e: isinstance(e, ModelLoaded), 1800) is None:
                raise SystemExit("the target did not load")
            process = psutil.Process(handle.pid)
            series = []
            messages: list[dict] = []
            start = time.monotonic()
            for turn in range(1, args.turns + 1):
                if len(messages) >= 16:  # a new chat after 8 turns
                    messages = []
                ask = rng.choice(ASKS).format(rng.choice(TOPICS)) + f" ({rng.randrange(10**6)})"
                messages.append({"role": "user", "content": ask})
                messages.append({"role": "assistant", "content": soak.chat(messages, args.max_new_tokens)})
                if not args.no_learning:
                    soak.learn(args.learn_s)
                rss = process.memory_info().rss / 2**20
                series.append((turn, round(rss, 1)))
                if turn % 25 == 0:
                    print(f"turn {turn}: RSS {rss:.0f} MiB, learner steps {soak.steps}, "
                          f"{time.monotonic() - start:.0f} s", flush=True)
                    report(args, soak.steps, series)  # so far: a long run stopped early keeps its figures
        finally:
            handle.stop()
    report(args, soak.steps, series, final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
