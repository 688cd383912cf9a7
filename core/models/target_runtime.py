"""How the decode loops run a target: a KV cache per runner that a reply (a
session) appends tokens to and forgets rejected ones from, and that the next
reply reuses as far as its prompt shares what the cache holds.

Llama and Qwen2 targets run on core/models/lean_llama.py over the model's own
(int8) linear layers: the same weights and products as transformers' forward,
without its per-layer Python (git show 524cea4:docs/speed.md has the measured step times), with
float32 activations and the KV cache in fp16 where the layers run as one kernel
call (float32 otherwise), each row computed on its own, so a verified token's
logits do not depend on how many tokens were verified beside it. Any other architecture
(Gemma 3's sliding windows, a user's model) runs on transformers' own forward
and a DynamicCache (HeldCache), its attention row by row for a verification's
few rows (ROWWISE), for the same reason.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Protocol

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .lean_llama import EXACT_ROWS, LeanLlama, common_prefix, supports
from .quantize import is_quantized


class TargetSession(Protocol):
    def forward(self, ids: list[int], last: int = 0) -> torch.Tensor:
        """Logits [len(ids), vocab] for ids appended after what the session holds,
        or only the last `last` rows."""

    def crop(self, drop: int) -> None:
        """Forget the last `drop` tokens appended."""


# transformers' attention for a target on HeldCache: blocks of up to EXACT_ROWS
# query rows (a verification's, a one-token step's) attend one row at a time over
# just the keys the row sees, unmasked, as a one-token step does; longer blocks (a
# prompt) as sdpa. SDPA over a masked block sums in another order, which through
# bf16 activations and int8 layers made 37 of 40 Gemma-3-270M replies unlike plain
# decoding's (git show 524cea4:docs/speed.md).
ROWWISE = "omnidraft_rowwise"


def _runs(mask: torch.Tensor | None, q_len: int, kv_len: int) -> list[tuple[int, int]] | None:
    """For each query row, the keys [lo, hi) it attends to (causal, or a sliding
    window); None when a row's keys are not one run."""
    if mask is None:  # causal, nothing else masked
        return [(0, kv_len - q_len + row + 1) for row in range(q_len)]
    seen = mask[0, 0] if mask.dtype == torch.bool else mask[0, 0] == 0
    counts = seen.sum(-1).tolist()
    first = seen.int().argmax(-1).tolist()
    runs = [(lo, lo + n) for lo, n in zip(first, counts, strict=True)]
    if any(n == 0 or not bool(seen[row, lo:hi].all()) for row, ((lo, hi), n) in enumerate(zip(runs, counts))):
        return None
    return runs


# The masks one forward's layers share -> their runs; emptied around each forward,
# so an id is never that of a mask gone since.
_runs_of: dict = {}


