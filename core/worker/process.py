"""The engine worker process, and the handle the GUI drives it with.

The worker owns one Engine (target, drafter, caches, learner) in a separate
"spawn" process, so a crash, an out-of-memory kill or a long model load never
freezes or takes down the GUI. It reads typed requests (core.worker.protocol) from one
queue and writes typed events to another:

* ChatRequest -> TokenBatch* (text batched every ~30 ms), then exactly one TurnDone
  (reason "error" after an ErrorEvent when the request fails).
* DescribeTarget -> TargetDescribed (or an ErrorEvent when no model is loaded).
* CountTokens -> TokensCounted (or an ErrorEvent when no model is loaded).
* CancelRequest stops the running reply between decoding steps; the cancel check
  drains the request queue without blocking and keeps everything else queued in order.
* After `idle_delay_s` without a request, learning runs one short step at a time
  (engine.idle_step(should_stop)), which gives way at its next layer boundary once
  a request waits, so a new request starts within a fraction of a second.
* Every event that answers a request carries that request's id (core.worker.protocol).
* SwitchTarget -> ModelLoading*, then ModelLoaded (or an ErrorEvent). Switches sent
  in a row are not all served: one that a newer SwitchTarget waits behind, or that
  a CancelRequest with its id names, is answered LoadStopped, and a load under way
  stops at its next layer (the model loaded before stays).
* One engine per data folder (engine.lock, core.storage.folder_lock), and it ends
  when its GUI is gone: a running reply stops at its next decoding step, learning
  at its next layer boundary, an idle loop within half a second, and anything
  else (a model load) within ORPHAN_GRACE_S of a watchdog thread noticing.
* What a person reads is a sentence; an unplanned failure's exception goes to
  the event's detail (the log), never into its message.

The engine is used through core.engine_api.EngineAPI, called directly, never probed.

This module is imported by the GUI process too (WorkerHandle): torch and the engine
are imported only inside the worker, never at module level.
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing as mp
import os
import queue
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from ..engine_api import EngineAPI
from ..heap import trim_heap
from ..stopping import ShouldStop
from ..storage import paths
from ..storage.paths import HOME_ENV
from ..storage.settings import Settings
from .power import BATTERY_STATUS, PowerSensor, no_sensor, on_battery
from .protocol import (
    AddModel,
    CancelRequest,
    CatalogChanged,
    ChatRequest,
    CountTokens,
    DescribeTarget,
    ErrorEvent,
    Event,
    LearningProgress,
    LearnNow,
    LoadStopped,
    ModelLoaded,
    ModelLoading,
    Notice,
    PauseLearning,
    RemoveModel,
    Request,
    ResetPersonalization,
    Shutdown,
    SwitchTarget,
    TargetDescribed,
    TokenBatch,
    TokensCounted,
    TurnDone,
    UpdateSettings,
    WorkerReady,
)

if TYPE_CHECKING:
    from ..decoding.sampling import GenerationConfig
    from ..events import TokenChunk, TurnFinished
    from ..models.catalog import ModelEntry

BATCH_INTERVAL_S = 0.03
# How long a starting engine waits for a previous engine on the same data folder
# to end (one whose GUI died stops within a decoding step or half a second idle).
ENGINE_LOCK_WAIT_S = 15.0
# How often the loop wakes while waiting, to notice that the idle delay has passed.
_WAKE_S = 0.5
BATTERY_CHECK_S = 10.0  # how often idle learning looks at the battery sensor
# Plain steps are timed this long after the last request was handled: the GUI draws
# the finished reply meanwhile, and on 2 cores its work made them read slow.
PLAIN_STEP_QUIET_S = 2.0

Emit = Callable[[Event], None]


class _Batcher:
    """Collects streamed text and emits it as one TokenBatch per ~30 ms."""

    def __init__(self, emit: Emit, request_id: int, interval: float = BATCH_INTERVAL_S):
        self.emit = emit
        self.request_id = request_id
        self.interval = interval
        self.pieces: list[tuple[str, bool]] = []
        self.last = time.monotonic() - interval  # the first text goes out at once
        self.text = ""  # everything emitted or pending, for an error's partial reply

    def add(self, text: str, drafted: bool) -> None:
        if not text:
            return
        self.text += text
        if self.pieces and self.pieces[-1][1] == drafted:
            self.pieces[-1] = (self.pieces[-1][0] + text, drafted)
        else:
            self.pieces.append((text, drafted))
        self.flush_if_due()

    def flush_if_due(self) -> None:
        if self.pieces and time.monotonic() - self.last >= self.interval:
            self.flush()

    def flush(self) -> None:
        if self.pieces:
            self.emit(TokenBatch(self.request_id, self.pieces))
            self.pieces = []
        self.last = time.monotonic()


def _freeze_long_lived() -> None:
    """Exempt what is alive now (tokenizers, vocabulary tables: ~400k objects
    with Gemma loaded) from the garbage collector's full passes, each ~190 ms
    here, which would otherwise land in the middle of a reply now and then."""
    gc.collect()
    gc.freeze()


def _failure(what: str, exc: BaseException, running: bool = True) -> str:
    """A sentence for a failure nobody planned for: what failed, and a full disk
    named as such. The exception itself (its class, its text) goes to the log as
    the event's detail, never to the person."""
    from ..storage.persistence import DiskFullError, is_disk_full

    if isinstance(exc, DiskFullError):
        return f"{what} failed. {exc}"
    if is_disk_full(exc):
        return f"{what} failed: the disk is full. Free some space in {paths.data_dir().parent} and try again."
    still = "the engine keeps running, and " if running else ""
    return f"{what} failed unexpectedly; {still}the log has the details."


