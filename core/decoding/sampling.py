"""Choosing the next token from logits: greedy, or temperature + top-p with a seed."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GenerationConfig:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    seed: int | None = None
    stop_strings: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def generator(self) -> torch.Generator | None:
        if self.greedy:
            return None
        g = torch.Generator()
        g.manual_seed(self.seed if self.seed is not None else torch.seed())
        return g


def probabilities(logits: torch.Tensor, cfg: GenerationConfig) -> torch.Tensor:
    """The distribution sampling draws from (temperature, then top-p), in float32."""
    probs = torch.softmax(logits.float() / cfg.temperature, dim=-1)
    if cfg.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < cfg.top_p  # always keeps the top token
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def pick(logits: torch.Tensor, cfg: GenerationConfig, gen: torch.Generator | None) -> int:
    """One token id from a 1-D logits vector."""
    if cfg.greedy:
        return int(logits.argmax())
    return int(torch.multinomial(probabilities(logits, cfg), 1, generator=gen))