def rowwise_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    q_len, kv_len = query.shape[2], key.shape[2]
    extras = any(kwargs.get(name) is not None for name in ("position_bias", "s_aux", "softcap"))
    if q_len > EXACT_ROWS or query.shape[0] != 1 or extras:  # what this does not mimic: sdpa's own way
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    tag = (id(attention_mask), q_len, kv_len)
    if tag not in _runs_of:
        _runs_of[tag] = _runs(attention_mask, q_len, kv_len)
    runs = _runs_of[tag]
    if runs is None:  # keys not in one run (never seen for causal LMs): as sdpa would
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    heads, kv_heads, dim = query.shape[1], key.shape[1], query.shape[3]
    out = query.new_empty(1, q_len, heads, dim)
    for row, (lo, hi) in enumerate(runs):
        # The query heads sharing a key/value head as rows of one query, as
        # transformers runs a one-token step.
        q = query[:, :, row].reshape(1, kv_heads, heads // kv_heads, dim)
        att = F.scaled_dot_product_attention(q, key[:, :, lo:hi], value[:, :, lo:hi], scale=scaling)
        out[0, row] = att.reshape(heads, dim)
    return out, None


AttentionInterface.register(ROWWISE, rowwise_attention)
AttentionMaskInterface.register(ROWWISE, sdpa_mask)


@contextmanager
def _rowwise(model):
    """A model that attends with sdpa attends with ROWWISE inside (its other users,
    the learner and the bench's transformers peer, keep their own attention); one
    on another attention (eager for Gemma 2's soft-capping) keeps it."""
    before = model.config._attn_implementation
    if before != "sdpa":
        yield
        return
    model.config._attn_implementation = ROWWISE
    _runs_of.clear()
    try:
        yield
    finally:
        model.config._attn_implementation = before
        _runs_of.clear()


class HeldCache:
    """transformers' forward over a DynamicCache that records the ids it holds: the
    interface of LeanLlama's KV buffer (reuse, rollback, reset), so one session
    class serves both runtimes. The cache is built without the model's config, so
    its layers keep every position (Gemma 3's sliding-window layers included:
    the attention mask applies the window) and can be rolled back anywhere."""

    def __init__(self, model):
        self.model = model
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache()
        self.ids: list[int] = []

    @property
    def length(self) -> int:
        return len(self.ids)

    def rollback(self, length: int) -> None:
        drop = len(self.ids) - max(0, length)
        if drop > 0:
            self.cache.crop(-drop)
            del self.ids[len(self.ids) - drop:]

    def reuse(self, ids: list[int], compute: int = 1) -> int:
        """As LeanLlama.reuse: keep the longest prefix of ids the cache holds."""
        common = common_prefix(self.ids, ids, len(ids) - compute)
        self.rollback(common)
        return common

    @torch.inference_mode()
    def forward(self, ids: list[int], last: int = 0) -> tuple[torch.Tensor, None]:
        # logits_to_keep: Gemma's 262k-word head over every prompt position would
        # cost more than the rest of the model.
        x = torch.as_tensor(ids, dtype=torch.long).view(1, -1)
        try:
            with _rowwise(self.model):
                logits = self.model(input_ids=x, cache=self.cache, use_cache=True, logits_to_keep=last).logits[0]
        except BaseException:
            self.reset()  # layers cached part of a failed forward: nothing in it can be reused
            raise
        self.ids += x[0].tolist()
        return logits, None


class Session:
    """One reply's view of a runner's cache (LeanLlama's buffer or a HeldCache);
    one session at a time per runner. A session starts from what the previous one
    left: its first forward runs only the ids past the prefix they share (the
    chat template's system turn, a conversation's earlier turns), as llama.cpp
    reuses its cache between prompts."""

    def __init__(self, cache: LeanLlama | HeldCache):
        self.cache = cache
        self.started = False
        self.reused = 0  # prompt tokens whose keys/values came from the previous session

    def forward(self, ids: list[int], last: int = 0) -> torch.Tensor:
        if not self.started:
            self.started = True
            if last:  # rows of a kept prefix are not recomputed: only a forward for its last rows keeps one
                self.reused = self.cache.reuse(ids, last)
                ids = ids[self.reused:]
            else:
                self.cache.reset()
        return self.cache.forward(ids, last)[0]

    def crop(self, drop: int) -> None:
        self.cache.rollback(self.cache.length - drop)


class TargetRunner:
    """A loaded target as the decode loops use it: session() for each reply."""

    def __init__(self, model, lean: bool = True):
        self.model = model
        self.net: LeanLlama | None = None
        if lean and supports(model.config) is None:
            # Int8 layers take any activation dtype; float ones need their own.
            dtype = torch.float32 if is_quantized(model) else next(model.parameters()).dtype
            window = getattr(model.config, "max_position_embeddings", None) or 32768
            self.net = LeanLlama.sharing(model, max_len=window, dtype=dtype)
        # What a reply leaves for the next one to reuse: the lean buffer, or transformers' cache.
        self.cache: LeanLlama | HeldCache = self.net if self.net is not None else HeldCache(model)

    @property
    def kind(self) -> str:
        return "lean" if self.net is not None else "transformers"

    def forget(self) -> None:
        """Keep nothing for the next session: it reads its prompt from the start."""
        self.cache.reset()

    def session(self) -> TargetSession:
        return Session(self.cache)
