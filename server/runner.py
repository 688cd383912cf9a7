"""Running the server: uvicorn in a thread of its own, inside the app or for
`omnidraft serve`.

* ServerThread: uvicorn on a socket bound here first (so a port in use is a
  sentence, not a log line), with its own asyncio loop in a background thread.
* AppServer: the server inside the app, on the app's own worker; the window's
  event handler offers it each worker event first (route).
* serve: `omnidraft serve`: its own worker, polled on the main thread, restarted
  with the same target if it dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import socket
import sys
import threading
import time
from collections.abc import Callable

from omnidraft.core.worker.process import WorkerHandle
from omnidraft.core.worker.protocol import (
    ErrorEvent,
    ModelLoaded,
    ModelLoading,
    Notice,
    Request,
    SwitchTarget,
    TurnDone,
    UpdateSettings,
    WorkerReady,
)

from .api import create_app
from .service import EngineService

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8090
KEY_ENV = "OMNIDRAFT_API_KEY"  # the key, for those who keep it off the command line
START_TIMEOUT_S = 10.0
START_WORKER_S = 600.0  # importing torch and starting the engine, on a busy machine
LOAD_TIMEOUT_S = 1800.0  # a first start converts the target (minutes on a slow machine)
MAX_RESTARTS = 3  # within RESTART_WINDOW_S; more means something is persistently wrong
RESTART_WINDOW_S = 120.0


class ServerError(Exception):
    """The server could not start; str() says why, for people."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_refusal(host: str, api_key: str | None) -> str | None:
    """Why this address may not be served, or None: beyond this machine only with a key."""
    if not host.strip():
        return "The host is empty: give an address to listen on, such as 127.0.0.1."
    if not is_loopback(host) and not (api_key or "").strip():
        return (f"Listening on {host} lets other machines reach the server, so it needs an API key: "
                "give one with --api-key (or in Settings → Local server), or keep the default host 127.0.0.1.")
    return None


def base_url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/v1"


class ServerThread:
    """uvicorn serving `app` on host:port from a background thread."""

    def __init__(self, app, host: str, port: int):
        self.app, self.host, self.port = app, host, port
        self.server = None
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._failure: BaseException | None = None

    @property
    def url(self) -> str:
        return base_url(self.host, self.port)

    def _bind(self) -> socket.socket:
        try:
            infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        except socket.gaierror:
            raise ServerError(f"'{self.host}' is not an address of this machine.") from None
        family, _, _, _, address = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            sock.close()
            if exc.errno in (98, 48, 10048):  # EADDRINUSE on Linux, macOS, Windows
                raise ServerError(f"Port {self.port} on {self.host} is in use by another program; "
                                  "choose another port.") from None
            raise ServerError(f"Could not listen on {self.host}:{self.port} ({exc.strerror or exc}).") from None
        sock.listen(128)
        self.port = sock.getsockname()[1]  # port 0: the one the system chose
        return sock

    def start(self) -> str:
        """Listen and serve; the base URL. ServerError with a sentence when it cannot."""
        import uvicorn

        sock = self._bind()
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="on",
                                timeout_graceful_shutdown=3)
        self.server = uvicorn.Server(config)

        def run() -> None:
            self.loop = asyncio.new_event_loop()
            try:
                self.loop.run_until_complete(self.server.serve(sockets=[sock]))
            except BaseException as exc:  # noqa: BLE001 - reported by start()
                self._failure = exc
            finally:
                sock.close()
                self.loop.close()

        self.thread = threading.Thread(target=run, name="omnidraft-server", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ServerError(f"The server did not start on {self.host}:{self.port}"
                                  + (f" ({self._failure})." if self._failure else "."))
            time.sleep(0.02)
        return self.url

    def call(self, fn: Callable[[], None], timeout: float = 2.0) -> None:
        """Run fn on the server's loop and wait for it (briefly)."""
        if self.loop is None or self.loop.is_closed():
            return

        async def run() -> None:
            fn()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        if self.server is not None:
            self.server.should_exit = True
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)


