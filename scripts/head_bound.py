"""The ceiling of a two-stage LM head for greedy decoding: how much of the target's
6-bit head a step would still have to read.

The Qwen2.5-Coder-1.5B target's head is a Q6_K tensor (151,936 tokens x 1,536
inputs) that every forward streams whole: 7 bits a weight in the kernel's layout
(int4.Q6: 4 low bits, 2 high bits, an fp16 scale per 16 inputs), ~204 MB, about a
fifth of a decoding step's bytes. Greedy decoding needs only each row's argmax. A
two-stage head would first read a proxy, each weight's 4 high bits (q >> 2) and
the scales (5 bits a weight, were they laid out apart from the 2 low bits), whose
error per weight is at most 1.5 steps of its scale, so per token
|exact - proxy| <= 1.5 * sum over parts of |scale| * ||x part||_1 (x as the kernel
quantizes it, int8 per row); then read exactly only the 16-token columns where some
token's proxy plus that bound reaches the best proxy minus its bound: no other
token can be the argmax, so the argmax would be the full head's, bit for bit.

This prints what that would read, from the weights alone: over the greedy replies of
--limit dev prompts (--tokens each, raw completions), the tokens and 16-token
columns left per decoding row, the same for 5-row blocks (a verification's rows:
the union of their columns), and the bytes a forward's head would read against
the whole head's. The bound is checked against the real difference at every row.
Such a head was built (int4.GreedyHead, commit 4251f4c) and taken out again: this
script at d6bcc27 also times a target forward with the Q6_K layout's head, the
split layout's called whole and greedy: a one-token step 6.1% cheaper greedy, a
5-row verification only 0.5%, and the whole head from the split layout 2.6% dearer
at 5 rows (docs/speed.md, "A greedy LM head").

    PYTHONPATH=. .venv/bin/python scripts/head_bound.py --prompts eval/dev.jsonl
"""

from __future__ import annotations

import argparse
import mmap

import torch
from drafter_head import dev_prompts
from omnidraft.core.models import int4
from omnidraft.core.models.catalog import ModelCatalog
from omnidraft.core.models.gguf_header import read_header
from omnidraft.core.models.loader import load, source_path

COLUMN = int4.CHANNELS  # tokens a column of the kernel's layout holds
PART = int4.Q6_PART  # inputs a 6-bit scale covers


def head_q6(entry) -> int4.Q6:
    """The target's LM head as its GGUF file stores it (Q6_K)."""
    src = source_path(entry)
    tensors = {t.name: t for t in read_header(src).tensors}
    tensor = tensors.get(int4.gguf_name("lm_head")) or tensors["token_embd.weight"]  # tied: the embedding
    if tensor.ggml_type != int4.Q6_K:
        raise SystemExit(f"{src.name}: the head is not Q6_K")
    k, n = tensor.dims
    with open(src, "rb") as f:
        buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return int4.read_q6_k(buffer, tensor.offset, n, k)


def head_rows(loaded, prompts: list[str], tokens: int) -> torch.Tensor:
    """The head's input at each greedy decoding step of each prompt's reply."""
    net, rows = loaded.runner.net, []
    for prompt in prompts:
        net.reset()
        logits, _ = net.forward(loaded.tokenizer(prompt)["input_ids"], last=1)
        token = int(logits[-1].argmax())
        for _ in range(tokens):
            logits, h = net.forward([token])
            rows.append(h.float())
            token = int(logits[-1].argmax())
    return torch.cat(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--block", type=int, default=5, help="rows of a verification")
    args = parser.parse_args()
    entry = ModelCatalog().get(args.target)
    loaded = load(entry, torch.bfloat16, int8=True)
    x = head_rows(loaded, dev_prompts(args.prompts)[: args.limit], args.tokens)
    q6 = head_q6(entry)
    n, k = q6.q.shape
    scale = q6.scale.float()
    # x as the kernel quantizes it: int8 on the row's absolute maximum.
    step = x.abs().amax(1, keepdim=True) / 127
    xq = torch.round(x / step) * step
    exact = xq @ q6.weight().T
    proxy_weight = (((q6.q >> 2).float() * 4 + 1.5 - 32).view(n, k // PART, PART) * scale[..., None]).view(n, k)
    proxy = xq @ proxy_weight.T
    del proxy_weight
    bound = 1.5 * (xq.abs().view(-1, k // PART, PART).sum(-1) @ scale.abs().T)
    slack = float(((exact - proxy).abs() / bound).max())
    floor = (proxy - bound).amax(1, keepdim=True)
    reach = proxy + bound >= floor  # tokens that may be the argmax
    assert bool(reach.gather(1, exact.argmax(1, keepdim=True)).all()), "a row's argmax fell outside its candidates"
    columns = reach.view(len(x), -1, COLUMN).any(-1)
    blocks = columns[: len(x) // args.block * args.block].view(-1, args.block, columns.shape[1]).any(1)

    whole = n * k * 7 / 8  # the kernel's layout: 448 bytes per 16 tokens x 32 inputs
    first = n * k * 5 / 8  # the 4 high bits and the scales
    per_column = COLUMN * k * 7 / 8
    print(f"{len(x)} decoding rows of {args.limit} prompts; largest |exact - proxy| / bound {slack:.3f}")
    tokens_left = reach.sum(1).float()
    print(f"tokens left a row: median {tokens_left.median():.0f}, mean {tokens_left.mean():.0f}, "
          f"90th percentile {tokens_left.quantile(0.9):.0f}, most {tokens_left.max():.0f} of {n}")
    for label, cols in (("a row", columns), (f"a {args.block}-row block", blocks)):
        c = cols.sum(1).float()
        read = first + c.mean() * per_column
        print(f"columns left {label}: median {c.median():.0f}, mean {c.mean():.0f}, "
              f"90th percentile {c.quantile(0.9):.0f} of {n // COLUMN}; the head would read "
              f"{read / 1e6:.0f} MB a forward on average against {whole / 1e6:.0f} ({read / whole:.0%})")


if __name__ == "__main__":
    main()
