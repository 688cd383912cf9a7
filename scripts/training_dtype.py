"""Seconds for one LoRA forward and backward of the drafter, in bf16 and in float32.

What the learner pays per sample for the drafter (core/learning/learner.py,
training_dtype): SmolLM2-135M-Instruct with a rank-32 adapter on all seven
projections, --tokens tokens in, logits of the last 64 kept, on --threads
threads (the learner's one by default). CPUs without native bf16 products
(AVX-512 BF16 or AMX) emulate them, and the backward most of all.

    .venv/bin/python scripts/training_dtype.py
"""

from __future__ import annotations

import argparse
import time

import torch
from omnidraft.core.learning.learner import training_dtype
from omnidraft.core.models.catalog import SMOLLM2_ID, ModelCatalog
from omnidraft.core.models.loader import load
from peft import LoraConfig, get_peft_model

PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ids = torch.randint(0, 40000, (1, args.tokens), generator=torch.Generator().manual_seed(0))
    print(f"the learner trains in {training_dtype()} on this CPU")
    for dtype in (torch.float32, torch.bfloat16):
        model = get_peft_model(load(ModelCatalog().get(SMOLLM2_ID), dtype).model,
                               LoraConfig(r=32, target_modules=PROJECTIONS))
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.data = p.data.float()  # as AdapterStore keeps them
        for _ in range(args.reps):
            start = time.perf_counter()
            logits = model(input_ids=ids, use_cache=False, logits_to_keep=64).logits
            mid = time.perf_counter()
            logits.float().logsumexp(-1).mean().backward()
            end = time.perf_counter()
            print(f"{dtype!s:16s} forward {mid - start:6.2f} s   backward {end - mid:6.2f} s")


if __name__ == "__main__":
    main()
