"""How long saving holds up a reply (the engine's replay buffer) and the window
(the charts' history), measured at their caps.

The replay buffer is saved by the engine after each reply, before the reply is
reported finished; the charts' history on the GUI thread after each reply or
learner step. Both are filled to their caps with realistic sizes (replay
samples of --prompt-tokens target tokens and as many drafter tokens, plus a
--reply-tokens reply), each save after one more reply is timed, as the app does it.
Also timed: the learner's save after a pass, and loading each back.

    .venv/bin/python scripts/save_delays.py --json save_delays.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _summary(times: list[float]) -> dict:
    return {"worst_s": round(max(times), 4), "median_s": round(statistics.median(times), 4), "n": len(times)}


def replay(folder: Path, prompt: int, reply: int, rounds: int) -> dict:
    from keyring.backends import fail
    from omnidraft.core.engine import LearnSettings
    from omnidraft.core.learning.replay_buffer import ReplayBuffer, Sample
    from omnidraft.core.storage.secure_store import KeyStore

    keys = KeyStore(folder / "keys", backend=fail.Keyring())
    cap = LearnSettings().buffer_size
    rng = random.Random(0)

    def sample() -> Sample:
        target = [rng.randrange(151_936) for _ in range(prompt + reply)]
        drafter = [rng.randrange(49_152) for _ in range(prompt + reply)]
        return Sample(target, prompt, drafter, prompt, proposed=reply, accepted=reply // 2)

    path = folder / "replay.bin"
    buffer = ReplayBuffer(path, cap, keys)
    per_reply, rewrites, size = [], 0, 0
    # Each reply adds a sample (past the cap, the oldest is dropped) and saves: the
    # buffer fills up, then runs at its cap long enough for its log to be rewritten.
    for _ in range(cap + rounds):
        s = sample()
        per_reply.append(_timed(lambda s=s: (buffer.add(s), buffer.save())))
        rewrites += path.stat().st_size < size
        size = path.stat().st_size
    at_cap = per_reply[cap:]
    load = _timed(lambda: ReplayBuffer.load(path, cap, keys))
    # The learner's pass: the samples it trained on leave the buffer, then it saves.
    trained = {s.seq for s in buffer.samples()[: cap // 2]}
    after_pass = _timed(lambda: (buffer.remove(trained), buffer.save()))
    return {
        "cap_samples": cap, "tokens_per_sample": 2 * (prompt + reply), "file_mib": round(size / 2**20, 1),
        "save_after_reply": _summary(per_reply), "save_after_reply_at_cap": _summary(at_cap),
        "log_rewrites": rewrites, "save_after_learner_pass_s": round(after_pass, 4), "load_s": round(load, 3),
    }


def history(folder: Path, rounds: int) -> dict:
    from omnidraft.app.metrics_history import FILE_NAME, MAX_LEARNING, MAX_REPLIES, MetricsHistory
    from omnidraft.core.events import TurnStats

    path = folder / FILE_NAME
    stats = TurnStats(method="omnidraft", new_tokens=128, seconds=20.0, proposed=150, accepted=90)
    full = MetricsHistory(path)
    for i in range(MAX_REPLIES):
        full.add_turn(stats, "qwen2.5-coder-1.5b-instruct", 3.1)
    for i in range(MAX_LEARNING):
        full.add_learning("qwen2.5-coder-1.5b-instruct", i + 1, 8 * (i + 1), 2.5, 0.55)
    first_save = _timed(full.save)
    app = MetricsHistory(path)  # the app: loads the full history, then adds to it
    load = _timed(app.load)
    per_reply, per_step = [], []
    for i in range(rounds):  # what the charts' save timer does after each event
        app.add_turn(stats, "qwen2.5-coder-1.5b-instruct", 3.1)
        per_reply.append(_timed(app.save))
        app.add_learning("qwen2.5-coder-1.5b-instruct", MAX_LEARNING + i + 1, 1, 2.4, 0.56)
        per_step.append(_timed(app.save))
    size = sum(p.stat().st_size for p in folder.glob("metrics_history*"))
    return {
        "cap_replies": MAX_REPLIES, "cap_learning_points": MAX_LEARNING,
        "file_mib": round(size / 2**20, 2), "full_save_s": round(first_save, 3), "load_s": round(load, 3),
        "save_after_reply": _summary(per_reply), "save_after_learner_step": _summary(per_step),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-tokens", type=int, default=7680, help="a long chat, near the 8,192 window")
    parser.add_argument("--reply-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=300,
                        help="replies after the cap (the replay log is rewritten every ~256 at its cap)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="omnidraft-save-delays-") as tmp:
        os.environ["OMNIDRAFT_HOME"] = tmp
        figures = {
            "replay_buffer": replay(Path(tmp), args.prompt_tokens, args.reply_tokens, args.rounds),
            "chart_history": history(Path(tmp), args.rounds),
        }
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
