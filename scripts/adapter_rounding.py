"""How much of a learned adapter's effect survives the drafter's weight rounding.

A tiny random Llama drafter gets a rank-2 change on every projection of a given
fraction of a 4-bit rounding step (what a few learner steps make); the script
prints the cosine between the change that makes in the logits through the
drafter's quantized runtime and the change it makes in float, for the 4-bit
drafter (the merged weight rounded by int4.fit, as the app does) and the int8
one. 1.0: the adapter's effect kept whole; 0: buried in rounding noise. Means
over --seeds. (Rounding the merged weight onto the grid of the model's own
weight instead was tried: 0.312 / 0.426 / 0.648 against 0.249 / 0.460 / 0.607
at a quarter / half / whole step, not worth keeping.)

    PYTHONPATH=. .venv/bin/python scripts/adapter_rounding.py
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from omnidraft.core.models.lean_llama import LeanLlama

from tests.tiny import tiny_llama


def logits(model, weights, mode: str, ids: list[int]) -> torch.Tensor:
    int8, int4 = mode != "float", mode == "4-bit"
    return LeanLlama(model, int8=int8, int4=int4, weights=weights).forward(ids)[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--fractions", default="0.25,0.5,1.0")
    args = p.parse_args()
    modes = ("4-bit", "int8")
    ids = list(range(100, 160))
    print("change (of a 4-bit step) | " + " | ".join(modes))
    for frac in map(float, args.fractions.split(",")):
        sums = dict.fromkeys(modes, 0.0)
        for seed in range(args.seeds):
            model = tiny_llama(1000, seed=seed)
            g = torch.Generator().manual_seed(seed)
            params = dict(model.named_parameters())
            merged = {}
            for name, w in params.items():
                if name.endswith("proj.weight"):
                    step = (w.max() - w.min()).item() / 15 * frac
                    a, b = torch.randn(2, w.shape[1], generator=g), torch.randn(w.shape[0], 2, generator=g)
                    merged[name] = w.detach() + (b @ a) / (b @ a).abs().max() * step
            wanted = (logits(model, merged, "float", ids) - logits(model, None, "float", ids)).flatten()
            for mode in modes:
                change = (logits(model, merged, mode, ids) - logits(model, None, mode, ids)).flatten()
                sums[mode] += float(F.cosine_similarity(change, wanted, dim=0)) / args.seeds
        print(f"{frac:.2f} | " + " | ".join(f"{sums[m]:.3f}" for m in modes))


if __name__ == "__main__":
    main()