# What each request was doing, for _failure's sentence.
_DOING = {
    "ChatRequest": "Writing the reply", "SwitchTarget": "Loading the model", "AddModel": "Adding the model",
    "RemoveModel": "Removing the model", "ResetPersonalization": "Resetting what was learned",
    "UpdateSettings": "Applying the settings", "DescribeTarget": "Describing the model",
    "PauseLearning": "Pausing learning", "LearnNow": "Starting learning",
}


def _catalog(engine: EngineAPI) -> list[ModelEntry]:
    return engine.catalog.entries()


class WorkerLoop:
    """The request loop around one engine. Queues need only put/get/get_nowait, so
    tests can drive it in-process with queue.Queue."""

    def __init__(
        self,
        requests: Any,
        events: Any,
        engine: EngineAPI,
        settings: Settings | None = None,
        parent_alive: Callable[[], bool] = lambda: True,
        power: PowerSensor = no_sensor,
    ):
        """power: the battery sensor (power.on_battery in the worker process; none by default)."""
        self.requests = requests
        self.events = events
        self.engine = engine
        self.settings = settings or Settings()
        self.parent_alive = parent_alive  # the GUI may die without sending Shutdown
        self.pending: deque[Request] = deque()  # taken off the queue during a reply
        self.last_request = time.monotonic()
        self.last_handled = time.monotonic()  # when the last request was done with
        self.learn_now = False
        # False after idle_step reported nothing to do (or failed): wait for new activity.
        self.learning_has_work = True
        self.power = power
        self._power_read_at = float("-inf")
        self._on_battery = False
        self._told_battery = False  # the GUI was told learning waits for mains power

    def emit(self, event: Event) -> None:
        self.events.put(event)

    # ------------------------------------------------------------------ main loop

    def run(self) -> None:
        self.emit(WorkerReady(os.getpid(), _catalog(self.engine)))
        warning = self.engine.catalog.load_warning
        if warning:
            self.emit(Notice(None, warning))
        while True:
            request = self._next_request()
            if request is None:
                if not self.parent_alive():
                    return  # orphaned: nobody will read what we do
                self._idle_step()
                self._forward_warnings()
                continue
            self.last_request = time.monotonic()
            self.learning_has_work = True
            if isinstance(request, Shutdown):
                return
            self._handle_safely(request)
            self.last_handled = time.monotonic()

    def _next_request(self) -> Request | None:
        """The next request, or None when it is time for an idle learning step."""
        if self.pending:
            return self.pending.popleft()
        while True:
            if self._timing_due() or self._learning_due():
                try:
                    return self.requests.get_nowait()
                except queue.Empty:
                    return None
            try:
                return self.requests.get(timeout=self._wait_s())
            except queue.Empty:
                if not self.parent_alive():
                    return None

    def _wait_s(self) -> float:
        if not self._can_learn():
            return _WAKE_S
        left = self.settings.idle_delay_s - (time.monotonic() - self.last_request)
        return min(_WAKE_S, max(0.01, left))

    def _can_learn(self) -> bool:
        if self.settings.learning_paused:
            return False
        # Learn now is the user's explicit ask: it runs on battery too.
        if not self.learn_now and self._held_for_mains():
            return False
        return self.learning_has_work or self.learn_now

    def _held_for_mains(self) -> bool:
        """Whether idle learning waits for mains power: on battery, unless the user
        lets it learn there; never without a battery sensor. Tells the GUI (its
        status bar) when that changes. The sensor is read every BATTERY_CHECK_S."""
        held = False
        if not self.settings.learning_on_battery:
            now = time.monotonic()
            if now - self._power_read_at >= BATTERY_CHECK_S:
                self._power_read_at = now
                self._on_battery = self.power() is True
            held = self._on_battery
        if held != self._told_battery:
            self._told_battery = held
            self.emit(LearningProgress(self._model_id() or "", BATTERY_STATUS if held else "idle"))
        return held

    def _request_waiting(self) -> bool:
        return bool(self.pending) or not self.requests.empty()

    def _should_give_way(self) -> bool:
        """Learning stops at its next layer boundary for a request, or when the GUI is gone."""
        return self._request_waiting() or not self.parent_alive()

    def _timing_due(self) -> bool:
        return self.engine.plain_step_due and time.monotonic() - self.last_handled >= PLAIN_STEP_QUIET_S

    def _learning_due(self) -> bool:
        if not self._can_learn():
            return False
        waited = time.monotonic() - self.last_request
        return self.learn_now or waited >= self.settings.idle_delay_s

    def _idle_step(self) -> None:
        """One short unit of idle work (the plain step's timing a little after a
        drafted reply, else learning); the loop checks the queue again right after."""
        if self._timing_due():
            try:
                self.engine.refresh_plain_step(should_stop=self._should_give_way)
            except Exception as exc:  # noqa: BLE001 - a reference figure must never take the worker down
                self.emit(ErrorEvent(None, _failure("Timing plain decoding (the speedup reference)", exc),
                                     traceback.format_exc()))
            return
        try:
            # A request waiting in the queue stops training at the next layer boundary.
            progress = self.engine.idle_step(should_stop=self._should_give_way)
        except Exception as exc:  # noqa: BLE001 - learning must never take the worker down
            self.learning_has_work = False  # don't repeat a failing step in a tight loop
            self.learn_now = False
            self.emit(ErrorEvent(None, "Learning stopped: " + _failure("a learning step", exc)
                                 + " It resumes after the next reply.", traceback.format_exc()))
            return
        trim_heap()
        if progress is not None:
            self.emit(LearningProgress(**asdict(progress)))
        if progress is None or progress.state != "running":
            self.learning_has_work = False
            self.learn_now = False

    # ------------------------------------------------------------------ requests

    def _handle_safely(self, request: Request) -> None:
        try:
            self._handle(request)
        except Exception as exc:  # noqa: BLE001 - the worker keeps serving whatever went wrong
            self.emit(
                ErrorEvent(
                    request.request_id,
                    _failure(_DOING.get(type(request).__name__, "The request"), exc),
                    traceback.format_exc(),
                )
            )
        finally:
            self._forward_warnings()

    def _forward_warnings(self) -> None:
        """What the engine set aside or turned off while serving (a damaged learned
        file kept as .corrupt, drafting off) reaches the person, once each."""
        for warning in self.engine.warnings:
            self.emit(Notice(None, warning))
        self.engine.warnings.clear()

    def _handle(self, request: Request) -> None:
        if isinstance(request, ChatRequest):
            self._chat(request)
        elif isinstance(request, CancelRequest):
            pass  # its reply already finished (or was cancelled while queued)
        elif isinstance(request, SwitchTarget):
            self._switch_target(request)
        elif isinstance(request, AddModel):
            self._add_model(request)
        elif isinstance(request, RemoveModel):
            self._remove_model(request)
        elif isinstance(request, LearnNow):
            self.learn_now = True
            if self.settings.learning_paused:
                self.emit(LearningProgress(self._model_id() or "", "paused", request_id=request.request_id))
        elif isinstance(request, PauseLearning):
            self._apply_settings(request.request_id, {"learning_paused": request.paused})
            state = "paused" if request.paused else "idle"
            self.emit(LearningProgress(self._model_id() or "", state, request_id=request.request_id))
            self._told_battery = False  # that replaced what the GUI shows
        elif isinstance(request, ResetPersonalization):
            self.engine.reset_personalization(request.model_id)
            self.emit(Notice(request.request_id, f"What was learned for {request.model_id} was reset."))
        elif isinstance(request, UpdateSettings):
            self._apply_settings(request.request_id, request.settings)
        elif isinstance(request, DescribeTarget):
            self._describe_target(request)
        elif isinstance(request, CountTokens):
            self._count_tokens(request)
        else:
            raise TypeError(f"unknown request {type(request).__name__}")

    def _model_id(self) -> str | None:
        target = self.engine.target
        return target.entry.id if target is not None else None

    def _superseded(self) -> bool:
        """A newer SwitchTarget waits: the one at hand would be replaced at once."""
        return any(isinstance(r, SwitchTarget) for r in self.pending)

    def _switch_target(self, request: SwitchTarget) -> None:
        from ..models.catalog import ModelError
        from ..models.loader import LoadCancelled

        stopped = self._drain(request.request_id)  # switches sent in a row: only the newest is served
        if stopped or self._superseded():
            self._load_stopped(request, stopped)
            return

        def progress(stage: str, fraction: float) -> None:
            self.emit(ModelLoading(request.request_id, request.model_id, stage, fraction))

        def should_stop() -> bool:  # asked between layers of the load
            nonlocal stopped
            stopped = self._drain(request.request_id) or stopped or not self.parent_alive()
            return stopped or self._superseded()

        gc.unfreeze()  # what the previous target left behind can be collected again
        try:
            entry = self.engine.load_target(request.model_id, progress, should_stop=should_stop)
        except LoadCancelled:  # the previous target stays loaded
            self._load_stopped(request, stopped)
            return
        except ModelError as exc:  # the previous target stays loaded
            self.emit(ErrorEvent(request.request_id, str(exc)))
            return
        finally:
            _freeze_long_lived()
        self.emit(
            ModelLoaded(
                request.request_id,
                entry.id,
                entry.name,
                self.engine.target.load_seconds,
                self.engine.drafter_description,
                self.engine.context_window(),
                self.engine.model_context(),
            )
        )

    def _load_stopped(self, request: SwitchTarget, cancelled: bool) -> None:
        reason = "cancelled" if cancelled else "superseded"
        self.emit(LoadStopped(request.request_id, request.model_id, reason))

    def _describe_target(self, request: DescribeTarget) -> None:
        from ..models.context import InputError

        try:
            info = self.engine.describe_target()
        except InputError as exc:  # no model loaded yet
            self.emit(ErrorEvent(request.request_id, str(exc)))
            return
        self.emit(TargetDescribed(request.request_id, info))

    def _count_tokens(self, request: CountTokens) -> None:
        from ..models.context import conversation_limit

        target = self.engine.target
        if target is None:
            self.emit(ErrorEvent(request.request_id, "No model is loaded yet to count a file's tokens; "
                                 "attach it once the model has loaded."))
            return
        counts = [len(target.tokenizer(text, add_special_tokens=False)["input_ids"]) for text in request.texts]
        limit = conversation_limit(self.engine.context_window(), self.settings.context_tokens)
        self.emit(TokensCounted(request.request_id, counts, limit))

    def _add_model(self, request: AddModel) -> None:
        from ..models.catalog import ModelError

        try:
            entry = self.engine.catalog.add(request.path)
        except ModelError as exc:
            self.emit(ErrorEvent(request.request_id, str(exc)))
            return
        self.emit(CatalogChanged(request.request_id, _catalog(self.engine), entry.id))

    def _remove_model(self, request: RemoveModel) -> None:
        from ..models.catalog import ModelError

        try:
            self.engine.catalog.remove(request.model_id)
        except ModelError as exc:
            self.emit(ErrorEvent(request.request_id, str(exc)))
            return
        self.emit(CatalogChanged(request.request_id, _catalog(self.engine)))

    def _apply_settings(self, request_id: int, changes: dict) -> None:
        self.settings, problems = self.settings.updated(**changes)
        self.engine.apply_settings(self.settings)
        for problem in problems:
            self.emit(Notice(request_id, problem))

    # ------------------------------------------------------------------ chat

    def _chat(self, request: ChatRequest) -> None:
        from ..decoding.sampling import GenerationConfig
        from ..events import TokenChunk, TurnFinished
        from ..models.catalog import ModelError
        from ..models.context import InputError

        batcher = _Batcher(self.emit, request.request_id)
        cancelled = False

        def should_stop() -> bool:
            nonlocal cancelled
            cancelled = self._drain(request.request_id) or cancelled
            # A GUI gone mid-reply: stop now (what was written is saved as cancelled)
            # rather than write up to max tokens nobody reads, still holding the folder.
            cancelled = cancelled or not self.parent_alive()
            batcher.flush_if_due()  # text held while a step was slow still goes out
            return cancelled

        cfg = GenerationConfig(
            max_new_tokens=request.max_new_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            stop_strings=tuple(request.stop),
            top_k=request.top_k,
            min_p=request.min_p,
            repetition_penalty=request.repetition_penalty,
        )
        evaluating = self.engine.evaluating
        self.engine.evaluating = evaluating or not request.learn  # a turn that must teach nothing
        try:
            for item in self._chat_stream(request, cfg, should_stop):
                if isinstance(item, TokenChunk):
                    batcher.add(item.text, item.drafted)
                elif isinstance(item, TurnFinished):
                    batcher.flush()
                    self.emit(self._turn_done(request.request_id, item))
                    return
            raise RuntimeError("the reply ended without a finish event")
        except (InputError, ModelError) as exc:
            self._chat_failed(request.request_id, batcher, str(exc), "")
        except Exception as exc:  # noqa: BLE001 - reported with its traceback; keep serving
            self._chat_failed(
                request.request_id,
                batcher,
                _failure("The reply", exc),
                traceback.format_exc(),
            )
        finally:
            self.engine.evaluating = evaluating

    def _chat_stream(
        self, request: ChatRequest, cfg: GenerationConfig, should_stop: ShouldStop
    ) -> Iterator[TokenChunk | TurnFinished]:
        from ..storage.secure_store import without_surrogates

        # A lone UTF-16 surrogate (pasted text) has no UTF-8 form and no token: read as U+FFFD.
        if request.prompt is not None:
            prompt = without_surrogates(request.prompt)
            return self.engine.complete(prompt, cfg, should_stop, speculative=request.speculative)
        messages = [{**m, "content": without_surrogates(m["content"])} if isinstance(m.get("content"), str) else m
                    for m in request.messages]
        return self.engine.chat(messages, cfg, should_stop, speculative=request.speculative)

    def _turn_done(self, request_id: int, item: TurnFinished) -> TurnDone:
        return TurnDone(
            request_id,
            item.text,
            item.reason,
            item.stats,
            self._model_id() or "",
            self.engine.baseline_tokens_per_s,
            item.omitted_messages,
        )

    def _chat_failed(self, request_id: int, batcher: _Batcher, message: str, detail: str) -> None:
        batcher.flush()
        self.emit(ErrorEvent(request_id, message, detail))
        self.emit(TurnDone(request_id, batcher.text, "error", None, self._model_id() or "", None))

    def _drain(self, running_id: int) -> bool:
        """Move waiting requests into `pending`; True when the running reply must stop."""
        stop = False
        while True:
            try:
                request = self.requests.get_nowait()
            except queue.Empty:
                return stop
            self.last_request = time.monotonic()
            if isinstance(request, CancelRequest):
                if request.request_id == running_id:
                    stop = True
                else:
                    self._cancel_queued(request.request_id)
            else:
                if isinstance(request, Shutdown):
                    stop = True  # quit promptly, not after a long reply
                self.pending.append(request)

    def _cancel_queued(self, request_id: int) -> None:
        for request in list(self.pending):
            if isinstance(request, ChatRequest) and request.request_id == request_id:
                self.pending.remove(request)
                model_id = self._model_id() or ""
                self.emit(TurnDone(request_id, "", "cancelled", None, model_id, None))
            elif isinstance(request, SwitchTarget) and request.request_id == request_id:
                self.pending.remove(request)
                self._load_stopped(request, cancelled=True)


