"""Typed messages between the GUI process and the engine worker process.

Requests flow GUI -> worker, events worker -> GUI. All are plain dataclasses
(picklable across the multiprocessing "spawn" boundary) so both sides can
match on type and a type checker sees every field.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# ----------------------------------------------------------------- requests


@dataclass
class ChatRequest:
    request_id: int
    messages: list[dict]  # [{"role": "user"|"assistant"|"system", "content": str}, ...]
    max_new_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    speculative: bool = True  # False = plain target decoding


@dataclass
class CancelRequest:
    request_id: int


@dataclass
class SwitchTarget:
    model_id: str  # catalog id or a path


@dataclass
class AddModel:
    path: str


@dataclass
class LearnNow:
    pass


@dataclass
class PauseLearning:
    paused: bool


@dataclass
class ResetPersonalization:
    model_id: str


@dataclass
class UpdateSettings:
    settings: dict  # keys of core.settings.Settings


@dataclass
class Shutdown:
    pass


Request = (
    ChatRequest
    | CancelRequest
    | SwitchTarget
    | AddModel
    | LearnNow
    | PauseLearning
    | ResetPersonalization
    | UpdateSettings
    | Shutdown
)

# ----------------------------------------------------------------- events


@dataclass
class WorkerReady:
    pid: int
    catalog: list[dict]  # ModelEntry as dicts


@dataclass
class CatalogChanged:
    catalog: list[dict]
    added_id: str | None = None


@dataclass
class ModelLoading:
    model_id: str
    stage: str
    fraction: float


@dataclass
class ModelLoaded:
    model_id: str
    name: str
    load_seconds: float
    drafter: str | None  # description of the drafter in use, None when plain only


@dataclass
class TokenBatch:
    """Text streamed since the last batch (~30 ms of tokens)."""

    request_id: int
    pieces: list[tuple[str, bool]]  # (text, came from accepted drafts)


@dataclass
class TurnDone:
    request_id: int
    text: str
    reason: str  # "eos", "stop", "length", "cancelled", "error"
    stats: dict  # TurnStats.as_dict()
    model_id: str
    baseline_tokens_per_s: float | None  # the target's plain speed measured here
    omitted_messages: int = 0  # oldest messages left out to fit the context (TurnFinished)


@dataclass
class LearningProgress:
    model_id: str
    state: str  # "running", "paused", "waiting", "idle"
    steps: int = 0
    samples: int = 0
    loss: float | None = None
    acceptance: float | None = None
    buffered: int = 0


@dataclass
class ErrorEvent:
    message: str  # shown to the user as is
    request_id: int | None = None
    detail: str = ""  # traceback or technical detail, for a "details" expander / log


@dataclass
class Notice:
    """Something the user should know that is not an error (e.g. key-file fallback)."""

    message: str
    extra: dict = field(default_factory=dict)


Event = (
    WorkerReady
    | CatalogChanged
    | ModelLoading
    | ModelLoaded
    | TokenBatch
    | TurnDone
    | LearningProgress
    | ErrorEvent
    | Notice
)
