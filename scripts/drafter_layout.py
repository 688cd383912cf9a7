"""The drafter's 4-bit layers and head in its file's Q4_1 form against Q4_K's grid.

Q4_1 keeps an fp16 scale and offset per group of 32 weights (5 bits a weight);
Q4_K keeps 6-bit ones per group under fp16 units per 256 (4.5 bits), and its
kernel runs a float step per superblock rather than per group. SmolLM2's file
stores Q4_1, so Q4_K rounds the drafter once more. Printed per form: bytes of
packed weights, ms a one-token forward right after a one-token target forward
(its weights come from memory, as in decoding; median of --reps, the forms
alternating), ms a prompt token of a --prompt-tokens prompt read, and how often
its argmax agrees with Q4_1's over the dev prompts' positions. End to end:
`omnidraft-bench --methods target,omnidraft,omnidraft-q4k`.

    PYTHONPATH=. .venv/bin/python scripts/drafter_layout.py --prompts eval/dev.jsonl
"""

from __future__ import annotations

import statistics
import time

from drafter_head import argmaxes, arguments, dev_prompts, drafter_and_target, ms_after_target_step
from omnidraft.core.models.int4 import Q4_1, Q4_K
from omnidraft.core.models.lean_llama import LeanLlama


def packed_bytes(net: LeanLlama) -> int:
    layers = sum(p.packed4.numel() for layer in net.layers for p in layer if getattr(p, "packed4", None) is not None)
    return layers + net.head.packed4.numel()


def main() -> None:
    parser = arguments(__doc__.split("\n")[0])
    parser.add_argument("--prompt-tokens", type=int, default=200)
    args = parser.parse_args()
    drafter, target = drafter_and_target(args.target)
    nets = {name: LeanLlama(drafter.model, int8=True, int4=True, max_len=4096, layout=layout)
            for name, layout in (("Q4_1", Q4_1), ("Q4_K", Q4_K))}
    prompts = dev_prompts(args.prompts)

    agree = positions = 0
    for prompt in prompts:
        top = argmaxes(nets, drafter, prompt)
        agree += (top["Q4_K"] == top["Q4_1"]).sum().item()
        positions += len(top["Q4_1"])

    long_prompt = drafter.tokenizer("\n".join(prompts))["input_ids"][: args.prompt_tokens]
    read = {name: [] for name in nets}
    for _ in range(args.reps // 6 + 1):
        for name, net in nets.items():
            net.reset()
            start = time.perf_counter()
            net.forward(long_prompt, last=1)
            read[name].append((time.perf_counter() - start) / len(long_prompt))
    step = ms_after_target_step(nets, drafter, target, prompts[0], args.reps)

    print(f"{len(prompts)} prompts, {positions} positions; Q4_K's argmax as Q4_1's: {agree / positions:.4f}")
    print(f"{'form':<6} {'MB packed':>10} {'ms a forward':>13} {'ms a prompt token':>18}")
    for name, net in nets.items():
        print(f"{name:<6} {packed_bytes(net) / 1e6:>10.1f} {step[name]:>13.3f} "
              f"{1000 * statistics.median(read[name]):>18.3f}")


if __name__ == "__main__":
    main()
