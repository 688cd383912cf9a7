"""The server's side of the engine worker: requests out, events back, one turn at a time.

Qt-free and thread-safe. The HTTP handlers run on the server's asyncio loop (its
own thread); the worker's events arrive on whatever thread polls the worker (the
GUI's pump in the app, a plain loop in `omnidraft serve`), which hands each one to
`route`. Events answering the server's requests are passed to the loop with
call_soon_threadsafe; everything else is left to the caller (the GUI).

Turns are admitted one at a time, first come first served: the worker gets the
next served request only after the previous one's TurnDone, so the app's own
chat, queued in the worker meanwhile, is never more than one served reply behind.
How many may wait, and for how long, is bounded; a request over either bound is
refused with a sentence (Busy).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from omnidraft.core.models.catalog import ModelEntry
from omnidraft.core.worker.protocol import (
    CancelRequest,
    CatalogChanged,
    ChatRequest,
    ErrorEvent,
    Event,
    LoadStopped,
    ModelLoaded,
    ModelLoading,
    Request,
    SwitchTarget,
    TokenBatch,
    TurnDone,
    WorkerReady,
)

ALIAS = "omnidraft"  # a model name that always means the loaded target
MAX_WAITING = 64  # requests queued behind the one being served
MAX_WAIT_S = 300.0  # the longest a request waits for its turn
RECENT = 256  # finished turns remembered (the status line, tests)


class Busy(Exception):
    """The request was not served: too many waiting, or it waited too long.
    status: the HTTP status (429 or 503); str(): the sentence for the client."""

    def __init__(self, status: int, message: str, retry_after_s: int = 5):
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


class Refused(Exception):
    """The engine refused the request (a model it cannot load, a prompt over the
    context); str(): its own sentence."""

    def __init__(self, message: str, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code


@dataclass
class Ticket:
    """One served request: its id, its events as they arrive, and how it ended."""

    request_id: int
    events: asyncio.Queue
    queued_s: float = 0.0
    done: TurnDone | None = None
    error: ErrorEvent | None = None
    sent: bool = False
    cancelled: bool = False
    lost: bool = False  # the worker went away before the turn ended
    pieces: list[str] = field(default_factory=list)


@dataclass
class Served:
    """A finished served turn, as the status line and the charts see it."""

    request_id: int
    reason: str
    new_tokens: int
    model_id: str
    done: TurnDone


class EngineService:
    def __init__(
        self,
        send: Callable[[Request], bool],
        next_id: Callable[[], int],
        learn: Callable[[], bool] = lambda: False,
        on_turn: Callable[[TurnDone], None] | None = None,
        max_waiting: int = MAX_WAITING,
        max_wait_s: float = MAX_WAIT_S,
    ):
        """send: queue a request for the worker (False when none runs); next_id:
        the worker handle's request ids; learn: whether served turns teach the
        drafter now (the setting); on_turn: told of each finished served turn
        (called on the server's loop)."""
        self._send = send
        self.next_id = next_id
        self.learn = learn
        self.on_turn = on_turn
        self.max_waiting = max_waiting
        self.max_wait_s = max_wait_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._tickets: dict[int, Ticket] = {}
        self._waiters: deque[asyncio.Future] = deque()
        self._busy = False
        # What the worker said it has, from any event seen (route is told all).
        self.catalog: list[ModelEntry] = []
        self.current: ModelLoaded | None = None
        self.recent: deque[Served] = deque(maxlen=RECENT)

    # ------------------------------------------------------------ any thread

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def route(self, event: Event) -> bool:
        """Take an event from the worker (any thread). True when it answers one of
        the server's requests and nobody else needs it; a served load (ModelLoading,
        ModelLoaded) is also left to the caller, whose window shows the new model."""
        self.observe(event)
        request_id = getattr(event, "request_id", None)
        with self._lock:
            ticket = self._tickets.get(request_id) if request_id is not None else None
        if ticket is None or self.loop is None:
            return False
        self.loop.call_soon_threadsafe(self._deliver, ticket, event)
        return not isinstance(event, (ModelLoading, ModelLoaded))

    def observe(self, event: Event) -> None:
        """Keep what the worker says it has: the catalog and the loaded target."""
        if isinstance(event, (WorkerReady, CatalogChanged)):
            self.catalog = list(event.catalog)
        elif isinstance(event, ModelLoaded):
            self.current = event

    def worker_lost(self, message: str) -> None:
        """The worker died or was stopped: every served request still open fails
        with `message`, and the next one waits for a fresh worker's model."""
        self.current = None
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._fail_all, message)

    def owns(self, request_id: int | None) -> bool:
        with self._lock:
            return request_id in self._tickets

    # ------------------------------------------------------------ the loop's side

    def model_ids(self) -> list[str]:
        """The loaded target first, then the rest of the catalog."""
        ids = [self.current.model_id] if self.current else []
        return ids + [e.id for e in self.catalog if e.id not in ids]

    def resolve(self, name: str | None) -> str:
        """The model id a request's `model` names: the alias, an empty name or the
        loaded target's id mean the loaded target. Refused (404) for an unknown one."""
        current = self.current.model_id if self.current else None
        if name in (None, "", ALIAS) or name == current:
            if current is None:
                raise Busy(503, "No model is loaded yet; try again once the engine has loaded one.", 10)
            return current
        if any(e.id == name for e in self.catalog):
            return name
        known = ", ".join([ALIAS, *self.model_ids()])
        raise Refused(f"The model '{name}' does not exist here. Models: {known}.", 404, "model_not_found")

    async def admit(self, is_disconnected: Callable | None = None) -> Ticket:
        """Wait for this request's turn on the engine (first come, first served)."""
        assert self.loop is not None, "the service is not bound to the server's loop"
        start = time.monotonic()
        if self._busy or self._waiters:
            if len(self._waiters) >= self.max_waiting:
                raise Busy(429, f"The server is busy: {len(self._waiters)} requests are already waiting "
                                "for the engine. Try again shortly.")
            waiter = self.loop.create_future()
            self._waiters.append(waiter)
            try:
                await self._wait(waiter, start, is_disconnected)
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._release()  # the turn came just as this request gave up: pass it on
                else:
                    waiter.cancel()
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
                raise
        else:
            self._busy = True
        ticket = Ticket(self.next_id(), asyncio.Queue(), queued_s=time.monotonic() - start)
        with self._lock:
            self._tickets[ticket.request_id] = ticket
        return ticket

    async def _wait(self, waiter: asyncio.Future, start: float, is_disconnected: Callable | None) -> None:
        while True:
            left = self.max_wait_s - (time.monotonic() - start)
            if left <= 0:
                raise Busy(503, f"The engine was busy for {self.max_wait_s:.0f} s with other requests "
                                f"({len(self._waiters)} waiting); this one was not started. Try again later.", 30)
            done, _ = await asyncio.wait({waiter}, timeout=min(left, 0.5))
            if done:
                return
            if is_disconnected is not None and await is_disconnected():
                raise asyncio.CancelledError("the client went away while waiting")

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # its request holds the engine now
                return
        self._busy = False

    def abandon(self, ticket: Ticket) -> None:
        """A request gave up before its turn was sent (a failed load, a bad model)."""
        if not ticket.sent and ticket.done is None:
            ticket.done = TurnDone(ticket.request_id, "", "cancelled", None, "", None)
            self._finish(ticket)

    def send(self, ticket: Ticket, request: Request) -> None:
        if not self._send(request):
            raise Busy(503, "The engine is not running right now (it may be restarting); try again shortly.", 10)

    async def switch(self, ticket: Ticket, model_id: str) -> None:
        """Load another target for this request (its turn holds the engine)."""
        request = SwitchTarget(self.next_id(), model_id)
        with self._lock:
            self._tickets[request.request_id] = ticket
        try:
            self.send(ticket, request)
            while True:
                event = await ticket.events.get()
                if isinstance(event, ModelLoaded) and event.request_id == request.request_id:
                    return
                if isinstance(event, ErrorEvent) and event.request_id == request.request_id:
                    raise Refused(f"The model '{model_id}' could not be loaded: {event.message}", 400,
                                  "model_not_available")
                if isinstance(event, LoadStopped) and event.request_id == request.request_id:
                    raise Busy(503, f"Loading '{model_id}' was stopped: another model was asked for meanwhile "
                                    "(in the app, or by another request). Try again.", 10)
                if isinstance(event, TurnDone) and event.reason == "error":  # the worker went away
                    raise Busy(503, event.text or "The engine stopped while loading the model.", 10)
        finally:
            with self._lock:
                self._tickets.pop(request.request_id, None)

    def start_turn(self, ticket: Ticket, request: ChatRequest) -> None:
        request.request_id = ticket.request_id
        request.learn = bool(self.learn())
        self.send(ticket, request)
        ticket.sent = True

    def cancel(self, ticket: Ticket) -> None:
        """Stop a turn whose client went away (the worker stops at its next step);
        its engine turn ends with the TurnDone that answers."""
        if ticket.done is not None or ticket.cancelled:
            return
        ticket.cancelled = True
        if not ticket.sent:
            self.abandon(ticket)
            return
        with contextlib.suppress(Exception):
            self._send(CancelRequest(ticket.request_id))

    def cancel_all(self) -> None:
        """The server is stopping: stop every turn it started."""
        with self._lock:
            tickets = list({id(t): t for t in self._tickets.values()}.values())
        for ticket in tickets:
            self.cancel(ticket)

    def _deliver(self, ticket: Ticket, event: Event) -> None:
        if isinstance(event, ErrorEvent):
            ticket.error = event
        if isinstance(event, TokenBatch):
            ticket.pieces.extend(text for text, _ in event.pieces)
        if isinstance(event, TurnDone) and event.request_id == ticket.request_id and ticket.done is None:
            ticket.done = event
            self._finish(ticket)
            self.recent.append(Served(event.request_id, event.reason,
                                      event.stats.new_tokens if event.stats else 0, event.model_id, event))
            if self.on_turn is not None and event.stats is not None and event.reason != "error":
                with contextlib.suppress(Exception):
                    self.on_turn(event)
        ticket.events.put_nowait(event)

    def _finish(self, ticket: Ticket) -> None:
        with self._lock:
            self._tickets.pop(ticket.request_id, None)
        self._release()

    def _fail_all(self, message: str) -> None:
        with self._lock:
            open_tickets = {id(t): t for t in self._tickets.values()}.values()
        for ticket in list(open_tickets):
            if ticket.done is None:
                ticket.error = ErrorEvent(ticket.request_id, message)
                ticket.lost = True
                done = TurnDone(ticket.request_id, "".join(ticket.pieces), "error", None, "", None)
                ticket.done = done
                self._finish(ticket)
                ticket.events.put_nowait(done)

