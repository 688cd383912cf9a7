"""Start the desktop app: a Qt application driven by a qasync event loop.

The asyncio loop and the Qt loop are one loop (qasync), so the worker's events
are pumped by an asyncio task while Qt paints; nothing here ever blocks on the
engine. One app per data folder (app/single_instance.py): a second start brings
the first window forward and ends.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys


def run_app(target: str | None = None) -> int:
    from .platform_libs import display_problem

    # Before Qt loads: without a display or the xcb plugin's system libraries,
    # QApplication aborts the process with a message that names neither.
    problem = display_problem()
    if problem:
        print(problem, file=sys.stderr)
        return 1

    import qasync
    from omnidraft.core.storage import paths
    from PySide6.QtCore import QCoreApplication, QEvent
    from PySide6.QtWidgets import QApplication, QMessageBox

    from .main_window import MainWindow
    from .qt_check import binding_problem
    from .single_instance import RaiseServer, bring_to_front, claim_folder
    from .theme import apply_theme

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    app = QApplication.instance() or QApplication(sys.argv)
    app.setApplicationName("OmniDraft")
    app.setApplicationDisplayName("OmniDraft")
    app.setDesktopFileName("omnidraft")
    # The window decides when the app ends: after it has saved and stopped the worker.
    app.setQuitOnLastWindowClosed(False)
    apply_theme(app)
    problem = binding_problem()
    if problem:  # refuse now rather than crash later in the middle of a chat
        print(problem, file=sys.stderr)
        QMessageBox.critical(None, "OmniDraft cannot start", problem)
        return 1

    # One app per data folder: a second one would overwrite this one's chats.
    folder = paths.data_dir()
    lock, busy = claim_folder(folder)
    if lock is None:
        print(busy, file=sys.stderr)
        QMessageBox.information(None, "OmniDraft is already open", busy)
        return 1

    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    window = MainWindow(target=target)
    raise_server = RaiseServer(folder, window)
    raise_server.raise_requested.connect(lambda: bring_to_front(window))
    closed = asyncio.Event()
    window.closed.connect(closed.set)
    # Ctrl+C in the terminal closes the window the normal way (saving everything);
    # the stall monitor's timer runs Python often enough for the handler to fire.
    signal.signal(signal.SIGINT, lambda *_: window.close())
    window.show()
    window.start()
    with loop:
        loop.run_until_complete(closed.wait())
    # Delete the window while the QApplication still exists; left to interpreter
    # exit, Qt objects can be destroyed after the app and crash on the way out.
    window.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    lock.release()  # the worker has stopped and everything is saved
    return 0
