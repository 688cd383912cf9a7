"""Start the desktop app (a minimal window until the full GUI lands)."""

from __future__ import annotations

import sys


def run_app(target: str | None = None) -> int:
    from PySide6.QtWidgets import QApplication, QLabel, QMainWindow

    from omnidraft import __version__

    app = QApplication.instance() or QApplication(sys.argv)
    window = QMainWindow()
    window.setWindowTitle(f"OmniDraft Desktop {__version__}")
    window.setCentralWidget(QLabel("OmniDraft Desktop"))
    window.resize(900, 640)
    window.show()
    return app.exec()
