"""Choosing the next token from logits: greedy, or sampled with a seed.

The transforms, in the order they apply (transformers' order):
repetition penalty on the logits (greedy too, as in llama.cpp and transformers),
then temperature, top-k, top-p and min-p. Greedy takes the argmax of the
penalized logits: top-k, top-p and min-p always keep the most likely token, so
they never change it. Every control at its default changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class GenerationConfig:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    seed: int | None = None
    stop_strings: tuple[str, ...] = ()
    top_k: int = 0  # keep the k most likely tokens (ties at the k-th kept too); 0 = off
    min_p: float = 0.0  # drop tokens less likely than min_p x the most likely one; 0 = off
    # CTRL's repetition penalty: each token among the last penalty_last_n of the
    # context (prompt and reply so far) has its logit divided by it when positive,
    # multiplied when negative. 1 = off. 64 tokens is llama.cpp's default window.
    repetition_penalty: float = 1.0
    penalty_last_n: int = 64

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalized(self) -> bool:
        """Whether the repetition penalty changes anything (callers skip it otherwise)."""
        return self.repetition_penalty != 1.0 and self.penalty_last_n > 0

    def generator(self) -> torch.Generator | None:
        if self.greedy:
            return None
        g = torch.Generator()
        g.manual_seed(self.seed if self.seed is not None else torch.seed())
        return g


def _penalize_row(row: torch.Tensor, recent: Sequence[int], penalty: float) -> None:
    """In place: the penalty on the tokens of `recent` (each once, however often it occurs)."""
    if not recent:
        return
    ids = torch.tensor(sorted(set(recent)), dtype=torch.long)
    ids = ids[ids < row.shape[-1]]
    seen = row[ids]
    row[ids] = torch.where(seen > 0, seen / penalty, seen * penalty)


def penalize(logits: torch.Tensor, history: Sequence[int], cfg: GenerationConfig) -> torch.Tensor:
    """A 1-D logits vector with the repetition penalty for the tokens so far
    (history: the context the next token follows), in float32. A copy."""
    out = logits.float().clone()
    _penalize_row(out, history[max(0, len(history) - cfg.penalty_last_n):],
                  cfg.repetition_penalty)
    return out


def penalize_rows(
    logits: torch.Tensor, context: Sequence[int], proposals: Sequence[int], cfg: GenerationConfig
) -> torch.Tensor:
    """Verification's logits (row i: the next token after context + proposals[:i])
    with the repetition penalty each row's own position calls for: row i's history
    holds the proposals before i, as plain decoding's would once it had emitted them."""
    n = cfg.penalty_last_n
    tail = list(context[max(0, len(context) - n):]) + list(proposals)
    base = len(tail) - len(proposals)  # where row 0's history ends
    out = logits.float().clone()
    for i in range(out.shape[0]):
        end = base + i
        _penalize_row(out[i], tail[max(0, end - n):end], cfg.repetition_penalty)
    return out


def probabilities(logits: torch.Tensor, cfg: GenerationConfig) -> torch.Tensor:
    """The distribution sampling draws from (temperature, top-k, top-p, min-p), in
    float32, for one logits vector or each row of several. The repetition penalty
    is applied before (penalize), as it needs the tokens so far."""
    scaled = logits.float() / cfg.temperature
    if 0 < cfg.top_k < scaled.shape[-1]:
        kth = scaled.topk(cfg.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if cfg.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < cfg.top_p  # always keeps the top token
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    if cfg.min_p > 0.0:
        probs = probs * (probs >= cfg.min_p * probs.amax(-1, keepdim=True))  # keeps the top token
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def pick(
    logits: torch.Tensor, cfg: GenerationConfig, gen: torch.Generator | None, history: Sequence[int] = ()
) -> int:
    """One token id from a 1-D logits vector; history: the context it follows
    (read only for the repetition penalty)."""
    if cfg.penalized:
        logits = penalize(logits, history, cfg)
    if cfg.greedy:
        return int(logits.argmax())
    return int(torch.multinomial(probabilities(logits, cfg), 1, generator=gen))
