"""Hybrid distillation loss for the drafter (docs/method.md section 2).

A served turn's reply exists twice: as the target's tokens t_1..t_m and as the
drafter's tokenization of the same text d_1..d_n. `align` splits both at every
byte offset where both have a token boundary. Each aligned segment is either

* direct: one drafter token d that the direct map sends to the one target
  token t (map(d) = t). Loss L_DM, the reverse KL in the target vocabulary at
  that position:
      L_DM = D_KL(q'_θ || p) = Σ_t q'_θ(t) (log q'_θ(t) − log p(t))
  q_θ is the drafter's next-token distribution (its logits at the previous
  drafter position), q'_θ that distribution carried to target ids through the
  direct map, p the target's next-token distribution (its logits at the
  previous target position). Reverse KL is mode-seeking: the drafter learns to
  put its mass where the target is confident, which is what acceptance needs.
* n-gram: anything else (several drafter tokens spell the target token(s), or
  boundaries differ). There is no per-token target distribution in drafter
  space, so the drafter learns the spelling itself. Loss L_Ngram, the mean NLL
  of the segment's drafter sub-tokens:
      L_Ngram = −(1/|S|) Σ_{j∈S} log q_θ(d_j)

L = mean over direct positions of L_DM + λ · mean over segments of L_Ngram,
λ = 0.2. (N-gram loss alone is unstable; the paper's 0.09 acceptance.)

Carrying q_θ to the target vocabulary. Drafter tokens without a target partner
(special tokens, ~6% of SmolLM2's vocabulary against Gemma's) drop out and q'_θ
is renormalised over the mapped ones. Without renormalisation q'_θ sums to
less than 1 and Σ q'(log q' − log p) is no longer a divergence: it is lowered
by moving mass onto unmapped tokens, the opposite of what drafting needs.
The KL is computed drafter-side, Σ_{mapped d} q'(d) (log q'(d) − log p(map(d))),
which is the target-space KL when the map is one-to-one. Where several drafter
tokens spell the same target token only the lowest drafter id keeps the
partnership (SmolLM2 -> Gemma has none: 46,145 drafter ids, 46,145 targets).

Same vocabulary (bridge.same_vocab): every 1:1 position is a plain reverse KL
over the shared vocabulary, no mapping, no renormalisation. With the engine's
same-vocabulary samples (drafter ids = target ids) that is every position.

The target's logits are recomputed by one target forward at training time
rather than stored with the sample: a 262,144-entry Gemma distribution is 1 MiB
per token in fp32, 256 MiB for one 256-token reply, against a few KiB of ids.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..decoding.vocab_bridge import DirectMap, VocabBridge, align

if TYPE_CHECKING:
    from .replay_buffer import Sample

LAMBDA = 0.2
ROWS_PER_SLICE = 16


def hybrid_loss(
    drafter_logits: torch.Tensor,
    target_logits: torch.Tensor,
    sample: Sample,
    bridge: VocabBridge,
    lam: float = LAMBDA,
    drafter_offset: int = 0,
    target_offset: int = 0,
    check: Callable[[], None] = lambda: None,
) -> tuple[torch.Tensor, dict]:
    """L = mean(L_DM) + lam * mean(L_Ngram) for one sample, and its stats.

    drafter_logits [rows, Vd] (with grad) and target_logits [rows, Vt] (no grad):
    row r holds the next-token logits after position offset + r. With the
    default offsets 0 they cover the whole sample (len(drafter_ids) and
    len(target_ids) rows); the learner passes only the rows from the last prompt
    position on, to keep the 262k-wide target logits small.

    check() is called between slices of positions (the learner's interruption
    point: it raises when a request is waiting).

    stats: dm, ngram (mean losses), n_dm, n_ngram (counts), acceptance_estimate
    (mean over direct positions of Σ_t min(q(t), p(t)): the probability that
    speculative sampling at temperature 1 accepts one drafted token, with the
    drafter's unmapped mass counted as rejected), greedy_match (fraction of
    direct positions where the drafter's argmax maps to the target's argmax:
    greedy acceptance).
    """
    dm_pos, ngram_segs = split_segments(sample, bridge)
    d_rows, d_lim = drafter_offset + 1, drafter_offset + drafter_logits.shape[0]
    t_rows, t_lim = target_offset + 1, target_offset + target_logits.shape[0]
    # A token is trainable only if the logits that predict it were given.
    dm_pos = [(d, t) for d, t in dm_pos if d_rows <= d <= d_lim and t_rows <= t <= t_lim]
    ngram_segs = [s for s in ngram_segs if s[0] >= d_rows and s[-1] <= d_lim]

    zero = drafter_logits.sum() * 0.0  # keeps the graph when a sample has nothing to learn
    stats = {"dm": 0.0, "ngram": 0.0, "n_dm": len(dm_pos), "n_ngram": len(ngram_segs),
             "acceptance_estimate": None, "greedy_match": None}
    loss = zero
    if dm_pos:
        parts = []
        for rows in range(0, len(dm_pos), ROWS_PER_SLICE):  # 262k-wide target rows: slices
            check()
            pos = dm_pos[rows : rows + ROWS_PER_SLICE]
            q_logits = drafter_logits[[d - 1 - drafter_offset for d, _ in pos]].float()
            with torch.no_grad():
                p_logits = target_logits[[t - 1 - target_offset for _, t in pos]].float()
            parts.append(_reverse_kl(q_logits, p_logits, bridge))
        kl, accept, match = (torch.cat(column) for column in zip(*parts))
        l_dm = kl.mean()
        loss = loss + l_dm
        stats.update(dm=float(l_dm.detach()), acceptance_estimate=float(accept.mean()),
                     greedy_match=float(match.float().mean()))
    if ngram_segs:
        l_ngram = _ngram_nll(drafter_logits, sample.drafter_ids, ngram_segs, drafter_offset)
        loss = loss + lam * l_ngram
        stats["ngram"] = float(l_ngram.detach())
    return loss, stats


# ---------------------------------------------------------------- segments
def split_segments(sample: Sample, bridge: VocabBridge) -> tuple[list[tuple[int, int]], list[list[int]]]:
    """Aligned reply segments as absolute positions in drafter_ids / target_ids.

    Returns (direct, ngram): direct is [(drafter position, target position)] of
    1:1 directly mapped tokens; ngram is, per other segment, its drafter positions.
    """
    direct: list[tuple[int, int]] = []
    ngram: list[list[int]] = []
    for d_run, t_run, is_direct in aligned_segments(sample, bridge):
        if is_direct:
            direct.append((d_run[0], t_run[0]))
        else:
            ngram.append(d_run)
    return direct, ngram


def aligned_segments(sample: Sample, bridge: VocabBridge) -> list[tuple[list[int], list[int], bool]]:
    """Every aligned reply segment: (its drafter positions, its target positions,
    whether it is one directly mapped token), positions absolute in drafter_ids /
    target_ids. Only the text up to the first special token of each reply is
    aligned (a stop token has no bytes, so the texts stop corresponding there).
    """
    d_bytes, t_bytes = bridge.direct.drafter_bytes, bridge.direct.target_bytes
    d_reply = _text_prefix(sample.drafter_reply, d_bytes)
    t_reply = _text_prefix(sample.target_reply, t_bytes)
    d_pos, t_pos = sample.drafter_prompt_len, sample.target_prompt_len
    out = []
    pairs = align([d_bytes[i] for i in d_reply], d_reply, [t_bytes[i] for i in t_reply], t_reply)
    for d_run, t_run in pairs:
        is_direct = len(d_run) == 1 and len(t_run) == 1 and _maps(bridge, d_run[0], t_run[0])
        out.append((list(range(d_pos, d_pos + len(d_run))), list(range(t_pos, t_pos + len(t_run))), is_direct))
        d_pos += len(d_run)
        t_pos += len(t_run)
    return out


def _text_prefix(ids: list[int], table: list[bytes | None]) -> list[int]:
    """The leading ids that spell text (stops at a special or unknown id)."""
    for n, i in enumerate(ids):
        if i >= len(table) or table[i] is None:
            return ids[:n]
    return ids


def _maps(bridge: VocabBridge, d: int, t: int) -> bool:
    return d == t if bridge.same_vocab else bridge.direct(d) == t


def clip_sample(sample: Sample, bridge: VocabBridge, max_prompt: int, max_reply: int) -> Sample:
    """Bound a sample's training cost: at most max_reply target reply tokens (cut
    where both tokenizations have a boundary, so the replies stay the same text)
    and the last max_prompt - 1 tokens of each prompt after its first token (the
    BOS / chat header), dropping older conversation."""
    t_reply, d_reply = sample.target_reply, sample.drafter_reply
    if len(t_reply) > max_reply:
        d_bytes, t_bytes = bridge.direct.drafter_bytes, bridge.direct.target_bytes
        d_text, t_text = _text_prefix(d_reply, d_bytes), _text_prefix(t_reply, t_bytes)
        n_d = n_t = 0
        for d_run, t_run in align([d_bytes[i] for i in d_text], d_text, [t_bytes[i] for i in t_text], t_text):
            if n_t + len(t_run) > max_reply:
                break
            n_d, n_t = n_d + len(d_run), n_t + len(t_run)
        t_reply, d_reply = t_reply[:n_t], d_reply[:n_d]
    t_prompt = _clip_prompt(sample.target_ids[: sample.target_prompt_len], max_prompt)
    d_prompt = _clip_prompt(sample.drafter_ids[: sample.drafter_prompt_len], max_prompt)
    return replace(
        sample,
        target_ids=t_prompt + t_reply, target_prompt_len=len(t_prompt),
        drafter_ids=d_prompt + d_reply, drafter_prompt_len=len(d_prompt),
    )


def _clip_prompt(ids: list[int], max_len: int) -> list[int]:
    if len(ids) <= max_len:
        return ids
    return ids[:1] + ids[len(ids) - (max_len - 1):] if max_len > 1 else ids[-max_len:]


# ---------------------------------------------------------------- losses
def _reverse_kl(
    q_logits: torch.Tensor, p_logits: torch.Tensor, bridge: VocabBridge
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per position: D_KL(q' || p), Σ min(q, p) and greedy agreement ([n] each)."""
    if bridge.same_vocab:
        v = min(q_logits.shape[-1], p_logits.shape[-1])  # padded LM heads may differ
        log_q = F.log_softmax(q_logits[:, :v], -1)
        log_p = F.log_softmax(p_logits[:, :v], -1)
        kl = (log_q.exp() * (log_q - log_p)).sum(-1)
        with torch.no_grad():
            accept = torch.minimum(log_q.exp(), log_p.exp()).sum(-1)
            match = q_logits[:, :v].argmax(-1) == p_logits[:, :v].argmax(-1)
        return kl, accept, match
    d_idx, t_idx, to_target = _partners(bridge.direct, q_logits.shape[-1], p_logits.shape[-1])
    # (index_select, not [:, idx]: a column gather 4x faster on CPU.)
    log_q_mapped = F.log_softmax(q_logits.index_select(1, d_idx), -1)  # q' renormalised
    log_p = p_logits.index_select(1, t_idx) - torch.logsumexp(p_logits, -1, keepdim=True)
    kl = (log_q_mapped.exp() * (log_q_mapped - log_p)).sum(-1)
    with torch.no_grad():
        # Not renormalised: drafted mass on an unmapped token is never accepted.
        q_full = F.softmax(q_logits, -1).index_select(1, d_idx)
        accept = torch.minimum(q_full, log_p.exp()).sum(-1)
        match = to_target[q_logits.argmax(-1)] == p_logits.argmax(-1)
    return kl, accept, match