class AppServer:
    """The local server inside the app: Qt-free; the window calls it from the GUI thread."""

    def __init__(self, send: Callable[[Request], bool], next_id: Callable[[], int],
                 learn: Callable[[], bool], on_turn: Callable[[TurnDone], None] | None = None, **bounds):
        """bounds: EngineService's max_waiting and max_wait_s."""
        self._send, self._next_id, self._learn, self._on_turn = send, next_id, learn, on_turn
        self._bounds = bounds
        self.service: EngineService | None = None
        self.thread: ServerThread | None = None
        self.error: str | None = None  # why the last start failed
        self._seen: list = []  # WorkerReady/CatalogChanged/ModelLoaded so far, for a service started later

    @property
    def running(self) -> bool:
        return self.thread is not None

    @property
    def url(self) -> str | None:
        return self.thread.url if self.thread else None

    def start(self, host: str, port: int, api_key: str | None) -> str:
        """Serve on host:port (stopping a server already running); the base URL, or
        ServerError with a sentence."""
        self.stop()
        self.error = bind_refusal(host, api_key)
        if self.error:
            raise ServerError(self.error)
        service = EngineService(self._send, self._next_id, self._learn, self._on_turn, **self._bounds)
        for event in self._seen:
            service.observe(event)
        thread = ServerThread(create_app(service, api_key or None), host, port)
        try:
            url = thread.start()
        except ServerError as exc:
            self.error = str(exc)
            raise
        self.service, self.thread = service, thread
        return url

    def stop(self) -> None:
        if self.thread is not None:
            service = self.service
            self.thread.call(service.cancel_all)  # nobody will read those replies
            self.thread.stop()
        self.thread = None

    def route(self, event) -> bool:
        """True when the event answers one of the server's requests (the window skips it)."""
        if isinstance(event, WorkerReady):
            self._seen = [event]
        elif isinstance(event, ModelLoaded) or getattr(event, "catalog", None) is not None:
            self._seen.append(event)
            del self._seen[1:-8]  # the first (the catalog) and the latest few are enough
        return self.service.route(event) if self.service is not None else False

    def worker_lost(self, message: str) -> None:
        if self.service is not None:
            self.service.worker_lost(message)

    def status(self) -> str:
        if self.thread is not None:
            model = self.service.current.model_id if self.service and self.service.current else "no model yet"
            return f"Serving at {self.url} · model: {model}"
        return f"Not running: {self.error}" if self.error else "Off"


# ---------------------------------------------------------------------- omnidraft serve


