"""What the worker and the benchmark need of an engine, declared once.

core.engine.Engine implements it; test doubles implement it too (usually by
subclassing Engine), with the same signatures. The worker and the bench call
these members directly instead of probing for them, so renaming a parameter here
(e.g. idle_step's should_stop, through which learning gives way to a request)
breaks loudly in tests rather than silently at run time.

Only names are imported at type-checking time: the GUI process imports the
worker module, and torch must stay out of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .decoding.sampling import GenerationConfig
    from .events import TokenChunk, TurnFinished
    from .learning.learner import LearningStatus
    from .models.catalog import ModelCatalog, ModelEntry
    from .models.loader import LoadedModel, Progress
    from .models.model_info import ModelInfo
    from .stopping import ShouldStop
    from .storage.settings import Settings


class EngineAPI(Protocol):
    catalog: ModelCatalog
    target: LoadedModel | None  # None until a target loaded
    drafter_model: LoadedModel | None  # the drafter model as loaded; None while drafting is off
    # The target's plain-decoding speed measured here past the prompt read (tokens/s),
    # None until measured; each reply's speedup is TurnStats.speedup.
    baseline_tokens_per_s: float | None
    plain_step_due: bool  # refresh_plain_step has a drafted reply to follow
    warnings: list[str]  # why drafting is off, for people
    evaluating: bool  # benchmark evaluation: decoding teaches the engine nothing

    @property
    def drafter_description(self) -> str | None: ...

    def load_target(
        self, id_or_path: str, progress: Progress = ..., measure_baseline: bool = True,
        should_stop: ShouldStop = ...,
    ) -> ModelEntry:
        """Load a target; on failure (ModelError), or when should_stop() stops it between
        layers (LoadCancelled), the previous one stays loaded."""
        ...

    def chat(
        self, messages: list[dict], cfg: GenerationConfig, should_stop: ShouldStop = ...,
        speculative: bool = True,
    ) -> Iterator[TokenChunk | TurnFinished]:
        """A reply to a conversation; checks should_stop() between decoding steps."""
        ...

    def complete(
        self, prompt: str, cfg: GenerationConfig, should_stop: ShouldStop = ..., speculative: bool = False
    ) -> Iterator[TokenChunk | TurnFinished]:
        """A raw completion of a text prompt (the benchmark's prompts)."""
        ...

    def idle_step(self, should_stop: ShouldStop = ...) -> LearningStatus | None:
        """One short unit of learning, returning early once should_stop() is true;
        None, or a state other than "running", when there is nothing (left) to do."""
        ...

    def refresh_plain_step(self, should_stop: ShouldStop = ...) -> None:
        """Time plain steps again in idle time (the speedup's reference), keeping
        the target's cache as the last reply left it."""
        ...

    def describe_target(self) -> ModelInfo:
        """The loaded target (Model info…); InputError when none is loaded."""
        ...

    def context_window(self) -> int:
        """The most tokens the loaded target reads here (the context setting's bound)."""
        ...

    def model_context(self) -> int:
        """The most tokens the loaded target reads by its own design."""
        ...

    def reset_personalization(self, model_id: str) -> None: ...

    def apply_settings(self, settings: Settings) -> None: ...
