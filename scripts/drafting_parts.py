"""Where a step's drafting time goes, with and without what the drafter learned.

The bench's "drafting ms a step" (TurnStats.draft_seconds / steps) is everything
between a step's start and its verification: prompt lookup, the drafter's
prompt read (once a reply), its re-sync to the accepted text (a forward over
the newly accepted tokens), its draft forwards, and the stop rule. An adapt run
reads ~3 ms more of it after learning; this script tells the parts apart on one
engine and one learned state (an adapt run's --state-dir), decoding the same
prompts with omnidraft four ways, interleaved, --reps times:

  none      the drafter's own weights, the drafter's confidence as P_i
  adapter   the target's adapter beside the 4-bit weights (the side path)
  head      the acceptance head's P_i, no adapter
  both      the adapter and the head (what the app drafts with after learning)

and prints, per way: tokens/s, steps and drafter steps, the prompt reads', re-syncs'
and draft forwards' seconds, ms per draft forward, drafter forwards per drafter
step, and drafting ms per step and per drafter step. The state's learned
draft policy (lookup or drafter, prices, calibration) is the same for all four.

    .venv/bin/python scripts/drafting_parts.py --state-dir /tmp/adapt7-state --limit 12 \
        --json docs/results/drafting-parts-qwen15.json
    .venv/bin/python scripts/drafting_parts.py --limit 40 --reps 1   # the untrained engine: 'none' only
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from learning_sweep import ROOT, emit
from omnidraft.bench.cli import bench_home, read_prompts
from omnidraft.core.decoding.drafter import Drafter
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine
from omnidraft.core.events import TurnFinished

WAYS = {"none": (False, False), "adapter": (True, False), "head": (False, True), "both": (True, True)}


def timed(parts: Counter) -> None:
    """Add each Drafter entry point's seconds and calls to parts (and the draft
    forwards' own, which Drafter.draft measures)."""
    for name in ("start", "sync_text", "sync_ids", "draft"):
        original = getattr(Drafter, name)

        def wrapper(self, *args, _original=original, _name=name, **kwargs):
            t0 = time.perf_counter()
            out = _original(self, *args, **kwargs)
            parts[f"{_name}_s"] += time.perf_counter() - t0
            parts[f"{_name}_calls"] += 1
            if _name == "draft":
                parts["forward_s"] += out.forward_seconds
                parts["forwards"] += out.forwards
            return out

        setattr(Drafter, name, wrapper)


def run(engine: Engine, prompts: list[dict], max_new_tokens: int, parts: Counter) -> dict:
    parts.clear()
    totals = Counter()
    for row in prompts:
        cfg = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0)
        for event in engine.complete(row["prompt"], cfg, speculative=True):
            if isinstance(event, TurnFinished):
                s = event.stats
                totals.update(tokens=s.new_tokens, seconds=s.seconds, steps=s.steps,
                              lookup_steps=s.lookup_steps, draft_s=s.draft_seconds, verify_s=s.verify_seconds)
    drafter_steps = totals["steps"] - totals["lookup_steps"]
    sync_s = parts["sync_text_s"] + parts["sync_ids_s"]
    return {
        "tokens_per_s": totals["tokens"] / totals["seconds"],
        "steps": totals["steps"], "drafter_steps": drafter_steps,
        "prompt_read_s": parts["start_s"], "resync_s": sync_s, "draft_s": parts["draft_s"],
        "draft_forward_s": parts["forward_s"], "draft_forwards": parts["forwards"],
        "ms_per_draft_forward": 1000 * parts["forward_s"] / max(1, parts["forwards"]),
        "forwards_per_drafter_step": (parts["forwards"] + parts["sync_text_calls"] + parts["sync_ids_calls"])
        / max(1, drafter_steps),
        "drafting_ms_per_step": 1000 * totals["draft_s"] / totals["steps"],
        "drafting_ms_per_drafter_step": 1000 * (parts["start_s"] + sync_s + parts["draft_s"]) / max(1, drafter_steps),
        "verify_ms_per_step": 1000 * totals["verify_s"] / totals["steps"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--state-dir", type=Path, default=None,
                    help="an adapt run's state: the adapter and head (none: the untrained engine, way 'none' only)")
    ap.add_argument("--prompts", type=Path, default=ROOT / "eval/dev.jsonl")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    parts: Counter = Counter()
    timed(parts)
    prompts = read_prompts(args.prompts, args.limit)
    untrained = args.state_dir is None
    ways = {"none": WAYS["none"]} if untrained else WAYS
    with bench_home(Path(tempfile.mkdtemp()) if untrained else args.state_dir):
        engine = Engine()
        engine.load_target(args.target)
        engine.evaluating = True  # nothing here teaches the engine
        trained = engine.adapters.has_saved(args.target) and engine.drafter.head is not None and engine.drafter.head.ready
        if not untrained and not trained:
            print(f"{args.state_dir} holds no trained adapter and head for {args.target}", file=sys.stderr)
            return 2
        adapter = None if untrained else engine.adapters.low_rank_state(args.target)
        head = engine.drafter.head
        run(engine, prompts[:1], 8, parts)  # warm-up: first calls' one-off costs
        runs: dict[str, list[dict]] = {way: [] for way in ways}
        for rep in range(args.reps):
            for way, (with_adapter, with_head) in ways.items():
                engine.drafter.load_adapter(adapter if with_adapter else None)
                engine.drafter.head = head if with_head else None
                runs[way].append(run(engine, prompts, args.max_new_tokens, parts))
                print(f"rep {rep + 1} {way}: " + ", ".join(f"{k} {v:.3g}" for k, v in runs[way][-1].items()),
                      file=sys.stderr, flush=True)
    report = {"target": args.target, "state_dir": str(args.state_dir), "prompts": len(prompts),
              "max_new_tokens": args.max_new_tokens,
              "adapter_rank": next(iter(adapter.values()))[0].shape[0] if adapter else None,
              "runs": runs,
              "mean": {way: {k: sum(r[k] for r in rs) / len(rs) for k in rs[0]} for way, rs in runs.items()}}
    emit(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
