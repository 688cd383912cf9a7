"""The engine facade the worker drives: one target, the shared drafter, and chat.

Qt-free and process-agnostic: the worker process owns one Engine; tests and
the benchmark use it directly.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch

from . import paths
from .catalog import SMOLLM2_ID, ModelCatalog, ModelEntry, ModelError
from .chat_format import encode_chat, stop_token_ids
from .decoding import Cancel, _never, generate_plain
from .drafter import Drafter, DraftSettings
from .events import TokenChunk, TurnFinished
from .loader import LoadedModel, Progress, _no_progress, load
from .persistence import CorruptStateError
from .sampling import GenerationConfig
from .speculative import SpecOptions, generate_speculative
from .vocab_bridge import NgramCache, VocabBridge

MAX_MESSAGE_CHARS = 200_000
BASELINE_PROMPT = "Here is a short story about a lighthouse keeper and the sea.\n\n"
BASELINE_TOKENS = 24


class InputError(Exception):
    """A request the engine refuses; str(error) is shown to the user."""


class Engine:
    def __init__(
        self,
        catalog: ModelCatalog | None = None,
        dtype: torch.dtype = torch.bfloat16,
        drafter_id: str | None = None,
        draft_settings: DraftSettings | None = None,
    ):
        self.catalog = catalog or ModelCatalog()
        self.dtype = dtype
        # OMNIDRAFT_DRAFTER picks another drafter (a catalog id or a Llama model path).
        self.drafter_id = drafter_id or os.environ.get("OMNIDRAFT_DRAFTER") or SMOLLM2_ID
        self.draft_settings = draft_settings or DraftSettings()
        self.spec_options = SpecOptions(k=self.draft_settings.k)
        self.target: LoadedModel | None = None
        self.drafter: LoadedModel | None = None  # the drafter model as loaded
        self._drafter: Drafter | None = None  # its lean drafting runtime
        self.bridge: VocabBridge | None = None
        self.warnings: list[str] = []
        # The target's plain-decoding speed measured on this machine (tokens/s), the
        # baseline every reply's speedup is computed against; None until measured.
        self.baseline_tokens_per_s: float | None = None

    # ------------------------------------------------------------------ models
    @property
    def drafter_description(self) -> str | None:
        return self._drafter.description if self._drafter else None

    def load_target(
        self, id_or_path: str, progress: Progress = _no_progress, measure_baseline: bool = True
    ) -> ModelEntry:
        """Load a target (the previous one stays if this fails) and measure its
        plain speed here, the reference every reply's speedup is reported against."""
        entry = self.catalog.get(id_or_path)
        loaded = load(entry, self.dtype, progress)
        self._save_state()
        self.target = loaded  # replaced only once the new one loaded: a failure keeps the old
        self.baseline_tokens_per_s = None
        self.bridge = None
        try:
            self._ensure_drafter(progress)
            self.bridge = VocabBridge(self.drafter.tokenizer, loaded.tokenizer)
            self.bridge.cache = self._load_ngram_cache(entry.id)
        except ModelError as exc:  # the app still works, without speculation
            self.warnings.append(f"Drafting is off: {exc}")
        if measure_baseline:
            progress(f"Measuring {entry.name}'s plain speed", 0.99)
            self.measure_baseline()
        progress(f"{entry.name} ready", 1.0)
        return entry

    def _ensure_drafter(self, progress: Progress) -> None:
        if self._drafter is not None:
            return
        progress("Loading the drafter", 0.97)
        entry = self.catalog.get(self.drafter_id)
        self.drafter = load(entry, self.dtype)
        if self.drafter.model.config.model_type != "llama":
            raise ModelError("the drafter must be a Llama-architecture model")
        self._drafter = Drafter(self.drafter, self.draft_settings)

    def state_dir(self, target_id: str):
        drafter = self.drafter.entry.id if self.drafter else self.drafter_id
        return paths.data_dir() / "state" / f"{drafter}--{target_id}"

    def _load_ngram_cache(self, target_id: str) -> NgramCache:
        path = self.state_dir(target_id) / "ngram_cache.json"
        try:
            return NgramCache.load(path)
        except CorruptStateError as exc:
            kept = exc.quarantine()
            self.warnings.append(f"The learned n-gram cache was damaged and restarted (kept as {kept.name}).")
            return NgramCache()

    def _save_state(self) -> None:
        if self.target is not None and self.bridge is not None:
            self.bridge.cache.save(self.state_dir(self.target.entry.id) / "ngram_cache.json")

    # ------------------------------------------------------------------ input
    def encode(self, messages: list[dict]) -> list[int]:
        if self.target is None:
            raise InputError("No model is loaded yet.")
        if not messages or not messages[-1].get("content", "").strip():
            raise InputError("The message is empty; type something first.")
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
        # The drafter's preallocated context (Drafter max_len) must hold the same text.
        return max(64, min(window, 8192) - reserve)

    # ------------------------------------------------------------------ decoding
    def chat(
        self, messages: list[dict], cfg: GenerationConfig, cancel: Cancel = _never,
        speculative: bool = True,
    ) -> Iterator[TokenChunk | TurnFinished]:
        ids = self.encode(messages)
        prefix = None
        if speculative and self._drafter is not None:
            # The drafter reads the conversation in its own chat format.
            prefix = encode_chat(self.drafter.tokenizer, messages, "template")
        yield from self._run(ids, prefix, cfg, cancel, speculative)

    def complete(
        self, prompt: str, cfg: GenerationConfig, cancel: Cancel = _never, speculative: bool = False
    ) -> Iterator[TokenChunk | TurnFinished]:
        """Raw completion of a text prompt (the benchmark's prompts)."""
        if self.target is None:
            raise InputError("No model is loaded yet.")
        ids = self.target.tokenizer(prompt, split_special_tokens=True)["input_ids"]
        prefix = None
        if speculative and self._drafter is not None:
            prefix = self.drafter.tokenizer(prompt, split_special_tokens=True)["input_ids"]
        yield from self._run(ids, prefix, cfg, cancel, speculative)

    def _run(self, ids, drafter_prefix, cfg, cancel, speculative):
        if self.target is None:
            raise InputError("No model is loaded yet.")
        t = self.target
        stops = stop_token_ids(t.tokenizer, t.model)
        if speculative and self._drafter is not None and self.bridge is not None:
            if self.bridge.same_vocab:
                drafter_prefix = ids
            events = generate_speculative(
                t.model, t.tokenizer, self._drafter, self.bridge, ids, drafter_prefix,
                cfg, stops, self.spec_options, cancel,
            )
        else:
            events = generate_plain(t.model, t.tokenizer, ids, cfg, stops, cancel)
        for event in events:
            if isinstance(event, TurnFinished):
                self._after_turn(event)
            yield event

    def _after_turn(self, done: TurnFinished) -> None:
        if done.stats.method == "target" and done.stats.new_tokens >= 8:
            self._update_baseline(done.stats.tokens_per_s)
        if done.stats.method == "omnidraft":
            self._save_state()

    def _update_baseline(self, tokens_per_s: float) -> None:
        old = self.baseline_tokens_per_s
        self.baseline_tokens_per_s = tokens_per_s if old is None else 0.7 * old + 0.3 * tokens_per_s

    def measure_baseline(self, cancel: Cancel = _never) -> float | None:
        """Time the target's plain decoding here (the reference for speedups)."""
        cfg = GenerationConfig(max_new_tokens=BASELINE_TOKENS)
        for _ in self.complete(BASELINE_PROMPT, cfg, cancel):
            pass  # _after_turn folds the finished turn into the baseline
        return self.baseline_tokens_per_s

    def reset_personalization(self, model_id: str) -> None:
        """Forget what was learned for one target: its n-gram cache (and adapter and
        replay buffer, which live in the same folder)."""
        import shutil

        shutil.rmtree(self.state_dir(model_id), ignore_errors=True)
        if self.target is not None and self.target.entry.id == model_id and self.bridge is not None:
            self.bridge.cache = NgramCache(self.bridge.cache.max_entries)

    # ------------------------------------------------------------------ settings
    def apply_settings(self, settings) -> None:
        """Settings from the GUI (core.settings.Settings)."""
        k = int(getattr(settings, "draft_length", self.spec_options.k))
        self.spec_options.k = k
        self.draft_settings.k = k


__all__ = ["Engine", "InputError", "ModelError", "GenerationConfig"]
