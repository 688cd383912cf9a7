"""How fast a new reply starts while the idle-time learner is training.

Starts a real engine worker, serves a few prompts (filling the replay buffer),
lets the learner start (idle delay 1 s), then sends a chat request at varying
moments mid-training and times request -> first streamed text. Also times the
same with the learner idle, for comparison.

Usage: python scripts/learning_latency.py [--target gemma-3-270m] [--trials 5]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

from omnidraft.core.worker.process import WorkerHandle
from omnidraft.core.worker.protocol import (
    ChatRequest,
    ErrorEvent,
    LearningProgress,
    ModelLoaded,
    SwitchTarget,
    TokenBatch,
    TurnDone,
    UpdateSettings,
)

PROMPTS = [
    "Write a Python function that reverses a string.",
    "Explain what a hash table is in two sentences.",
    "List three uses of a binary search tree.",
    "What does the `with` statement do in Python?",
    "Write a function that returns the n-th Fibonacci number.",
    "Describe recursion to a beginner.",
    "How do I read a file line by line in Python?",
    "What is the difference between a list and a tuple?",
]


def wait_for(handle: WorkerHandle, kind, timeout: float = 600.0, request_id=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in handle.poll(0.05):
            if isinstance(event, ErrorEvent):
                raise SystemExit(f"worker error: {event.message}\n{event.detail}")
            if isinstance(event, kind) and (request_id is None or getattr(event, "request_id", None) == request_id):
                return event
    raise SystemExit(f"timed out waiting for {kind.__name__}")


def first_text_latency(handle: WorkerHandle, request_id: int, prompt: str) -> tuple[float, bool]:
    """Seconds from the request to its first streamed text, and whether the
    request interrupted a learner step on the way (a "waiting" progress event)."""
    sent = time.monotonic()
    handle.send(ChatRequest(request_id, [{"role": "user", "content": prompt}], max_new_tokens=8))
    interrupted, latency = False, None
    deadline = sent + 600
    while time.monotonic() < deadline:
        for event in handle.poll(0.01):
            if isinstance(event, ErrorEvent):
                raise SystemExit(f"worker error: {event.message}\n{event.detail}")
            if isinstance(event, LearningProgress) and event.state == "waiting":
                interrupted = True
            if isinstance(event, TokenBatch) and event.request_id == request_id and latency is None:
                latency = time.monotonic() - sent
            if isinstance(event, TurnDone) and event.request_id == request_id:
                return latency if latency is not None else time.monotonic() - sent, interrupted
    raise SystemExit("timed out waiting for the reply")


def _ms(seconds: list[float]) -> str:
    return ", ".join(f"{s * 1000:.0f}" for s in seconds)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="gemma-3-270m")
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    handle = WorkerHandle(home=tempfile.mkdtemp(prefix="omnidraft-latency-"))
    handle.start()
    try:
        handle.send(UpdateSettings(handle.next_id(), {"idle_delay_s": 3600.0}))
        handle.send(SwitchTarget(handle.next_id(), args.target))
        wait_for(handle, ModelLoaded)
        for prompt in PROMPTS:  # fill the replay buffer (learner still waiting)
            rid = handle.next_id()
            handle.send(ChatRequest(rid, [{"role": "user", "content": prompt}], max_new_tokens=48))
            wait_for(handle, TurnDone, request_id=rid)
        idle = [first_text_latency(handle, handle.next_id(), "Say hello.")[0] for _ in range(args.trials)]
        handle.send(UpdateSettings(handle.next_id(), {"idle_delay_s": 1.0}))
        busy = []
        rng = random.Random(0)
        for _ in range(args.trials * 4):
            if len(busy) == args.trials:
                break
            # The learner starts 1 s after the last request; a step over a batch takes
            # seconds, so this lands inside one.
            time.sleep(1.0 + rng.uniform(0.3, 3.0))
            latency, interrupted = first_text_latency(handle, handle.next_id(), "Say hello.")
            if interrupted:
                busy.append(latency)
        print(f"first text, learner idle:              worst {max(idle) * 1000:.0f} ms, "
              f"median {sorted(idle)[len(idle) // 2] * 1000:.0f} ms; all {_ms(idle)}")
        if not busy:
            raise SystemExit("no request landed inside a learner step")
        print(f"first text, request interrupted training: worst {max(busy) * 1000:.0f} ms, "
              f"median {sorted(busy)[len(busy) // 2] * 1000:.0f} ms ({len(busy)} trials); all {_ms(busy)}")
    finally:
        handle.stop()


if __name__ == "__main__":
    main()
