"""The engine facade the worker drives: one target, the shared drafter, and chat.

Qt-free and process-agnostic: the worker process owns one Engine; tests and
the benchmark use it directly.
"""

from __future__ import annotations

import itertools
import os
import shutil
import statistics
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .decoding.adaptive_drafting import DraftPolicy
from .decoding.drafter import Drafter, DraftSettings
from .decoding.plain import generate_plain
from .decoding.sampling import GenerationConfig
from .decoding.speculative import SpecOptions, generate_speculative
from .decoding.vocab_bridge import NgramCache, VocabBridge
from .events import TokenChunk, TurnFinished
from .learning.acceptance_head import AcceptanceHead
from .learning.adapters import AdapterStore
from .learning.learner import Learner, LearningStatus, training_dtype
from .learning.replay_buffer import ReplayBuffer, Sample
from .models.catalog import SMOLLM2_ID, ModelCatalog, ModelEntry, ModelError
from .models.chat_format import encode_chat, stop_token_ids
from .models.loader import LoadedModel, Progress, load, no_progress
from .models.model_info import ModelInfo, describe
from .stopping import ShouldStop, never
from .storage import paths
from .storage.persistence import CorruptStateError
from .storage.secure_store import KeyUnavailableError

MAX_MESSAGE_CHARS = 200_000
BASELINE_PROMPT = "Here is a short story about a lighthouse keeper and the sea.\n\n"
BASELINE_TOKENS = 24
BASELINE_RUNS = 2
PLAIN_PROBE_STEPS = 8  # plain steps timed in idle time after a drafted reply (~0.2 s)
MAX_CACHED_BRIDGES = 3
# Learned per-target state files (encrypted), and where versions before encryption
# kept them as plaintext JSON (migrated on first load).
NGRAM_FILE, NGRAM_LEGACY = "ngram_cache.bin", "ngram_cache.json"
POLICY_FILE, POLICY_LEGACY = "draft_policy.bin", "draft_policy.json"


class InputError(Exception):
    """A request the engine refuses; str(error) is shown to the user."""


@dataclass
class EncodedChat:
    """A conversation as the target reads it."""

    ids: list[int]  # the target's token ids of `messages`
    messages: list[dict]  # the messages kept: the system message, then the latest turns
    omitted: int = 0  # the oldest messages left out to fit the context window


def _turn_starts(turns: list[dict]) -> list[int]:
    """Where the kept part of a conversation (without its system message) may
    begin, earliest first: at a user message, so no reply is kept without what it
    answers; after any message over MAX_MESSAGE_CHARS (one refused before, never
    read whole again); at the last message at the latest."""
    last = len(turns) - 1
    floor = max((i + 1 for i in range(last) if len(turns[i].get("content", "")) > MAX_MESSAGE_CHARS), default=0)
    return [i for i in range(floor, last) if turns[i].get("role") == "user"] + [last]


