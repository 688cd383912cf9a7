"""How the decode loops run a target: one KV cache per reply (a session) that
appends tokens and forgets rejected ones.

Llama and Qwen2 targets run on core/models/lean_llama.py over the model's own
(int8) linear layers: the same weights and products as transformers' forward,
without its per-layer Python (docs/speed.md has the measured step times), with
activations and the KV cache in float32, so a verified token's logits do not
depend on how many tokens were verified beside it. Any other architecture
(Gemma 3's sliding windows, a user's model) runs on transformers' own forward
and DynamicCache.
"""

from __future__ import annotations

from typing import Protocol

import torch
from transformers import DynamicCache

from .lean_llama import LeanLlama, supports
from .quantize import is_quantized


class TargetSession(Protocol):
    def forward(self, ids: list[int], last: int = 0) -> torch.Tensor:
        """Logits [len(ids), vocab] for ids appended after what the session holds,
        or only the last `last` rows."""

    def crop(self, drop: int) -> None:
        """Forget the last `drop` tokens appended."""


class TransformersSession:
    """The target through transformers' forward and DynamicCache (any architecture)."""

    def __init__(self, model):
        self.model = model
        self.cache = DynamicCache()
        self.cache.activate_past_recording()  # lets sliding-window layers roll back too

    @torch.inference_mode()
    def forward(self, ids: list[int], last: int = 0) -> torch.Tensor:
        # logits_to_keep: Gemma's 262k-word head over every prompt position would
        # cost more than the rest of the model.
        x = torch.as_tensor(ids, dtype=torch.long).view(1, -1)
        return self.model(input_ids=x, cache=self.cache, use_cache=True, logits_to_keep=last).logits[0]

    def crop(self, drop: int) -> None:
        if drop:
            self.cache.crop(-drop)


class LeanSession:
    """The target through LeanLlama; one session at a time per runner (they share
    its KV buffer). A session starts from what the previous one left in the
    buffer: its first forward runs only the ids past the prefix they share (the
    chat template's system turn, a conversation's earlier turns), as llama.cpp
    reuses its cache between prompts."""

    def __init__(self, net: LeanLlama):
        self.net = net
        self.started = False
        self.reused = 0  # prompt tokens whose keys/values came from the previous session

    def forward(self, ids: list[int], last: int = 0) -> torch.Tensor:
        if not self.started:
            self.started = True
            if last:  # rows of a kept prefix are not recomputed: only a forward for its last rows keeps one
                self.reused = self.net.reuse(ids, last)
                ids = ids[self.reused:]
            else:
                self.net.reset()
        return self.net.forward(ids, last)[0]

    def crop(self, drop: int) -> None:
        self.net.rollback(self.net.length - drop)


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

    @property
    def kind(self) -> str:
        return "lean" if self.net is not None else "transformers"

    def forget(self) -> None:
        """Keep nothing for the next session: it reads its prompt from the start."""
        if self.net is not None:
            self.net.reset()

    def session(self) -> TargetSession:
        return LeanSession(self.net) if self.net is not None else TransformersSession(self.model)
