"""What the adapter's side path costs a drafter forward, by rank and projections.

The drafter drafts with its 4-bit weights and, once a target has an adapter,
that adapter's fp16 factors beside them (DraftLinear.low_rank, streamed by the
decoder-stack kernel on every forward). This times one-row forwards of the
bundled SmolLM2 drafter after a 200-token context, with random adapters of
each rank on all seven projections and on the MLP's three only, interleaved
with the plain drafter in one process (so the ratios hold on a loaded machine),
and prints ms per forward, the ratio to no adapter, and the factors' bytes;
then the same for reading a 160-token prompt from an empty cache (what the
drafter does at each reply's first draft, and, in short, at each re-sync).

    PYTHONPATH=. .venv/bin/python scripts/adapter_cost.py [--ranks 32,16,8] [--reps 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from omnidraft.core.models.catalog import SMOLLM2_ID, ModelCatalog
from omnidraft.core.models.lean_llama import LeanLlama
from omnidraft.core.models.loader import load

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def random_adapter(model, rank: int, names: tuple[str, ...]) -> dict:
    gen = torch.Generator().manual_seed(rank)
    out = {}
    for path, module in model.named_modules():
        if path.split(".")[-1] in names and isinstance(module, torch.nn.Linear):
            out[path] = (torch.randn(rank, module.in_features, generator=gen) * 1e-3,
                         torch.randn(module.out_features, rank, generator=gen) * 1e-3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="32,16,8")
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    model = load(ModelCatalog().get(SMOLLM2_ID), torch.bfloat16).model
    variants = {"none": None}
    for rank in (int(r) for r in args.ranks.split(",")):
        variants[f"rank {rank}, all 7"] = random_adapter(model, rank, ALL)
        variants[f"rank {rank}, MLP 3"] = random_adapter(model, rank, MLP)
    nets = {name: LeanLlama(model, int8=True, int4=True, adapter=adapter, max_len=1024)
            for name, adapter in variants.items()}
    context = list(range(100, 300))
    times: dict[str, list[float]] = {name: [] for name in nets}
    with torch.no_grad():
        for net in nets.values():
            net.forward(context)
        for _ in range(args.reps):
            for name, net in nets.items():  # interleaved: the machine's load hits all alike
                start = time.perf_counter()
                net.forward([42])
                times[name].append(time.perf_counter() - start)
                net.rollback(len(context))
        reads: dict[str, list[float]] = {name: [] for name in nets}
        for _ in range(max(3, args.reps // 25)):
            for name, net in nets.items():
                net.reset()
                start = time.perf_counter()
                net.forward(context[:160], last=1)
                reads[name].append(time.perf_counter() - start)
    for title, measured in (("one row after 200 tokens", times), ("a 160-token prompt read", reads)):
        base = statistics.median(measured["none"])
        print(f"{title}:\n{'adapter':<16} {'ms':>10} {'vs none':>8} {'factor MB':>10}")
        for name, ts in measured.items():
            adapter = variants[name] or {}
            mb = sum((a.numel() + b.numel()) * 2 for a, b in adapter.values()) / 1e6  # fp16, as streamed
            ms = statistics.median(ts)
            print(f"{name:<16} {1000 * ms:>10.2f} {ms / base:>7.2f}x {mb:>10.1f}")


if __name__ == "__main__":
    main()