def _wait_for(handle: WorkerHandle, match, timeout: float, on_event=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in handle.poll(0.2):
            if on_event is not None:
                on_event(event)
            if match(event):
                return event
        if not handle.is_alive():
            return None
    return None


def serve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, api_key: str | None = None,
          model: str | None = None, learn: bool | None = None, out=None,
          ready: Callable[[str, EngineService], None] | None = None, stop: threading.Event | None = None) -> int:
    """`omnidraft serve`: start a worker, load the target, serve until interrupted
    (Ctrl-C, or `stop` set). Returns the exit status; every failure is a sentence on `out`.
    ready: called with the base URL and the service once it serves (tests, tools)."""
    from omnidraft.core.storage.settings import load_settings

    out = out or sys.stderr
    api_key = api_key or os.environ.get(KEY_ENV) or None
    refusal = bind_refusal(host, api_key)
    if refusal:
        print(refusal, file=out)
        return 2
    settings, problems = load_settings()
    for problem in problems:
        print(problem, file=out)
    learn = settings.learn_from_api if learn is None else learn
    model = model or settings.last_target
    handle = WorkerHandle()
    service = EngineService(lambda r: _send(handle, r), handle.next_id, lambda: learn)
    thread: ServerThread | None = None
    stop = stop or threading.Event()
    try:
        handle.start()
        handle.send(UpdateSettings(handle.next_id(), settings.to_dict()))
        ready_event = _wait_for(handle, lambda e: isinstance(e, (WorkerReady, ErrorEvent)), START_WORKER_S,
                                service.observe)
        if not isinstance(ready_event, WorkerReady):
            why = (ready_event.message if isinstance(ready_event, ErrorEvent)
                   else "it stopped at once" if not handle.is_alive()
                   else f"it was not ready after {START_WORKER_S:.0f} s")
            print(f"The engine did not start: {why}", file=out)
            return 1
        loaded = _load(handle, service, model, out)
        if loaded is None:
            return 1
        thread = ServerThread(create_app(service, api_key), host, port)
        try:
            url = thread.start()
        except ServerError as exc:
            print(str(exc), file=out)
            return 1
        print(f"OmniDraft serves {loaded.name} at {url}", file=out)
        print(f"Model name: {loaded.model_id} (or \"omnidraft\" for whichever target is loaded)", file=out)
        learning = "on" if learn else "off"
        print(f"Learning from API traffic: {learning}. Stop with Ctrl-C.", file=out, flush=True)
        if ready is not None:
            ready(url, service)
        return _pump(handle, service, model, loaded, out, stop)
    except KeyboardInterrupt:
        return 0
    finally:
        if thread is not None:
            thread.call(service.cancel_all)
            thread.stop()
        handle.stop()


def _send(handle: WorkerHandle, request: Request) -> bool:
    if not handle.is_alive():
        return False
    try:
        handle.send(request)
    except (RuntimeError, OSError, ValueError):
        return False
    return True


def _load(handle: WorkerHandle, service: EngineService, model: str, out) -> ModelLoaded | None:
    request = SwitchTarget(handle.next_id(), model)
    handle.send(request)
    shown = [""]

    def progress(event) -> None:
        if isinstance(event, ModelLoading) and event.stage != shown[0]:
            shown[0] = event.stage
            print(f"{event.stage}…", file=out, flush=True)
        service.observe(event)

    answer = _wait_for(handle, lambda e: isinstance(e, (ModelLoaded, ErrorEvent)) and e.request_id == request.request_id,
                       LOAD_TIMEOUT_S, progress)
    if isinstance(answer, ModelLoaded):
        return answer
    why = answer.message if isinstance(answer, ErrorEvent) else "the engine stopped while loading it"
    print(f"Could not load {model}: {why}", file=out)
    return None


def _pump(handle: WorkerHandle, service: EngineService, model: str, loaded: ModelLoaded, out,
          stop: threading.Event) -> int:
    """Hand the worker's events to the service until stopped; restart a worker that died
    with the target it had (by the name it was first asked for: a path is no catalog id)."""
    deaths: list[float] = []
    while not stop.is_set():
        try:
            events = handle.poll(0.05)
        except (OSError, EOFError, ValueError):  # a half-written message from a killed worker
            events = []
        for event in events:
            if service.route(event):
                continue
            if isinstance(event, (Notice, ErrorEvent)) and event.request_id is None:
                print(event.message, file=out, flush=True)
        if handle.is_alive():
            continue
        now = time.monotonic()
        deaths = [t for t in deaths if now - t < RESTART_WINDOW_S] + [now]
        current = service.current
        service.worker_lost("The engine stopped unexpectedly; this request was lost. Try again.")
        if len(deaths) > MAX_RESTARTS or current is None:
            print("The engine keeps stopping; the server ends.", file=out)
            return 1
        print("The engine stopped unexpectedly; restarting it…", file=out, flush=True)
        handle.restart()  # it gets the last settings again
        key = model if current.model_id == loaded.model_id else current.model_id
        handle.send(SwitchTarget(handle.next_id(), key))
    return 0