def _ngram_nll(
    logits: torch.Tensor, drafter_ids: list[int], segments: list[list[int]], offset: int
) -> torch.Tensor:
    """Mean over segments of the mean NLL of each segment's drafter sub-tokens."""
    positions = [p for seg in segments for p in seg]
    which = torch.tensor([n for n, seg in enumerate(segments) for _ in seg])
    log_q = F.log_softmax(logits[[p - 1 - offset for p in positions]].float(), -1)
    nll = -log_q.gather(1, torch.tensor([drafter_ids[p] for p in positions])[:, None]).squeeze(1)
    sizes = torch.tensor([len(seg) for seg in segments], dtype=nll.dtype)
    per_segment = torch.zeros(len(segments), dtype=nll.dtype).index_add(0, which, nll) / sizes
    return per_segment.mean()


# Per DirectMap and logits widths: the one-to-one partner table (see the module doc).
_PARTNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _partners(direct: DirectMap, vd: int, vt: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(drafter ids, their target ids, drafter -> target or -1 over all vd ids)."""
    cached = _PARTNERS.setdefault(direct, {})
    if (vd, vt) not in cached:
        to_target = torch.full((vd,), -1, dtype=torch.long)
        n = min(vd, direct.to_target.numel())
        to_target[:n] = direct.to_target[:n]
        to_target[to_target >= vt] = -1
        d_all = (to_target >= 0).nonzero().flatten()
        # Lowest drafter id per target id: one partner each, so the drafter-side
        # sum is the target-space KL.
        first = torch.full((vt,), vd, dtype=torch.long)
        first.scatter_reduce_(0, to_target[d_all], d_all, reduce="amin")
        d_idx = first[first < vd].sort().values
        cached[(vd, vt)] = (d_idx, to_target[d_idx], to_target)
    return cached[(vd, vt)]
