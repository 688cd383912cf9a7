"""The engine facade the worker drives: one target, the shared drafter, and chat.

Qt-free and process-agnostic: the worker process owns one Engine; tests and
the benchmark use it directly. The Engine loads the models, chooses the decode
loop for each request and hands its parts to the units that do the rest:
context fitting (core/models/context.py), each target's learned state
(core/learning/target_state.py), online learning (core/learning/online.py) and
the plain-speed baseline (core/decoding/speed_baseline.py).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator

import psutil
import torch

from .decoding.adaptive_drafting import DraftPolicy
from .decoding.drafter import Drafter, DraftSettings
from .decoding.plain import generate_plain
from .decoding.sampling import GenerationConfig
from .decoding.speculative import SpecOptions, generate_speculative
from .decoding.speed_baseline import SpeedBaseline
from .decoding.vocab_bridge import NgramCache, VocabBridge
from .events import TokenChunk, TurnFinished
from .learning.acceptance_head import AcceptanceHead
from .learning.adapters import AdapterStore
from .learning.learner import Learner, LearningStatus, training_dtype
from .learning.online import LearnSettings, OnlineLearning, turn_sample
from .learning.replay_buffer import ReplayBuffer, Sample
from .learning.target_state import TargetState, state_folder
from .models.catalog import SMOLLM2_ID, ModelCatalog, ModelEntry, ModelError
from .models.chat_format import encode_chat, stop_token_ids
from .models.context import (
    EncodedChat,
    InputError,
    conversation_limit,
    fit_conversation,
    model_window,
    own_window,
)
from .models.loader import LoadCancelled, LoadedModel, Progress, load, load_failure, no_progress
from .models.model_info import ModelInfo, describe
from .stopping import ShouldStop, never
from .storage import paths

MAX_CACHED_BRIDGES = 3


class Engine:
    def __init__(
        self,
        catalog: ModelCatalog | None = None,
        dtype: torch.dtype = torch.bfloat16,
        int8: bool | None = None,
        int4: bool = True,
        drafter_id: str | None = None,
        draft_settings: DraftSettings | None = None,
        learn_settings: LearnSettings | None = None,
    ):
        self.catalog = catalog or ModelCatalog()
        self.dtype = dtype
        # Target linear layers in int8 (core/models/quantize.py: ~2.7x faster steps
        # here); by default for bf16, the app's type. float32 stays the exact reference.
        self.int8 = dtype == torch.bfloat16 if int8 is None else int8
        # ... and a GGUF file's Q4_K layers kept 4-bit (core/kernels/), where the kernel runs.
        self.int4 = int4
        # OMNIDRAFT_DRAFTER picks another drafter (a catalog id or a Llama model path).
        self.drafter_id = drafter_id or os.environ.get("OMNIDRAFT_DRAFTER") or SMOLLM2_ID
        self.draft_settings = draft_settings or DraftSettings()
        self.spec_options = SpecOptions()
        self.target: LoadedModel | None = None
        self.drafter_model: LoadedModel | None = None  # the drafter model as loaded (learning trains it)
        self.drafter: Drafter | None = None  # its lean runtime, which drafts
        self.bridge: VocabBridge | None = None
        self.draft_policy = DraftPolicy()  # the current target's (adaptive drafting)
        self.adapters: AdapterStore | None = None
        self.buffer: ReplayBuffer | None = None  # the current target's replay buffer
        self.learning = OnlineLearning(learn_settings or LearnSettings())
        # Bridges of recent targets: Gemma's 262k-token map takes ~3 s to build,
        # so switching back to a target reuses it.
        self._bridges: OrderedDict[tuple[str, str], VocabBridge] = OrderedDict()
        # Benchmark evaluation: no recording, and the n-gram cache forgets each
        # turn afterwards, so no evaluation prompt teaches the next one.
        self.evaluating = False
        self.warnings: list[str] = []
        self.target_state = TargetState(self.warnings)
        self.baseline = SpeedBaseline()  # what each reply's speedup is estimated against
        # The user's context length (Settings), 0 for the model's own; the model's
        # window (context_window) bounds it either way.
        self.context_tokens = 0
        self._window: tuple[LoadedModel, int] | None = None  # the loaded target's, measured once

    @property
    def learn_settings(self) -> LearnSettings:
        return self.learning.settings

    @property
    def plain_step_seconds(self) -> float | None:
        """Seconds a token of the target's plain decoding past the prompt read, measured here."""
        return self.baseline.step_seconds

    @plain_step_seconds.setter
    def plain_step_seconds(self, seconds: float | None) -> None:
        self.baseline.step_seconds = seconds

    @property
    def plain_step_due(self) -> bool:
        """A drafted reply asks refresh_plain_step to time plain steps again in idle time."""
        return self.baseline.due

    @plain_step_due.setter
    def plain_step_due(self, due: bool) -> None:
        self.baseline.due = due

    @property
    def baseline_tokens_per_s(self) -> float | None:
        """The target's plain decoding speed here past the prompt read (tokens/s)."""
        return self.baseline.tokens_per_s

    @property
    def drafter_description(self) -> str | None:
        return self.drafter.description if self.drafter else None

    # ------------------------------------------------------------------ models
    def load_target(
        self, id_or_path: str, progress: Progress = no_progress, measure_baseline: bool = True,
        should_stop: ShouldStop = never,
    ) -> ModelEntry:
        """Load a target (the previous one stays if this fails, or if should_stop()
        stops the load at a layer boundary: LoadCancelled) and measure its plain
        speed here, the reference every reply's speedup is reported against."""
        entry = self.catalog.get(id_or_path)
        try:
            loaded = load(entry, self.dtype, progress, int8=self.int8, int4=self.int4, should_stop=should_stop)
        except LoadCancelled:
            raise
        except Exception as exc:  # every failure of a load becomes a sentence
            raise ModelError(load_failure(entry, exc)) from exc
        if should_stop():  # superseded while its last layers loaded: the old target stays
            raise LoadCancelled(entry.name)
        self._save_state()
        self.target = loaded  # replaced only once the new one loaded: a failure keeps the old
        self.learning.unbind_targets()
        self.plain_step_seconds = None
        self.bridge = None
        self.draft_policy = DraftPolicy()
        try:
            self._ensure_drafter(progress)
            self.bridge = self._bridge_for(entry, loaded.tokenizer)
            self.bridge.cache = self.target_state.ngram_cache(entry.id, self.state_dir(entry.id))
            self.draft_policy = self.target_state.draft_policy(entry.id, self.state_dir(entry.id))
            self._load_learned(entry.id, progress)
        except ModelError as exc:  # the app still works, without speculation
            self.warnings.append(f"Drafting is off: {exc}")
        if measure_baseline:
            progress(f"Measuring {entry.name}'s plain speed", 0.99)
            self.measure_baseline()
        progress(f"{entry.name} ready", 1.0)
        return entry

    def _ensure_drafter(self, progress: Progress) -> None:
        if self.drafter is not None:
            return
        progress("Loading the drafter", 0.97)
        entry = self.catalog.get(self.drafter_id)
        # Drafting runs the drafter's own 4-bit (or int8) copy, whatever the target's
        # dtype; this HF copy is what learning trains, in the dtype this CPU trains fastest.
        self.drafter_model = load(entry, training_dtype())
        if self.drafter_model.model.config.model_type != "llama":
            raise ModelError("the drafter must be a Llama-architecture model")
        self.drafter = Drafter(self.drafter_model, self.draft_settings)
        root = paths.data_dir() / "adapters" / entry.id
        self.adapters = AdapterStore(root, self.drafter_model.model, rank=self.learn_settings.rank)

    def _bridge_for(self, entry: ModelEntry, tokenizer) -> VocabBridge:
        key = (entry.id, str(entry.path))
        bridge = self._bridges.pop(key, None) or VocabBridge(self.drafter_model.tokenizer, tokenizer)
        self._bridges[key] = bridge
        while len(self._bridges) > MAX_CACHED_BRIDGES:
            self._bridges.popitem(last=False)
        return bridge

    def state_dir(self, target_id: str):
        """The folder of what the drafter learned for a target (core/learning/target_state.py)."""
        return state_folder(self.drafter_model.entry.id if self.drafter_model else self.drafter_id, target_id)

    def _load_learned(self, target_id: str, progress: Progress) -> None:
        """This target's replay buffer, and its adapter merged into the drafter."""
        self.buffer = self.target_state.replay_buffer(self.state_dir(target_id), self.learn_settings.buffer_size)
        weights = None
        if self.adapters.has_saved(target_id) or self.adapters.is_loaded(target_id):
            progress("Loading what the drafter learned for this model", 0.98)
            weights = self.adapters.low_rank_state(target_id)
        self.drafter.head = self._head(target_id)
        self.target_state.take_adapter_warnings(self.adapters)
        self.drafter.load_adapter(weights)
        self.learning.drafter_stale = False

    def _head(self, target_id: str) -> AcceptanceHead:
        width = self.drafter_model.model.config.hidden_size
        return self.target_state.head(target_id, self.adapters, width)

    def _save_state(self) -> None:
        if self.target is not None and self.bridge is not None:
            target_id = self.target.entry.id
            self.target_state.save(target_id, self.state_dir(target_id), self.bridge.cache, self.draft_policy)

    def _loaded_target(self) -> LoadedModel:
        if self.target is None:
            raise InputError("No model is loaded yet.")
        return self.target

    # ------------------------------------------------------------------ input
    def encode(self, messages: list[dict]) -> EncodedChat:
        """The conversation as the target reads it, the oldest turns left out where
        it outgrows the context (fit_conversation); InputError when it cannot fit."""
        target = self._loaded_target()
        limit = self.context_limit()
        return fit_conversation(messages, target.tokenizer, target.entry.chat_format, limit, target.entry.name)

    def describe_target(self) -> ModelInfo:
        """What the loaded target is and how the drafter's vocabulary maps onto it."""
        target = self._loaded_target()
        drafting = self.drafter_model is not None and self.bridge is not None
        return describe(target, self.context_limit(), self.drafter_model if drafting else None, self.bridge)

    def context_window(self) -> int:
        """The most tokens (conversation and reply) the target reads here: its own
        window, up to what the memory free when it loaded holds of KV cache (model_window)."""
        target = self._loaded_target()
        if self._window is None or self._window[0] is not target:
            # Measured once, with the target's weights in memory: its figure stays put.
            self._window = (target, model_window(target.model.config, psutil.virtual_memory().available))
        return self._window[1]

    def model_context(self) -> int:
        """The most tokens the target reads by its own design (its config)."""
        return own_window(self._loaded_target().model.config)

    def context_limit(self, reserve: int = 512) -> int:
        """The most tokens of a conversation the target reads, `reserve` kept for the reply."""
        return conversation_limit(self.context_window(), self.context_tokens, reserve)

    # ------------------------------------------------------------------ decoding
    def chat(
        self, messages: list[dict], cfg: GenerationConfig, should_stop: ShouldStop = never,
        speculative: bool = True,
    ) -> Iterator[TokenChunk | TurnFinished]:
        encoded = self.encode(messages)
        prefix = None
        if speculative and self.drafter is not None:
            # The drafter reads what the target reads (the same kept messages), in
            # its own chat format.
            prefix = encode_chat(self.drafter_model.tokenizer, encoded.messages, "template")
        yield from self._run(encoded.ids, prefix, cfg, should_stop, speculative, encoded.omitted)

    def complete(
        self, prompt: str, cfg: GenerationConfig, should_stop: ShouldStop = never, speculative: bool = False
    ) -> Iterator[TokenChunk | TurnFinished]:
        """Raw completion of a text prompt (the benchmark's prompts)."""
        target = self._loaded_target()
        ids = target.tokenizer(prompt, split_special_tokens=True)["input_ids"]
        if len(ids) > (limit := self.context_limit()):  # a raw text has no older turns to leave out
            raise InputError(f"The prompt is {len(ids):,} tokens; {target.entry.name} reads at most "
                             f"{limit:,} here, with room kept for the reply.")
        prefix = None
        if speculative and self.drafter is not None:
            prefix = self.drafter_model.tokenizer(prompt, split_special_tokens=True)["input_ids"]
        yield from self._run(ids, prefix, cfg, should_stop, speculative)

    def _run(
        self, ids: list[int], drafter_prefix: list[int] | None, cfg: GenerationConfig, should_stop: ShouldStop,
        speculative: bool, omitted: int = 0,
    ) -> Iterator[TokenChunk | TurnFinished]:
        t = self._loaded_target()
        stops = stop_token_ids(t.tokenizer, t.model)
        if speculative and self.drafter is not None and self.bridge is not None:
            if self.bridge.same_vocab:
                drafter_prefix = ids
            # Its tokenizer may need more tokens than the target's for the same text.
            drafter_prefix = self.drafter.fit_prefix(drafter_prefix, cfg.max_new_tokens + self.draft_settings.k)
            events = generate_speculative(
                t.runner, t.tokenizer, self.drafter, self.bridge, ids, drafter_prefix,
                cfg, stops, self.spec_options, should_stop, self.draft_policy, learn_policy=not self.evaluating,
            )
        else:
            events = generate_plain(t.runner, t.tokenizer, ids, cfg, stops, should_stop)
        saved = OrderedDict(self.bridge.cache.entries) if self.evaluating and self.bridge else None
        try:
            for event in events:
                if isinstance(event, TurnFinished):
                    event.omitted_messages = omitted
                    self._after_turn(event)
                    if event.stats.method == "omnidraft" and not self.evaluating:
                        self._record(ids, drafter_prefix, event, cfg.temperature)
                yield event
        finally:
            if saved is not None:
                self.bridge.cache.entries = saved

    def _after_turn(self, done: TurnFinished) -> None:
        self.baseline.account(done.stats)
        if done.stats.method == "omnidraft" and not self.evaluating:
            self.plain_step_due = True
            self._save_state()

    def _record(self, ids: list[int], drafter_prefix: list[int], done: TurnFinished, temperature: float) -> None:
        """Keep the turn for distillation (the user's own traffic, encrypted at rest)."""
        if not self.learn_settings.enabled or self.buffer is None or len(done.token_ids) < 4:
            return
        self.buffer.add(self.sample_of(ids, drafter_prefix, done, temperature))
        self.buffer.save()

    def sample_of(self, ids: list[int], drafter_prefix: list[int], done: TurnFinished,
                  temperature: float = 0.0) -> Sample:
        """A finished turn as a replay sample (turn_sample)."""
        return turn_sample(ids, drafter_prefix, done, self.bridge, self.drafter_model.tokenizer, temperature,
                           self.draft_settings.draw_drafts)

    # ------------------------------------------------------------------ learning
    def learner(self) -> Learner:
        """The current target's learner (its optimizer state outlives a switch away
        and back), bound to the target, bridge and buffer loaded now."""
        head = self._head(self.target.entry.id)
        learner = self.learning.learner(
            self.target, self.drafter_model, self.bridge, self.buffer, self.adapters, head
        )
        self.target_state.take_adapter_warnings(self.adapters)
        return learner

    def has_learning_work(self) -> bool:
        target_id = self.target.entry.id if self.target is not None else None
        return self.learning.has_work(target_id, self.buffer)

    def idle_step(self, should_stop: ShouldStop = never) -> LearningStatus | None:
        """One batch of online distillation for the current target; returns at the
        next layer boundary once should_stop() says a request is waiting."""
        if self.target is None or self.drafter is None or not self.has_learning_work():
            return None
        learner = self.learner()
        try:
            return self.learning.step(learner, self.drafter, self.adapters, should_stop)
        finally:  # a save that failed (a full disk) reaches the person
            self.warnings.extend(learner.warnings)
            learner.warnings.clear()

    # ------------------------------------------------------------------ plain speed
    def measure_baseline(self, should_stop: ShouldStop = never) -> float | None:
        """Time the target's plain decoding steps here (the reference for speedups):
        sets plain_step_seconds, returns baseline_tokens_per_s."""
        self.baseline.measure(self.complete, self.forget_context, should_stop)
        return self.baseline_tokens_per_s

    def refresh_plain_step(self, should_stop: ShouldStop = never) -> None:
        """Time a few plain steps where the last reply left the target's cache, then
        put the cache back (SpeedBaseline.refresh); gives way to should_stop()."""
        cache = self.target.runner.cache if self.target is not None else None
        self.baseline.refresh(cache, self.context_window, should_stop)

    def forget_context(self) -> None:
        """Nothing kept from earlier replies: the next prompt is read from its start
        (by default a reply reads only past what it shares with the previous one)."""
        if self.target is not None:
            self.target.runner.forget()
        if self.drafter is not None:
            self.drafter.forget_context()

    def reset_personalization(self, model_id: str) -> None:
        """Forget what was learned for one target: its n-gram cache (and adapter and
        replay buffer, which live in the same folder)."""
        self.target_state.forget(model_id, self.state_dir(model_id))
        self.learning.forget(model_id)
        if self.adapters is not None:
            self.adapters.reset(model_id)
        if self.target is not None and self.target.entry.id == model_id and self.bridge is not None:
            self.bridge.cache = NgramCache(self.bridge.cache.max_entries)
            self.draft_policy = DraftPolicy()
            self.buffer.clear()
            self.drafter.load_adapter(None)
            self.drafter.head = self._head(model_id)
            self.learning.drafter_stale = False

    # ------------------------------------------------------------------ settings
    def apply_settings(self, settings) -> None:
        """Settings from the GUI (core.settings.Settings)."""
        self.draft_settings.k = int(getattr(settings, "draft_length", self.draft_settings.k))
        self.draft_settings.gamma = getattr(settings, "adaptive_gamma", None)
        # γ chosen: the paper's stop rule decides; else drafting is priced by this
        # machine's measured costs (DraftPrices), k the most it drafts.
        self.draft_settings.priced = self.draft_settings.gamma is None
        self.learning.set_threads(int(getattr(settings, "learner_threads", self.learn_settings.threads)))
        self.context_tokens = int(getattr(settings, "context_tokens", 0))

    def use_draft_settings(self, settings: DraftSettings) -> None:
        """Draft with other settings from now on (layers, int8 weights, k, stop rules;
        `git show 524cea4:scripts/drafter_sweep.py` tried candidates so): the drafting
        runtime is rebuilt with them and gets what was learned for the current target."""
        self.draft_settings = settings
        if self.drafter_model is None:
            return
        self.drafter = Drafter(self.drafter_model, settings)
        if self.target is not None:
            target_id = self.target.entry.id
            self.drafter.head = self._head(target_id)
            if self.adapters.has_saved(target_id) or self.adapters.is_loaded(target_id):
                self.drafter.load_adapter(self.adapters.low_rank_state(target_id))


# LearnSettings is Engine's argument; InputError what it raises (bench/, tools/ import both from here).
__all__ = ["Engine", "GenerationConfig", "InputError", "LearnSettings", "ModelError"]
