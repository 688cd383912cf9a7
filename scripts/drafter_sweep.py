"""Drafter candidates on this machine: cost ratio c and end-to-end speedup.

For each candidate (layers kept, int8 or bf16 weights, draft length k, prompt
lookup on/off) it measures, in one process and interleaved prompt by prompt:
  c            = one drafter step / one plain target step (median of timed steps)
  acceptance   = accepted / proposed target tokens
  tokens/step  = new tokens per target forward
  speedup      = omnidraft tokens/s / plain target tokens/s on the same prompts
Usage: python scripts/drafter_sweep.py --target gemma-3-270m --prompts eval/dev.jsonl \
          --limit 8 --max-new-tokens 64 [--json docs/drafter_sweep.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from omnidraft.core.decoding.drafter import Drafter, DraftSettings
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine
from omnidraft.core.events import TurnFinished

CANDIDATES = [
    # (layers kept, int8 weights, draft length k, prompt lookup, min drafter confidence)
    (30, True, 4, True, 0.0),
    (30, True, 4, True, 0.5),
    (30, True, 3, True, 0.3),
    (30, True, 6, True, 0.6),
    (30, True, 4, False, 0.5),
    (20, True, 4, True, 0.5),
    (30, False, 4, True, 0.5),
]


def step_ms(fn, n=15) -> float:
    fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def target_step_ms(engine: Engine) -> float:
    session = engine.target.runner.session()
    session.forward(list(range(100, 228)))

    def one():
        session.forward([7])
        session.crop(1)

    return step_ms(one)


def drafter_step_ms(drafter: Drafter) -> float:
    drafter.start(list(range(100, 228)))

    def one():
        drafter.net.forward([7])
        drafter.net.rollback(128)

    return step_ms(one)


def one(engine: Engine, prompt: str, cfg: GenerationConfig, speculative: bool):
    events = engine.complete(prompt, cfg, speculative=speculative)
    return next(e for e in events if isinstance(e, TurnFinished))


def run(engine: Engine, prompts: list[str], cfg: GenerationConfig):
    """Plain and speculative decoding interleaved prompt by prompt, so a load
    spike on this shared machine hits both alike."""
    plain, spec = [], []
    for p in prompts:
        plain.append(one(engine, p, cfg, False))
        spec.append(one(engine, p, cfg, True))

    def rate(done):
        return sum(d.stats.new_tokens for d in done) / sum(d.stats.seconds for d in done)

    proposed = sum(d.stats.proposed for d in spec)
    accepted = sum(d.stats.accepted for d in spec)
    steps = sum(d.stats.steps for d in spec)
    same = sum(a.token_ids == b.token_ids for a, b in zip(plain, spec)) / len(prompts)
    tokens = sum(d.stats.new_tokens for d in spec)
    return rate(plain), rate(spec), (accepted / proposed if proposed else None), tokens / max(steps, 1), same


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="gemma-3-270m")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    lines = Path(args.prompts).read_text().splitlines()
    prompts = [json.loads(line)["prompt"] for line in lines if line.strip()][: args.limit]
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens)
    engine = Engine()
    engine.load_target(args.target, measure_baseline=False)
    rows = []
    for layers, int8, k, lookup, min_conf in CANDIDATES:
        settings = DraftSettings(k=k, num_layers=layers, int8=int8, min_confidence=min_conf)
        engine.use_draft_settings(settings)
        engine.spec_options.prompt_lookup = lookup
        engine.bridge.cache.entries.clear()  # every candidate starts with an empty n-gram cache
        c = drafter_step_ms(engine.drafter) / target_step_ms(engine)
        plain_tps, spec_tps, acc, tps, same = run(engine, prompts, cfg)
        row = {"layers": layers, "int8": int8, "k": k, "prompt_lookup": lookup, "min_confidence": min_conf, "c": round(c, 3),
                   "acceptance": acc and round(acc, 3), "tokens_per_step": round(tps, 2),
                   "plain_tokens_per_s": round(plain_tps, 2), "omnidraft_tokens_per_s": round(spec_tps, 2),
                   "speedup": round(spec_tps / plain_tps, 3), "greedy_identical": same}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": args.target, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                       "threads": torch.get_num_threads(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