@dataclass
class LearnSettings:
    """Online distillation (docs/method.md §2): the paper's settings except lr and
    the replay of learned turns, chosen by scripts/learning_sweep.py
    (docs/learning.md): lr 5e-4; three learned turns replayed per new one taught
    the default target's drafter as much as four epochs over all turns, where
    four passes over each batch back to back taught less."""

    enabled: bool = True
    lr: float = 5e-4
    weight_decay: float = 0.01
    batch_size: int = 8
    lam: float = 0.2  # weight of the n-gram NLL against the reverse KL
    rank: int = 32
    threads: int = 1  # the learner leaves a core to the GUI
    reviews: int = 3  # learned turns replayed per new turn (core/learning/learner.py)
    buffer_size: int = 256


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
        # ... and a GGUF file's Q4_K layers kept 4-bit (core/models/int4.py), where the kernel runs.
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
        self.learn_settings = learn_settings or LearnSettings()
        self.adapters: AdapterStore | None = None
        self.buffer: ReplayBuffer | None = None
        self._learners: dict[str, Learner] = {}
        self._heads: dict[str, AcceptanceHead] = {}  # per target, trained with its adapter
        # The drafter lacks the current target's latest learned weights (a refresh
        # was interrupted by a request).
        self._drafter_stale = False
        # Bridges of recent targets: Gemma's 262k-token map takes ~3 s to build,
        # so switching back to a target reuses it.
        self._bridges: OrderedDict[tuple[str, str], VocabBridge] = OrderedDict()
        # Benchmark evaluation: no recording, and the n-gram cache forgets each
        # turn afterwards, so no evaluation prompt teaches the next one.
        self.evaluating = False
        self.warnings: list[str] = []
        # State files encrypted with a key this machine lacks: left untouched, and
        # not overwritten this session.
        self._unsaved: set[tuple[str, str]] = set()
        # Seconds a token of the target's plain decoding past the prompt read, measured
        # here: what each reply's speedup is estimated against (TurnStats.plain_seconds);
        # None until measured.
        self.plain_step_seconds: float | None = None
        # Set by a drafted reply: refresh_plain_step times plain steps again in idle time.
        self.plain_step_due = False
        # The user's context length (Settings), 0 for the model's own; the model's
        # window (context_window) bounds it either way.
        self.context_tokens = 0

    # ------------------------------------------------------------------ models
    @property
    def baseline_tokens_per_s(self) -> float | None:
        """The target's plain decoding speed here past the prompt read (tokens/s)."""
        return 1.0 / self.plain_step_seconds if self.plain_step_seconds else None

    @property
    def drafter_description(self) -> str | None:
        return self.drafter.description if self.drafter else None

    def load_target(
        self, id_or_path: str, progress: Progress = no_progress, measure_baseline: bool = True
    ) -> ModelEntry:
        """Load a target (the previous one stays if this fails) and measure its
        plain speed here, the reference every reply's speedup is reported against."""
        entry = self.catalog.get(id_or_path)
        loaded = load(entry, self.dtype, progress, int8=self.int8, int4=self.int4)
        self._save_state()
        self.target = loaded  # replaced only once the new one loaded: a failure keeps the old
        for learner in self._learners.values():
            learner.target_model = None  # learner() rebinds it; no old model stays alive
        self.plain_step_seconds = None
        self.bridge = None
        self.draft_policy = DraftPolicy()
        try:
            self._ensure_drafter(progress)
            self.bridge = self._bridge_for(entry, loaded.tokenizer)
            self.bridge.cache = self._load_state(entry.id, NGRAM_FILE, NGRAM_LEGACY, NgramCache, "n-gram cache")
            self.draft_policy = self._load_state(
                entry.id, POLICY_FILE, POLICY_LEGACY, DraftPolicy, "drafting statistics"
            )
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
        drafter = self.drafter_model.entry.id if self.drafter_model else self.drafter_id
        return paths.data_dir() / "state" / f"{drafter}--{target_id}"

    def _load_state(self, target_id: str, name: str, legacy: str, kind, what: str):
        """kind.load(state file), or a fresh kind() with a warning when the file is
        damaged (moved aside, never deleted) or under another key (left as it is)."""
        folder = self.state_dir(target_id)
        self._unsaved.discard((target_id, name))
        try:
            return kind.load(folder / name, legacy=folder / legacy)
        except KeyUnavailableError:
            self._unsaved.add((target_id, name))
            self.warnings.append(
                f"The file of learned {what} ({name}) was encrypted with a key that is not "
                "available now; it was left untouched and is not updated this session."
            )
            return kind()
        except CorruptStateError as exc:
            kept = exc.quarantine()
            self.warnings.append(f"The file of learned {what} was damaged; it starts over (kept as {kept.name}).")
            return kind()

    def _load_learned(self, target_id: str, progress: Progress) -> None:
        """This target's replay buffer, and its adapter merged into the drafter."""
        self.buffer = ReplayBuffer.load(
            self.state_dir(target_id) / "replay.bin", self.learn_settings.buffer_size
        )
        if self.buffer.warning:
            self.warnings.append(self.buffer.warning)
        weights = None
        if self.adapters.has_saved(target_id) or self.adapters.is_loaded(target_id):
            progress("Loading what the drafter learned for this model", 0.98)
            weights = self.adapters.low_rank_state(target_id)
        self.drafter.head = self._head(target_id)
        self._take_adapter_warnings()
        self.drafter.load_adapter(weights)
        self._drafter_stale = False

    def _head(self, target_id: str) -> AcceptanceHead:
        """This target's acceptance head: the one learning in this session, else the
        one saved with its adapter, else a fresh one (which drafts as if none)."""
        if target_id not in self._heads:
            width = self.drafter_model.model.config.hidden_size
            state = self.adapters.head_state(target_id)
            head = AcceptanceHead(width)
            if state is not None:
                try:
                    head = AcceptanceHead.from_state(state, width)
                except ValueError as exc:
                    self.warnings.append(f"The acceptance head learned for {target_id} does not fit "
                                         f"this drafter ({exc}); it starts over.")
            self._heads[target_id] = head
        return self._heads[target_id]

    def _take_adapter_warnings(self) -> None:
        """The adapter store's reports (damaged files set aside) reach the user."""
        if self.adapters is not None and self.adapters.warnings:
            self.warnings.extend(self.adapters.warnings)
            self.adapters.warnings.clear()

    def _save_state(self) -> None:
        if self.target is None or self.bridge is None:
            return
        target_id = self.target.entry.id
        for name, state in ((NGRAM_FILE, self.bridge.cache), (POLICY_FILE, self.draft_policy)):
            if (target_id, name) not in self._unsaved:
                state.save(self.state_dir(target_id) / name)

    # ------------------------------------------------------------------ input
    def encode(self, messages: list[dict]) -> EncodedChat:
        """The conversation as the target reads it. When it outgrows the context
        window the oldest whole turns are left out (the system message stays), and
        everything up to a message too long to ever be read again: a refused
        over-long message stays in the history the GUI sends, and must not make
        every later turn fail. Only the last message being too long is an error."""
        if self.target is None:
            raise InputError("No model is loaded yet.")
        # A conversation ending with a reply asks to continue it (encode_chat); only a
        # new message must say something.
        if not messages or (messages[-1].get("role") != "assistant" and not messages[-1].get("content", "").strip()):
            raise InputError("The message is empty; type something first.")
        if len(messages[-1]["content"]) > MAX_MESSAGE_CHARS:
            raise InputError(
                f"The message is too long ({len(messages[-1]['content']):,} characters; "
                f"at most {MAX_MESSAGE_CHARS:,})."
            )
        tok, chat_format = self.target.tokenizer, self.target.entry.chat_format
        system = messages[:1] if len(messages) > 1 and messages[0].get("role") == "system" else []
        turns = messages[len(system):]
        starts = _turn_starts(turns)
        limit = self.context_limit()
        encoded: dict[int, list[int]] = {}  # ids of the conversation from starts[i]

        def fits(i: int) -> bool:
            encoded[i] = encode_chat(tok, system + turns[starts[i]:], chat_format)
            return len(encoded[i]) <= limit

        # Usually everything fits (one encoding); otherwise the earliest start that
        # fits, by bisection: leaving out more messages never makes the text longer.
        if fits(0):
            first = 0
        else:
            lo, hi = 1, len(starts)
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
            first = lo
        if first == len(starts):  # not even the last message alone fits (the search tried it)
            n = len(encoded[len(starts) - 1])
            what = "The system prompt and the message are" if system else "The message is"
            raise InputError(
                f"{what} too long for {self.target.entry.name}: {n:,} tokens, "
                f"and it reads at most {limit:,}."
            )
        start = starts[first]
        return EncodedChat(encoded[first], system + turns[start:], omitted=start)

    def describe_target(self) -> ModelInfo:
        """What the loaded target is and how the drafter's vocabulary maps onto it."""
        if self.target is None:
            raise InputError("No model is loaded yet.")
        drafting = self.drafter_model is not None and self.bridge is not None
        return describe(self.target, self.context_limit(), self.drafter_model if drafting else None, self.bridge)

    def context_window(self) -> int:
        """The most tokens (conversation and reply) the target reads here: its own
        window, at most 8,192. The drafter's preallocated context (Drafter max_len)
        should hold the same text and its reply; where it cannot, the drafter reads
        the latest part."""
        if self.target is None:
            raise InputError("No model is loaded yet.")
        window = getattr(self.target.model.config, "max_position_embeddings", 2048) or 2048
        return min(window, 8192)

    def context_limit(self, reserve: int = 512) -> int:
        """The most tokens of a conversation the target reads, `reserve` kept for the reply."""
        window = self.context_window()
        if self.context_tokens:
            window = min(window, self.context_tokens)
        return max(64, window - reserve)

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
        if self.target is None:
            raise InputError("No model is loaded yet.")
        ids = self.target.tokenizer(prompt, split_special_tokens=True)["input_ids"]
        prefix = None
        if speculative and self.drafter is not None:
            prefix = self.drafter_model.tokenizer(prompt, split_special_tokens=True)["input_ids"]
        yield from self._run(ids, prefix, cfg, should_stop, speculative)

    def _run(
        self, ids: list[int], drafter_prefix: list[int] | None, cfg: GenerationConfig, should_stop: ShouldStop,
        speculative: bool, omitted: int = 0,
    ) -> Iterator[TokenChunk | TurnFinished]:
        if self.target is None:
            raise InputError("No model is loaded yet.")
        t = self.target
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
        stats = done.stats
        if stats.method == "target" and stats.new_tokens >= 8:
            self._fold_plain_step((stats.seconds - stats.first_token_seconds) / (stats.new_tokens - 1), 0.3)
        if stats.method == "target":
            stats.plain_seconds = stats.seconds
        elif self.plain_step_seconds is not None and stats.new_tokens:
            # Plain decoding reads the same prompt (the same part of it, with the same
            # cache) and then takes a step a token: only what follows the first token differs.
            stats.plain_seconds = stats.first_token_seconds + (stats.new_tokens - 1) * self.plain_step_seconds
        if stats.method == "omnidraft" and not self.evaluating:
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
        """A finished turn as a replay sample: prompt + reply in both vocabularies
        (the drafter's reply is its own tokenization of the reply's text)."""
        reply = done.token_ids
        if self.bridge.same_vocab:
            drafter_reply = list(reply)
        else:
            text = self.bridge.target_text(reply)
            drafter_reply = self.drafter_model.tokenizer(text, add_special_tokens=False)["input_ids"]
        return Sample(
            target_ids=list(ids) + list(reply), target_prompt_len=len(ids),
            drafter_ids=list(drafter_prefix) + drafter_reply, drafter_prompt_len=len(drafter_prefix),
            proposed=done.stats.proposed, accepted=done.stats.accepted, temperature=temperature,
            drawn=temperature > 0 and self.draft_settings.draw_drafts,
        )

    def learner(self) -> Learner:
        """The current target's learner (its optimizer state outlives a switch away
        and back), bound to the target, bridge and buffer loaded now."""
        target_id = self.target.entry.id
        if target_id not in self._learners:
            ls = self.learn_settings
            self._learners[target_id] = Learner(
                self.drafter_model.model, self.target.model, self.bridge, self.buffer, self.adapters,
                target_id, lr=ls.lr, weight_decay=ls.weight_decay, batch_size=ls.batch_size,
                lam=ls.lam, threads=ls.threads, reviews=ls.reviews, head=self._head(target_id),
            )
        learner = self._learners[target_id]
        learner.target_model, learner.bridge, learner.buffer = self.target.model, self.bridge, self.buffer
        self._take_adapter_warnings()
        return learner

    def has_learning_work(self) -> bool:
        return bool(self.learn_settings.enabled and self.buffer is not None
                    and (self._learning_left() or self._drafter_stale))

    def _learning_left(self) -> int:
        """Samples the current target's learner has to train before it rests."""
        learner = self._learners.get(self.target.entry.id) if self.target is not None else None
        if learner is None or learner.buffer is not self.buffer:  # its round was of another buffer
            return len(self.buffer.new_samples())
        return learner.work_left()

    def _refresh_drafter(self, should_stop: ShouldStop) -> bool:
        """Merge the current target's adapter into the drafting weights (~1 s on
        one core), giving way to a request between layers: the reply then drafts
        with the previous weights and the next idle step finishes the refresh."""
        weights = self.adapters.low_rank_state(self.target.entry.id, should_stop)
        if weights is None or not self.drafter.load_adapter(weights, should_stop):
            return False
        self._drafter_stale = False
        return True

    def idle_step(self, should_stop: ShouldStop = never) -> LearningStatus | None:
        """One batch of online distillation for the current target; returns at the
        next layer boundary once should_stop() says a request is waiting."""
        if self.target is None or self.drafter is None or not self.has_learning_work():
            return None
        target_id = self.target.entry.id
        learner = self.learner()
        if self._drafter_stale and not self._refresh_drafter(should_stop):
            return LearningStatus(target_id, "waiting", learner.steps, learner.samples,
                                  buffered=learner.work_left())
        out = learner.step(should_stop) if learner.work_left() else None
        if out is None:  # nothing (left) to train on
            return LearningStatus(target_id, "idle", learner.steps, learner.samples, buffered=0)
        if out["interrupted"]:
            return LearningStatus(target_id, "waiting", out["steps"], out["samples"], buffered=out["buffered"])
        if out["pass_done"]:  # what was learned starts drafting now
            self._drafter_stale = True
            self._refresh_drafter(should_stop)
        return LearningStatus(
            target_id, "running", out["steps"], out["samples"], out.get("loss"),
            out.get("acceptance_estimate"), out["buffered"],
        )

    def measure_baseline(self, should_stop: ShouldStop = never) -> float | None:
        """Time the target's plain decoding steps here (the reference for speedups):
        sets plain_step_seconds, returns baseline_tokens_per_s."""
        # Untimed first: a freshly loaded model's first forwards fault its weights in
        # from the mapped file (a 1.5B model measured 1.07 tokens/s cold against 3.5
        # warm). Under 8 tokens, _after_turn leaves this turn out of the baseline.
        for _ in self.complete(BASELINE_PROMPT, GenerationConfig(max_new_tokens=4), should_stop):
            pass
        # A step's median in each run, the faster run's: right after a load a whole run
        # can read ~40% slow (measured on the EPYC: 36.5 ms a step, then 24-25).
        steps = []
        for _ in range(BASELINE_RUNS):
            self.forget_context()
            stamps = [time.perf_counter() for event in self.complete(
                BASELINE_PROMPT, GenerationConfig(max_new_tokens=BASELINE_TOKENS), should_stop)
                if isinstance(event, TokenChunk)]
            if len(stamps) >= 4:
                steps.append(statistics.median(b - a for a, b in itertools.pairwise(stamps)))
        if steps:
            self.plain_step_seconds = min(steps)
        return self.baseline_tokens_per_s

    def refresh_plain_step(self, should_stop: ShouldStop = never) -> None:
        """Time a few plain steps where the last reply left the target's cache, then
        put the cache back: the speedup's reference follows this machine's speed now
        (other programs, heat, a conversation's length) and the next turn still reads
        only what is new. Between steps it gives way to should_stop()."""
        self.plain_step_due = False
        cache = self.target.runner.cache if self.target is not None else None
        if cache is None or not cache.length or cache.length + PLAIN_PROBE_STEPS > self.context_window():
            return
        start, token, steps = cache.length, cache.ids[-1], []
        try:
            for _ in range(PLAIN_PROBE_STEPS):
                if should_stop():
                    break
                t0 = time.perf_counter()
                token = int(cache.forward([token], 1)[0][-1].argmax())  # as a plain step picks
                steps.append(time.perf_counter() - t0)
        finally:
            cache.rollback(start)
        if len(steps) >= PLAIN_PROBE_STEPS // 2:
            self._fold_plain_step(statistics.median(steps), 0.5)

    def _fold_plain_step(self, step: float, weight: float) -> None:
        """A new timing of the plain step, given `weight` beside what was measured before."""
        old = self.plain_step_seconds
        self.plain_step_seconds = step if old is None else (1 - weight) * old + weight * step

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
        shutil.rmtree(self.state_dir(model_id), ignore_errors=True)
        self._learners.pop(model_id, None)
        self._heads.pop(model_id, None)
        self._unsaved = {k for k in self._unsaved if k[0] != model_id}
        if self.adapters is not None:
            self.adapters.reset(model_id)
        if self.target is not None and self.target.entry.id == model_id and self.bridge is not None:
            self.bridge.cache = NgramCache(self.bridge.cache.max_entries)
            self.draft_policy = DraftPolicy()
            self.buffer.clear()
            self.drafter.load_adapter(None)
            self.drafter.head = self._head(model_id)
            self._drafter_stale = False

    # ------------------------------------------------------------------ settings
    def apply_settings(self, settings) -> None:
        """Settings from the GUI (core.settings.Settings)."""
        self.draft_settings.k = int(getattr(settings, "draft_length", self.draft_settings.k))
        self.draft_settings.gamma = getattr(settings, "adaptive_gamma", None)
        threads = int(getattr(settings, "learner_threads", self.learn_settings.threads))
        self.learn_settings.threads = threads
        self.context_tokens = int(getattr(settings, "context_tokens", 0))
        for learner in self._learners.values():
            learner.threads = threads

    def use_draft_settings(self, settings: DraftSettings) -> None:
        """Draft with other settings from now on (layers, int8 weights, k, stop rules;
        scripts/drafter_sweep.py tries candidates so): the drafting runtime is rebuilt
        with them and gets what was learned for the current target."""
        self.draft_settings = settings
        if self.drafter_model is None:
            return
        self.drafter = Drafter(self.drafter_model, settings)
        if self.target is not None:
            target_id = self.target.entry.id
            self.drafter.head = self._head(target_id)
            if self.adapters.has_saved(target_id) or self.adapters.is_loaded(target_id):
                self.drafter.load_adapter(self.adapters.low_rank_state(target_id))


__all__ = ["EncodedChat", "Engine", "GenerationConfig", "InputError", "ModelError"]
