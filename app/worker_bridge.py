"""Connects the engine worker process to the Qt event loop.

An asyncio task (on the qasync loop) drains the worker's event queue every
20 ms without ever blocking, and re-emits each event as a Qt signal. The same
task notices when the worker process has died without being asked to stop,
reports it, and starts a fresh one; a worker that keeps dying straight after
start is not restarted in a tight loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from omnidraft.core.worker.process import WorkerHandle
from omnidraft.core.worker.protocol import Request
from PySide6.QtCore import QObject, Signal

log = logging.getLogger(__name__)

POLL_S = 0.02
# More than this many unexpected deaths within the window means something is
# persistently wrong (e.g. a model that crashes the process on load): stop retrying.
MAX_RESTARTS = 3
RESTART_WINDOW_S = 120.0
# Where the person finds the command (main_window: the Learning menu's "Restart engine").
RESTART_HINT = "Use Learning → Restart engine to try once more."


class WorkerBridge(QObject):
    event = Signal(object)  # one core.protocol event
    died = Signal(str)  # the worker ended unexpectedly; text for the user
    restarted = Signal()
    gave_up = Signal(str)  # it keeps dying; automatic restarts stopped

    def __init__(self, handle: WorkerHandle | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.handle = handle or WorkerHandle()
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._deaths: list[float] = []
        self.events_seen = 0

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._stopping = False
        if not self.handle.is_alive():
            self.handle.start()
        if self._task is None or self._task.done():
            self._task = asyncio.get_event_loop().create_task(self._pump())

    def stop(self, timeout: float = 5.0) -> None:
        """Shut the worker down cleanly (it is asked first, killed only if it hangs)."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.handle.stop(timeout)

    def restart_now(self) -> None:
        """User-requested restart (also clears the give-up state)."""
        self._deaths.clear()
        self._stopping = True  # the pump must not see this death as a crash
        self.handle.restart()
        self._stopping = False
        self.start()
        self.restarted.emit()

    def next_id(self) -> int:
        """The id for the next request: the handle's, so ids stay unique across restarts."""
        return self.handle.next_id()

    def send(self, request: Request) -> bool:
        """Queue a request; False when there is no running worker to take it."""
        if not self.handle.is_alive():
            return False
        try:
            self.handle.send(request)
        except (RuntimeError, OSError, ValueError) as exc:  # queue closed under us
            log.warning("could not send %s: %s", type(request).__name__, exc)
            return False
        return True

    def is_alive(self) -> bool:
        return self.handle.is_alive()

    # ------------------------------------------------------------ the pump

    async def _pump(self) -> None:
        while True:
            self.drain()
            if not self._stopping and not self.handle.is_alive() and self.handle.pid is not None:
                self.drain()  # whatever it managed to say before dying
                self._on_death()
                if self._stopping:
                    return
            await asyncio.sleep(POLL_S)

    def drain(self) -> int:
        """Emit every event waiting now; never blocks."""
        try:
            events = self.handle.poll()
        except (OSError, EOFError, ValueError) as exc:  # a half-written message from a killed worker
            log.warning("worker event queue broken: %s", exc)
            return 0
        for event in events:
            self.events_seen += 1
            try:
                self.event.emit(event)
            except Exception:  # a bug in one handler must not stop the pump
                log.exception("handling %s failed", type(event).__name__)
        return len(events)

    def _on_death(self) -> None:
        code = self.handle.exitcode
        how = f"exit code {code}" if code is not None and code >= 0 else f"signal {-(code or 0)}"
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < RESTART_WINDOW_S] + [now]
        if len(self._deaths) > MAX_RESTARTS:
            self._stopping = True
            with contextlib.suppress(Exception):
                self.handle.stop(0.1)
            self.gave_up.emit(
                f"The engine stopped unexpectedly ({how}) {len(self._deaths)} times in a row; "
                f"it was not restarted again. {RESTART_HINT}"
            )
            return
        self.died.emit(f"The engine stopped unexpectedly ({how}).")
        try:
            self.handle.restart()
        except (OSError, RuntimeError, ValueError) as exc:  # cannot spawn: report, keep the window
            self._stopping = True
            self.gave_up.emit(f"The engine could not be restarted ({getattr(exc, 'strerror', None) or exc}). "
                              f"{RESTART_HINT}")
            return
        self.restarted.emit()
