"""Typed messages between the GUI process and the engine worker process.

Requests flow GUI -> worker, events worker -> GUI. All are plain dataclasses
(picklable across the multiprocessing "spawn" boundary, the catalog's ModelEntry,
the engine's TurnStats and ModelInfo included) so both sides can match on type and a type
checker sees every field.

Every request carries a request_id chosen by its sender (WorkerHandle.next_id:
increasing, never reused while the GUI runs); every event that answers a request
echoes it, and events tied to no request (e.g. a learning step that failed) carry
None. The GUI matches answers by id, never by arrival order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..events import TurnStats
from ..models.catalog import ModelEntry
from ..models.model_info import ModelInfo

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
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # 1 = off
    # A raw text to continue instead of `messages` (the server's /v1/completions).
    prompt: str | None = None
    stop: tuple[str, ...] = ()  # the reply ends before the first of these texts
    # False: the turn teaches the engine nothing (no replay sample, no n-gram entries);
    # the server's turns unless learning from API traffic is on.
    learn: bool = True


@dataclass
class CancelRequest:
    # The id of the ChatRequest to stop (its TurnDone, reason "cancelled", answers) or of
    # the SwitchTarget whose load to stop (LoadStopped answers).
    request_id: int


@dataclass
class SwitchTarget:
    request_id: int
    model_id: str  # catalog id or a path


@dataclass
class AddModel:
    request_id: int
    path: str


@dataclass
class RemoveModel:
    """Take a model the user added off the Targets menu (its files stay); CatalogChanged answers."""

    request_id: int
    model_id: str


@dataclass
class LearnNow:
    request_id: int


@dataclass
class PauseLearning:
    request_id: int
    paused: bool


@dataclass
class ResetPersonalization:
    request_id: int
    model_id: str


@dataclass
class UpdateSettings:
    request_id: int
    settings: dict  # keys of core.storage.settings.Settings


@dataclass
class DescribeTarget:
    """Model info…: what the loaded target is; TargetDescribed answers."""

    request_id: int


@dataclass
class CountTokens:
    """Files for a message: how many of the loaded target's tokens each text is;
    TokensCounted answers (ErrorEvent when no model is loaded)."""

    request_id: int
    texts: list[str]


@dataclass
class Shutdown:
    request_id: int


Request = (
    ChatRequest
    | CancelRequest
    | SwitchTarget
    | AddModel
    | RemoveModel
    | LearnNow
    | PauseLearning
    | ResetPersonalization
    | UpdateSettings
    | DescribeTarget
    | CountTokens
    | Shutdown
)

# ----------------------------------------------------------------- events


@dataclass
class WorkerReady:
    pid: int
    catalog: list[ModelEntry]


@dataclass
class CatalogChanged:
    request_id: int  # the AddModel that changed it
    catalog: list[ModelEntry]
    added_id: str | None = None


@dataclass
class ModelLoading:
    request_id: int  # the SwitchTarget being served
    model_id: str
    stage: str
    fraction: float


@dataclass
class ModelLoaded:
    request_id: int  # the SwitchTarget it answers
    model_id: str
    name: str
    load_seconds: float
    drafter: str | None  # description of the drafter in use, None when plain only
    context_window: int = 0  # the most tokens it reads here: what the context setting can go up to
    model_context: int = 0  # the most it reads by its own design (memory here may allow less)


@dataclass
class LoadStopped:
    """A SwitchTarget that was not served: a later SwitchTarget superseded it
    ("superseded"), or a CancelRequest with its id stopped it ("cancelled"). The
    model loaded before it stays loaded."""

    request_id: int  # the SwitchTarget it answers
    model_id: str
    reason: str  # "superseded" or "cancelled"


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
    stats: TurnStats | None  # None when nothing was decoded (failed, or cancelled while queued)
    model_id: str
    baseline_tokens_per_s: float | None  # the target's plain speed measured here, past the prompt read
    omitted_messages: int = 0  # oldest messages left out to fit the context (TurnFinished)


@dataclass
class LearningProgress:
    model_id: str
    state: str  # "running", "paused", "waiting", "idle", or power.BATTERY_STATUS
    steps: int = 0
    samples: int = 0
    loss: float | None = None
    acceptance: float | None = None
    buffered: int = 0  # samples to train before the learner rests
    # The PauseLearning/LearnNow it answers; None for the idle steps' own reports.
    request_id: int | None = None


@dataclass
class TargetDescribed:
    request_id: int  # the DescribeTarget it answers
    info: ModelInfo


@dataclass
class TokensCounted:
    request_id: int  # the CountTokens it answers
    counts: list[int]  # per text, in the target's tokens
    limit: int  # the most tokens of a conversation the target reads now (context less the reply's share)


@dataclass
class ErrorEvent:
    request_id: int | None  # the failed request; None when tied to none
    message: str  # shown to the user as is
    detail: str = ""  # traceback or technical detail, for a "details" expander / log


@dataclass
class Notice:
    """Something the user should know that is not an error (e.g. key-file fallback)."""

    request_id: int | None  # the request it answers, if any
    message: str
    extra: dict = field(default_factory=dict)


Event = (
    WorkerReady
    | CatalogChanged
    | ModelLoading
    | ModelLoaded
    | LoadStopped
    | TokenBatch
    | TurnDone
    | LearningProgress
    | TargetDescribed
    | TokensCounted
    | ErrorEvent
    | Notice
)