# ---------------------------------------------------------------------- process side


def default_threads() -> int:
    """Torch threads for the engine: the physical cores (hyper-threads slow matmuls)."""
    import psutil

    return max(1, psutil.cpu_count(logical=False) or os.cpu_count() or 1)


def private_files() -> None:
    """Everything this process creates is its user's alone (folders 0700, files
    0600), whichever library writes it: converted model copies, compiled kernels,
    what learning saves."""
    if os.name == "posix":
        os.umask(0o077)


def worker_main(requests: Any, events: Any, home: str | None = None, threads: int | None = None) -> None:
    """Entry point of the worker process."""
    private_files()
    if home:
        os.environ[HOME_ENV] = home
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # no extra tokenizer threads
    import torch

    torch.set_num_threads(threads or default_threads())
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set (only allowed once per process)
        pass
    from ..engine import Engine
    from ..storage.folder_lock import ENGINE_LOCK_NAME, FolderBusyError, FolderLock

    parent = mp.parent_process()

    def parent_alive() -> bool:
        return parent is None or parent.is_alive()

    _start_orphan_watchdog(parent_alive)
    try:
        # One engine per data folder: an engine of a GUI that just died stops within
        # a decoding step (parent_alive), so a quick restart waits for it briefly.
        lock = FolderLock(ENGINE_LOCK_NAME).acquire(wait_s=ENGINE_LOCK_WAIT_S)
    except FolderBusyError as exc:
        events.put(ErrorEvent(None, f"The engine did not start: {exc}"))
        return
    try:
        engine = Engine()
    except Exception as exc:
        events.put(ErrorEvent(None, _failure("Starting the engine", exc, running=False), traceback.format_exc()))
        raise
    WorkerLoop(requests, events, engine, parent_alive=parent_alive, power=on_battery).run()
    lock.release()
    if not parent_alive():
        # Nobody reads the events any more: exiting must not wait for the queue's
        # feeder thread to push them into a pipe that may be full.
        events.cancel_join_thread()


