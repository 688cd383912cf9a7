"""One app per data folder, and a second start that brings the first one forward.

The app holds its data folder's instance lock (core.storage.folder_lock) for as
long as it runs. A second start on the same folder finds it taken: it asks the
first app, over a local socket named after the folder, to bring its window to
the front, tells the person, and ends without touching the folder (no second
engine, nothing overwritten).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from omnidraft.core.storage.folder_lock import FolderBusyError, FolderLock
from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket
from PySide6.QtWidgets import QWidget

log = logging.getLogger(__name__)
CONNECT_MS = 1000


def server_name(folder: Path) -> str:
    """The local socket of the app using `folder` (one per folder, per user)."""
    digest = hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:16]
    return f"omnidraft-{digest}"


def claim_folder(folder: Path) -> tuple[FolderLock | None, str]:
    """(the held lock, "") or, when another app uses `folder`, (None, what to tell
    the person), after asking that app to bring its window to the front."""
    try:
        return FolderLock(folder=folder).acquire(), ""
    except FolderBusyError as busy:
        if ask_to_raise(folder):
            who = f" (process {busy.pid})" if busy.pid else ""
            return None, (f"OmniDraft is already open{who} on the data folder {folder}; "
                          "its window was brought to the front.")
        return None, str(busy)


def ask_to_raise(folder: Path) -> bool:
    """True when the app using `folder` was reached and asked to show its window."""
    socket = QLocalSocket()
    socket.connectToServer(server_name(folder))
    if not socket.waitForConnected(CONNECT_MS):
        return False
    socket.write(b"raise\n")
    socket.waitForBytesWritten(CONNECT_MS)
    socket.disconnectFromServer()
    return True


class RaiseServer(QObject):
    """The first app's side: a later start on its folder asks it to come forward."""

    raise_requested = Signal()

    def __init__(self, folder: Path, parent: QObject | None = None):
        super().__init__(parent)
        self.server = QLocalServer(self)
        self.server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        name = server_name(folder)
        # A socket file left by an app that crashed: ours now, since we hold the lock.
        QLocalServer.removeServer(name)
        if not self.server.listen(name):  # a later start then only shows its message
            log.warning("cannot listen on %s: %s", name, self.server.errorString())
        self.server.newConnection.connect(self._on_connection)

    def _on_connection(self) -> None:
        while (socket := self.server.nextPendingConnection()) is not None:
            socket.disconnected.connect(socket.deleteLater)
            socket.disconnectFromServer()
            self.raise_requested.emit()


def bring_to_front(window: QWidget) -> None:
    window.setWindowState(window.windowState() & ~Qt.WindowState.WindowMinimized)
    window.show()
    window.raise_()
    window.activateWindow()
