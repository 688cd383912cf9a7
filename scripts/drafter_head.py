"""What a cheaper LM head would save the drafter, and what it would change.

A drafted token costs a drafter forward after a target forward has streamed ~1 GB
through the caches, so the drafter's weights come from memory: 30 layers of 4-bit
projections (~66 MB) and an int8 LM head over SmolLM2's 49,152 tokens (~28 MB).
Two cheaper heads against the int8 one (the default until Dec 5):

* 4-bit (Q4_1's form, as the layers; the default since, by end-to-end speed:
  `omnidraft-bench --methods target,omnidraft-head4,omnidraft-head8`): ~18 MB;
* int8 over the first --rows token ids only (BPE ids run roughly by frequency):
  proposals outside them would be lost.

Printed: ms a one-token drafter forward right after a one-token target forward
(median of --reps, the heads alternating), how often each head's argmax agrees
with the int8 head's over the dev prompts' positions, and the share of the int8
head's argmaxes below --rows.

    PYTHONPATH=. .venv/bin/python scripts/drafter_head.py --prompts eval/dev.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from omnidraft.core.models.catalog import SMOLLM2_ID, ModelCatalog
from omnidraft.core.models.lean_llama import DraftLinear, LeanLlama
from omnidraft.core.models.loader import load


def arguments(description: str) -> argparse.ArgumentParser:
    """--prompts, --target and --reps, which the drafter's comparison scripts share."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--prompts", required=True, help="a JSONL file of {\"prompt\": ...}")
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--reps", type=int, default=60)
    return parser


def drafter_and_target(target: str) -> tuple:
    catalog = ModelCatalog()
    return load(catalog.get(SMOLLM2_ID), torch.bfloat16), load(catalog.get(target), torch.bfloat16, int8=True)


def dev_prompts(path: str) -> list[str]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["prompt"] for line in lines if line.strip()]


def argmaxes(nets: dict[str, LeanLlama], drafter, prompt: str) -> dict[str, torch.Tensor]:
    """Each net's argmax at each of the prompt's first 1,000 positions, read from scratch."""
    ids = drafter.tokenizer(prompt)["input_ids"][:1000]
    top = {}
    for name, net in nets.items():
        net.reset()
        top[name] = net.forward(ids)[0].argmax(-1)
    return top


def ms_after_target_step(nets: dict[str, LeanLlama], drafter, target, prompt: str, reps: int) -> dict[str, float]:
    """Each net's median ms of a one-token forward right after a one-token target
    forward (which streams the target's weights, as decoding does), the nets
    alternating, after 200 tokens of the prompt."""
    context = drafter.tokenizer(prompt)["input_ids"][:200]
    session = target.runner.session()
    target_context = target.tokenizer(prompt)["input_ids"][:200]
    session.forward(target_context, last=1)
    for net in nets.values():
        net.reset()
        net.forward(context)
    times = {name: [] for name in nets}
    for rep in range(reps + 1):
        for name, net in nets.items():
            session.forward(target_context[:1])
            session.crop(1)
            start = time.perf_counter()
            net.forward([42])
            if rep:  # the first of each is a warm-up
                times[name].append(time.perf_counter() - start)
            net.rollback(len(context))
    return {name: 1000 * statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = arguments(__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=24576)
    args = parser.parse_args()
    drafter, target = drafter_and_target(args.target)
    weight = drafter.model.get_output_embeddings().weight
    nets = {name: LeanLlama(drafter.model, int8=True, int4=True, max_len=4096)
            for name in ("int8", "4-bit", f"int8, first {args.rows} ids")}
    nets["4-bit"].head = DraftLinear(nets["4-bit"]._w(weight), None, True, True)  # the default since Dec 5
    nets["int8"].head = DraftLinear(nets["int8"]._w(weight), None, True)
    nets[f"int8, first {args.rows} ids"].head = DraftLinear(nets["int8"]._w(weight[: args.rows]), None, True)
    prompts = dev_prompts(args.prompts)

    agree = dict.fromkeys(nets, 0)
    positions = below = 0
    for prompt in prompts:
        top = argmaxes(nets, drafter, prompt)
        for name in nets:
            agree[name] += (top[name] == top["int8"]).sum().item()
        positions += len(top["int8"])
        below += (top["int8"] < args.rows).sum().item()

    times = ms_after_target_step(nets, drafter, target, prompts[0], args.reps)

    print(f"{len(prompts)} prompts, {positions} positions; the int8 head's argmax below id {args.rows}: "
          f"{below / positions:.4f}")
    print(f"{'head':<24} {'ms a forward':>13} {'argmax as int8':>15}")
    for name in nets:
        print(f"{name:<24} {times[name]:>13.3f} {agree[name] / positions:>15.4f}")


if __name__ == "__main__":
    main()
