"""Verifying target-space proposals against one target forward (docs/method.md §1).

logits has one row per proposal plus one: row i is the target's next-token
distribution after the accepted prefix and proposals[:i], with the repetition
penalty for that history already applied (sampling.penalize_rows) when it is on.
Both verifiers judge proposals by the transformed target distribution plain
decoding would pick from (greedy: its argmax; sampling: probabilities(), i.e.
temperature, top-k, top-p, min-p), so the controls keep the output exact.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .sampling import GenerationConfig, probabilities


def verify_greedy(proposals: list[int], logits: torch.Tensor) -> tuple[int, int]:
    """Accept while the proposal equals the target's argmax; returns
    (number accepted, the target's own token at the first mismatch or the bonus)."""
    best = logits.argmax(-1).tolist()
    n = 0
    while n < len(proposals) and proposals[n] == best[n]:
        n += 1
    return n, best[n]


def verify_sampling(
    proposals: list[int],
    q_prime: list[float],
    logits: torch.Tensor,
    cfg: GenerationConfig,
    gen: torch.Generator | None,
    q_prime_dist: Callable[[int], torch.Tensor],
) -> tuple[int, int]:
    """Speculative sampling: accept token i with probability min(1, p(t_i)/q'(t_i));
    on the first rejection draw from norm(max(0, p - q')); if all are accepted,
    draw a bonus token from p. p is the target's transformed distribution;
    q' is whatever the drafter drew from (its own transforms, or a point mass).
    q_prime_dist(i) builds q' over the target vocabulary for position i (Eq. 2),
    only needed on a rejection."""
    p = probabilities(logits, cfg)
    for i, tok in enumerate(proposals):
        ratio = float(p[i, tok]) / max(q_prime[i], 1e-12)
        if float(torch.rand((), generator=gen)) < min(1.0, ratio):
            continue
        residual = (p[i] - q_prime_dist(i)).clamp(min=0)
        total = float(residual.sum())
        dist = residual / total if total > 1e-12 else p[i]
        return i, int(torch.multinomial(dist, 1, generator=gen))
    return len(proposals), int(torch.multinomial(p[len(proposals)], 1, generator=gen))
