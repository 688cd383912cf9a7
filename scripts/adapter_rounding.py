"""How much of a learned adapter's effect survives the drafter's weight formats.

A tiny random Llama drafter gets a rank-2 change on every projection of a given
fraction of a 4-bit rounding step (what a few learner steps make); the script
prints the cosine between the change that makes in the logits through the
drafter's quantized runtime and the change it makes in float: 1.0, the
adapter's effect kept whole; 0, buried in rounding noise. Means over --seeds.

  4-bit, merged   the adapter merged into the weights, then rounded to 4 bits
                  (what the drafter did until the adapter ran beside them)
  4-bit, beside   the 4-bit weights with the adapter beside them (DraftLinear's
                  low_rank, in the decoder-stack kernel): what it does now
  int8            the adapter merged into int8 weights

    PYTHONPATH=. .venv/bin/python scripts/adapter_rounding.py
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from omnidraft.core.models.lean_llama import LeanLlama

from tests.tiny import tiny_llama

MODES = ("4-bit, merged", "4-bit, beside", "int8")


def logits(model, adapter, mode: str, ids: list[int]) -> torch.Tensor:
    int8, int4 = mode != "float", mode.startswith("4-bit")
    if adapter and mode == "4-bit, merged":
        params = dict(model.named_parameters())
        saved = {path: params[f"{path}.weight"].detach().clone() for path in adapter}
        with torch.no_grad():
            for path, (a, b) in adapter.items():
                params[f"{path}.weight"] += b @ a
        try:
            return LeanLlama(model, int8=True, int4=True).forward(ids)[0]
        finally:
            with torch.no_grad():
                for path, w in saved.items():
                    params[f"{path}.weight"].copy_(w)
    return LeanLlama(model, int8=int8, int4=int4, adapter=adapter).forward(ids)[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--fractions", default="0.25,0.5,1.0")
    args = p.parse_args()
    ids = list(range(100, 160))
    print("change (of a 4-bit step) | " + " | ".join(MODES))
    for frac in map(float, args.fractions.split(",")):
        sums = dict.fromkeys(MODES, 0.0)
        for seed in range(args.seeds):
            model = tiny_llama(1000, seed=seed)
            g = torch.Generator().manual_seed(seed)
            adapter = {}
            for name, w in model.named_parameters():
                if name.endswith("proj.weight"):
                    step = (w.max() - w.min()).item() / 15 * frac
                    a, b = torch.randn(2, w.shape[1], generator=g), torch.randn(w.shape[0], 2, generator=g)
                    adapter[name.removesuffix(".weight")] = (a, b / (b @ a).abs().max() * step)
            wanted = (logits(model, adapter, "float", ids) - logits(model, None, "float", ids)).flatten()
            for mode in MODES:
                change = (logits(model, adapter, mode, ids) - logits(model, None, mode, ids)).flatten()
                sums[mode] += float(F.cosine_similarity(change, wanted, dim=0)) / args.seeds
        print(f"{frac:.2f} | " + " | ".join(f"{sums[m]:.3f}" for m in MODES))


if __name__ == "__main__":
    main()
