"""What the GUI tests do as a person would: type, press Enter, wait for the reply."""

from __future__ import annotations

import itertools
import os
from contextlib import contextmanager

from omnidraft.core.worker.protocol import TokenBatch, TurnDone
from PySide6.QtCore import Qt

WAIT_MS = 60_000  # generous: the 2-core machine is shared; real waits are ~1-5 s
SHORT_REPLY = 16


class Recorder:
    def __init__(self):
        self.events: list = []

    def __call__(self, event) -> None:
        self.events.append(event)
        if os.environ.get("GUI_TEST_TRACE"):
            import time

            print(f"{time.monotonic():.2f} {type(event).__name__} {getattr(event, 'stage', '')}")

    def of(self, kind, **match) -> list:
        return [
            e
            for e in self.events
            if isinstance(e, kind) and all(getattr(e, k) == v for k, v in match.items())
        ]



def dispose(qapp, widget) -> None:
    """Delete the window's C++ side now, while the QApplication still exists: left to
    interpreter exit, Qt and pyqtgraph objects can be torn down in a crashing order."""
    from PySide6.QtCore import QCoreApplication, QEvent

    widget.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    qapp.processEvents()


def idle(qtbot, win) -> None:
    qtbot.waitUntil(lambda: win.session.active is None and win.targets.current is not None, timeout=WAIT_MS)


def send(qtbot, win, text: str, max_tokens: int = SHORT_REPLY) -> int:
    """Type `text` and press Enter, as a person would; returns the request id used."""
    idle(qtbot, win)
    win.apply_settings({"max_new_tokens": max_tokens})
    qtbot.keyClicks(win.chat.composer, text)
    qtbot.keyClick(win.chat.composer, Qt.Key.Key_Return)
    assert win.session.active is not None, "Enter did not send"
    return win.session.active.request_id


def turn(qtbot, win, request_id: int) -> TurnDone:
    qtbot.waitUntil(lambda: bool(win.recorder.of(TurnDone, request_id=request_id)), timeout=WAIT_MS)
    idle(qtbot, win)
    return win.recorder.of(TurnDone, request_id=request_id)[0]


class IdleWorker:
    """A worker handle that never starts: for tests of the window's own start-up."""

    pid = None
    exitcode = None

    def start(self) -> None: ...
    def is_alive(self) -> bool:
        return False
    def poll(self, timeout: float = 0.0) -> list:
        return []
    def send(self, request) -> None: ...
    def stop(self, timeout: float = 5.0) -> None: ...
    def next_id(self) -> int:
        return 0


class ScriptedWorker(IdleWorker):
    """A live worker whose answers the test plays itself: records what is sent."""

    def __init__(self) -> None:
        self.sent: list = []
        self._ids = itertools.count(1)

    def is_alive(self) -> bool:
        return True

    def send(self, request) -> None:
        self.sent.append(request)

    def next_id(self) -> int:
        return next(self._ids)


@contextmanager
def scripted_window(qapp, model_id: str = "model-a", name: str = "Model A"):
    """A window on a ScriptedWorker with one model loaded; yields (window, worker)."""
    from omnidraft.app.main_window import MainWindow
    from omnidraft.core.models.catalog import ModelEntry
    from omnidraft.core.worker.protocol import ModelLoaded, WorkerReady

    worker = ScriptedWorker()
    win = MainWindow(target=model_id, handle=worker)
    win.on_event(WorkerReady(1, [ModelEntry(model_id, name, "/" + model_id)]))
    win.on_event(ModelLoaded(worker.sent[-1].request_id, model_id, name, 0.1, None))
    try:
        yield win, worker
    finally:
        win.close()
        dispose(qapp, win)


def answer(win, worker, text: str, reason: str = "eos", drafted: bool = False) -> None:
    """Play the engine's reply to the last chat request: the text (from accepted
    drafts or not), then its end."""
    from omnidraft.core.worker.protocol import ChatRequest

    request = [r for r in worker.sent if isinstance(r, ChatRequest)][-1]
    win.on_event(TokenBatch(request.request_id, [(text, drafted)]))
    win.on_event(TurnDone(request.request_id, text, reason, None, win.targets.current, None))
