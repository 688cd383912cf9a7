"""How close and how fast the quantized target is (core/models/quantize.py, int4.py), against bf16.

For a catalog target: bf16 greedy continuations of the first N dev prompts (every
other one chat-formatted) are the reference; each variant is then scored by
teacher-forced top-1 agreement with them and by their mean negative log-likelihood
(lower is better), and timed for one forward of 1 / 2 / 5 / 8 new tokens after a
200-token context (best of 5). Variants: bf16, int4 (the engine's default: the
file's Q4_K layers in 4 bits, the rest int8), int8 (per-row activation scales),
and int8 with one activation scale per call (fbgemm's own dynamic quantization,
which the engine avoids).

    .venv/bin/python scripts/quant_check.py --target qwen2.5-coder-1.5b-instruct --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from omnidraft.core.models import quantize
from omnidraft.core.models.catalog import ModelCatalog
from omnidraft.core.models.loader import load, source_path

ROOT = Path(__file__).resolve().parents[1]
ROWS = (1, 2, 5, 8)


def per_call_scale(self, x: torch.Tensor) -> torch.Tensor:
    """fbgemm's dynamic quantization as is: one activation scale for the whole call."""
    y = torch.ops.quantized.linear_dynamic(x.reshape(-1, self.in_features).float(), self._packed, True)
    if self.bias is not None:
        y = y + self.bias
    return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


@torch.inference_mode()
def references(model, tok, prompts: list[str], new_tokens: int) -> list[tuple[int, list[int]]]:
    out = []
    for i, p in enumerate(prompts):
        text = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                       add_generation_prompt=True) if i % 2 else p
        ids = tok(text).input_ids
        full = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False)[0].tolist()
        out.append((len(ids), full))
    return out


@torch.inference_mode()
def agreement(model, refs) -> dict:
    hit = total = 0
    nll = 0.0
    for n, full in refs:
        logits = model(torch.tensor([full])).logits[0, n - 1 : -1].float()
        target = torch.tensor(full[n:])
        hit += int((logits.argmax(-1) == target).sum())
        total += len(target)
        nll += float(torch.nn.functional.cross_entropy(logits, target, reduction="sum"))
    return {"top1_agreement": hit / total, "mean_nll": nll / total, "tokens": total}


@torch.inference_mode()
def forward_ms(model, tok) -> dict:
    from transformers import DynamicCache

    ids = torch.tensor([tok("def fibonacci(n):\n    " * 30).input_ids[:200]])
    out = {}
    for rows in ROWS:
        best = float("inf")
        for _ in range(5):
            cache = DynamicCache(config=model.config)
            model(ids, past_key_values=cache, use_cache=True)
            t = time.perf_counter()
            model(ids[:, :rows], past_key_values=cache, use_cache=True)
            best = min(best, time.perf_counter() - t)
        out[rows] = 1000 * best
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--prompts", type=Path, default=ROOT / "eval/dev.jsonl")
    p.add_argument("--limit", type=int, default=12)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--variants", default="bf16,int4,int8,int8 one scale per call")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    prompts = [json.loads(line)["prompt"] for line in args.prompts.read_text().splitlines() if line.strip()]
    entry = ModelCatalog().get(args.target)
    report: dict = {"target": entry.name, "prompts": min(args.limit, len(prompts)), "threads": args.threads}
    refs = None
    for variant in args.variants.split(","):
        loaded = load(entry, torch.bfloat16)
        if refs is None:
            refs = references(loaded.model, loaded.tokenizer, prompts[: args.limit], args.new_tokens)
        seconds = 0.0
        if variant != "bf16":
            start = time.perf_counter()
            four_bit = quantize.k_quant_reader(source_path(entry)) if variant == "int4" else None
            quantize.quantize_int8(loaded.model, four_bit)
            seconds = time.perf_counter() - start
        saved = quantize.Int8Linear.forward
        if variant == "int8 one scale per call":
            quantize.Int8Linear.forward = per_call_scale
        try:
            report[variant] = {
                **agreement(loaded.model, refs),
                "forward_ms": forward_ms(loaded.model, loaded.tokenizer),
                "quantize_seconds": seconds,
                "streamed_bytes": quantize.streamed_bytes(loaded.model),
            }
        finally:
            quantize.Int8Linear.forward = saved
        print(variant, json.dumps(report[variant]), flush=True)
        del loaded
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
