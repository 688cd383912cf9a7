"""What each speculative step proposed and what it got, by source: the untrained
engine decodes the prompts with omnidraft (no learning) and, for the drafter's
steps and the prompt lookup's apart, prints how many steps proposed a token at
each position, how many reached it (every earlier one accepted) and the share
of those accepted there (the conditional acceptance a longer proposal would
bet on), and the verification's ms by its rows (proposals + 1), the same run.

    .venv/bin/python scripts/step_outcomes.py --limit 40 --json docs/results/step-outcomes-qwen15-epyc-27.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from learning_sweep import ROOT, emit
from omnidraft.bench.cli import bench_home, read_prompts
from omnidraft.core.decoding import speculative
from omnidraft.core.decoding.adaptive_drafting import DRAFTER
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine


def record(steps: list[tuple[str, int, int, float]]) -> None:
    """Every step's (source, proposed, accepted, verification seconds) into steps."""
    count = speculative._count_step

    def counted(stats, proposals, n, draft_s, verify_s):
        source = DRAFTER if proposals.source == DRAFTER else "lookup"
        steps.append((source, len(proposals.tokens), n, verify_s))
        return count(stats, proposals, n, draft_s, verify_s)

    speculative._count_step = counted


def summary(steps: list[tuple[str, int, int, float]]) -> dict:
    by_source: dict[str, list] = defaultdict(list)
    for source, m, n, seconds in steps:
        by_source[source].append((m, n, seconds))
    out = {}
    for source, rows in by_source.items():
        positions = []
        for i in range(1, max(m for m, _, _ in rows) + 1):
            proposed = [n for m, n, _ in rows if m >= i]
            reached = [n for n in proposed if n >= i - 1]
            accepted = sum(n >= i for n in reached)
            positions.append({"position": i, "proposed": len(proposed), "reached": len(reached),
                              "accepted": accepted, "conditional": accepted / len(reached) if reached else None})
        by_rows: dict[int, list[float]] = defaultdict(list)
        for m, _, seconds in rows:
            by_rows[m + 1].append(seconds)
        out[source] = {
            "steps": len(rows),
            "proposed_per_step": sum(m for m, _, _ in rows) / len(rows),
            "accepted_per_step": sum(n for _, n, _ in rows) / len(rows),
            "positions": positions,
            "verify_ms_by_rows": {r: {"steps": len(v), "ms": 1000 * sum(v) / len(v)} for r, v in sorted(by_rows.items())},
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--prompts", type=Path, default=ROOT / "eval/dev.jsonl")
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    prompts = read_prompts(args.prompts, args.limit)
    steps: list[tuple[str, int, int, float]] = []
    with bench_home(Path(tempfile.mkdtemp())):
        engine = Engine()
        engine.load_target(args.target)
        engine.evaluating = True  # nothing here teaches the engine
        record(steps)
        for row in prompts:
            cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=0.0)
            for _ in engine.complete(row["prompt"], cfg, speculative=True):
                pass
    report = {"target": args.target, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "sources": summary(steps)}
    for source, s in report["sources"].items():
        print(f"{source}: {s['steps']} steps, {s['proposed_per_step']:.2f} proposed and "
              f"{s['accepted_per_step']:.2f} accepted a step", file=sys.stderr)
        for p in s["positions"]:
            share = f"{p['conditional']:.3f}" if p["conditional"] is not None else "-"
            print(f"  position {p['position']}: proposed {p['proposed']}, reached {p['reached']}, "
                  f"accepted {p['accepted']} ({share})", file=sys.stderr)
        print("  verification ms by rows: " + ", ".join(
            f"{r}: {v['ms']:.1f} ({v['steps']})" for r, v in s["verify_ms_by_rows"].items()), file=sys.stderr)
    emit(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