# How often the watchdog looks at the GUI, and how long it then lets the request
# loop end by itself (it does within a decoding step, a layer of learning or half a
# second idle, saving what it learned) before it ends the process mid-load.
WATCHDOG_S = 0.25
ORPHAN_GRACE_S = 1.5


def _start_orphan_watchdog(parent_alive: Callable[[], bool]) -> None:
    """End this worker soon after its GUI is gone, whatever the request loop is
    doing: a model load checks nothing for minutes, and an orphan that keeps
    loading holds engine.lock, so the next app could not start its engine.

    Ending with os._exit is safe for the data: every file is written to a
    temporary name and renamed, or appended to a log whose reader drops a cut-short
    tail (core.storage.persistence), so a save cut short leaves the previous
    version; the kernel releases the folder lock."""
    import sys
    import threading

    def watch() -> None:
        while parent_alive():
            time.sleep(WATCHDOG_S)
        time.sleep(ORPHAN_GRACE_S)  # the loop usually ends (and saves) by itself meanwhile
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(0)

    threading.Thread(target=watch, name="orphan-watchdog", daemon=True).start()


class WorkerHandle:
    """The GUI's side: starts, feeds, polls and restarts the worker process. Qt-free.

    The GUI calls poll() from a timer (every ~30 ms) and checks is_alive(); when the
    worker died it reports the crash and calls restart(). The last UpdateSettings
    sent is replayed to a restarted worker so it runs with the user's settings.
    """

    def __init__(self, home: str | None = None, threads: int | None = None):
        self.home = home
        self.threads = threads
        self._ctx = mp.get_context("spawn")
        self._proc: Any = None
        self._requests: Any = None
        self._events: Any = None
        self._settings: UpdateSettings | None = None
        # Request ids: increasing across restarts, so an answer from before a restart
        # can never be taken for one to a later request.
        self._ids = itertools.count(1)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def exitcode(self) -> int | None:
        return self._proc.exitcode if self._proc is not None else None

    def next_id(self) -> int:
        """A fresh request id for the next request sent."""
        return next(self._ids)

    def start(self) -> None:
        if self.is_alive():
            raise RuntimeError("the worker is already running")
        self._close_queues()  # a crashed worker's queues
        self._requests = self._ctx.Queue()
        self._events = self._ctx.Queue()
        self._proc = self._ctx.Process(
            target=worker_main,
            args=(self._requests, self._events, self.home, self.threads),
            name="omnidraft-engine",
            daemon=True,  # never outlives the GUI
        )
        self._proc.start()
        if self._settings is not None:
            self._requests.put(self._settings)

    def send(self, request: Request) -> None:
        if self._requests is None:
            raise RuntimeError("the worker was not started")
        if isinstance(request, UpdateSettings):
            self._settings = request
        self._requests.put(request)

    def poll(self, timeout: float = 0.0) -> list[Event]:
        """All events available now; waits up to `timeout` seconds for the first one."""
        if self._events is None:
            return []
        out: list[Event] = []
        try:
            first = self._events.get(timeout=timeout) if timeout > 0 else self._events.get_nowait()
        except queue.Empty:
            return out
        out.append(first)
        while True:
            try:
                out.append(self._events.get_nowait())
            except queue.Empty:
                return out

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def kill(self) -> None:
        """Hard kill (SIGKILL), as a crash would."""
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the worker to shut down; terminate it if it does not within `timeout`."""
        if self._proc is None:
            return
        if self._proc.is_alive():
            try:
                self._requests.put(Shutdown(self.next_id()))
            except (OSError, ValueError):  # queue already closed
                pass
            self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(2)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(2)
        self._close_queues()

    def restart(self) -> None:
        """Stop (or clean up after a dead) worker and start a fresh one."""
        self.stop(timeout=2.0)
        self.start()

    def _close_queues(self) -> None:
        # The old queues may hold half-sent data from a killed process: drop them
        # without waiting on their feeder threads, which could block forever.
        for q in (self._requests, self._events):
            if q is not None:
                q.cancel_join_thread()
                q.close()
        self._requests = self._events = None
