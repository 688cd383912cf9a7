"""The engine facade the worker drives: one target, the drafter, and a chat call.

Qt-free and process-agnostic: the worker process owns one Engine; tests and
the benchmark use it directly.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .catalog import ModelCatalog, ModelEntry, ModelError
from .chat_format import encode_chat, stop_token_ids
from .decoding import Cancel, _never, generate_plain
from .events import TokenChunk, TurnFinished
from .loader import LoadedModel, Progress, _no_progress, load
from .sampling import GenerationConfig

MAX_MESSAGE_CHARS = 200_000


class InputError(Exception):
    """A request the engine refuses; str(error) is shown to the user."""


class Engine:
    def __init__(self, catalog: ModelCatalog | None = None, dtype: torch.dtype = torch.bfloat16):
        self.catalog = catalog or ModelCatalog()
        self.dtype = dtype
        self.target: LoadedModel | None = None
        # The target's plain-decoding speed measured on this machine (tokens/s), the
        # baseline every reply's speedup is computed against; None until measured.
        self.baseline_tokens_per_s: float | None = None
        self.drafter_description: str | None = None  # None = plain decoding only

    def load_target(self, id_or_path: str, progress: Progress = _no_progress) -> ModelEntry:
        entry = self.catalog.get(id_or_path)
        loaded = load(entry, self.dtype, progress)
        self.target = loaded  # replace only once the new one loaded: a failure keeps the old
        return entry

    def encode(self, messages: list[dict]) -> list[int]:
        if self.target is None:
            raise InputError("No model is loaded yet.")
        if not messages or not messages[-1].get("content", "").strip():
            raise InputError("The message is empty; type something first.")
        if sum(len(m.get("content", "")) for m in messages) > MAX_MESSAGE_CHARS * 4:
            raise InputError("The conversation is too long; start a new chat.")
        if len(messages[-1]["content"]) > MAX_MESSAGE_CHARS:
            raise InputError(
                f"The message is too long ({len(messages[-1]['content']):,} characters; "
                f"at most {MAX_MESSAGE_CHARS:,})."
            )
        tok = self.target.tokenizer
        ids = encode_chat(tok, messages, self.target.entry.chat_format)
        # Keep the latest turns when the conversation outgrows the context window.
        limit = self.context_limit()
        while len(ids) > limit and len(messages) > 1:
            messages = messages[1:]
            ids = encode_chat(tok, messages, self.target.entry.chat_format)
        if len(ids) > limit:
            raise InputError(
                f"The message is too long for {self.target.entry.name}: {len(ids):,} tokens, "
                f"and it reads at most {limit:,}."
            )
        return ids

    def context_limit(self, reserve: int = 512) -> int:
        cfg = self.target.model.config
        window = getattr(cfg, "max_position_embeddings", 2048) or 2048
        return max(64, min(window, 32768) - reserve)

    def chat(
        self, messages: list[dict], cfg: GenerationConfig, cancel: Cancel = _never
    ) -> Iterator[TokenChunk | TurnFinished]:
        ids = self.encode(messages)
        yield from self.complete_ids(ids, cfg, cancel)

    def complete(
        self, prompt: str, cfg: GenerationConfig, cancel: Cancel = _never
    ) -> Iterator[TokenChunk | TurnFinished]:
        """Raw completion of a text prompt (the benchmark's prompts)."""
        tok = self.target.tokenizer
        ids = tok(prompt, split_special_tokens=True)["input_ids"]  # adds bos where the model wants it
        yield from self.complete_ids(ids, cfg, cancel)

    def complete_ids(
        self, ids: list[int], cfg: GenerationConfig, cancel: Cancel = _never
    ) -> Iterator[TokenChunk | TurnFinished]:
        if self.target is None:
            raise InputError("No model is loaded yet.")
        t = self.target
        stops = stop_token_ids(t.tokenizer, t.model)
        yield from generate_plain(t.model, t.tokenizer, ids, cfg, stops, cancel)


__all__ = ["Engine", "InputError", "ModelError", "GenerationConfig"]
