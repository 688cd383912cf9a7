"""Milliseconds per target forward as the decode loops call it, by rows: plain
decoding's one-token steps and speculative verification's 1 + m rows, over real
replies (the first --limit dev prompts, --max-new-tokens each), plain and
speculative alternating twice. Medians per row count; compare with
scripts/forward_breakdown.py, which times the same forwards in isolation.

    .venv/bin/python scripts/loop_forwards.py --limit 4
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
from pathlib import Path

from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine, LearnSettings
from omnidraft.core.models import target_runtime
from omnidraft.core.models.catalog import ModelCatalog

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--prompts", type=Path, default=ROOT / "eval" / "dev.jsonl")
    p.add_argument("--limit", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    args = p.parse_args()
    times: list[tuple[int, float]] = []
    forward = target_runtime.Session.forward

    def timed(self, ids, last=0):
        start = time.perf_counter()
        logits = forward(self, ids, last)
        times.append((len(ids), time.perf_counter() - start))
        return logits

    target_runtime.Session.forward = timed
    engine = Engine(ModelCatalog(), learn_settings=LearnSettings(enabled=False))
    engine.load_target(args.target, measure_baseline=False)
    lines = args.prompts.read_text().splitlines()
    prompts = [json.loads(line)["prompt"] for line in lines if line.strip()][: args.limit]
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens)
    for speculative in (False, True, False, True):
        times.clear()
        for prompt in prompts:
            for _ in engine.complete(prompt, cfg, speculative=speculative):
                pass
        rows = collections.defaultdict(list)
        for n, seconds in times:
            if n <= 9:  # not the prompts' prefills
                rows[n].append(1000 * seconds)
        cells = "  ".join(f"{n}: {statistics.median(v):5.1f} ({len(v)})" for n, v in sorted(rows.items()))
        print(f"{'speculative' if speculative else 'plain':12s} ms (forwards) by rows  {cells}")


if __name__ == "__main__":
    main()
