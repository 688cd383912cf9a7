"""The window's size, position, docks and splitter, kept between runs.

Qt saves them as it likes (opaque byte arrays) in a plain INI file beside
settings.json: it is not user data, and an unreadable file only means defaults.
"""

from __future__ import annotations

import logging

from omnidraft.core.storage import paths
from PySide6.QtCore import QByteArray, QSettings
from PySide6.QtWidgets import QMainWindow, QSplitter

log = logging.getLogger(__name__)


def _store() -> QSettings:
    return QSettings(str(paths.config_dir() / "window.ini"), QSettings.Format.IniFormat)


def restore_layout(window: QMainWindow, splitter: QSplitter) -> None:
    # restore*() returns False on unreadable data: the window's defaults stay.
    store = _store()
    for key, restore in (("geometry", window.restoreGeometry), ("state", window.restoreState),
                         ("splitter", splitter.restoreState)):
        value = store.value(key)
        if isinstance(value, QByteArray) and not restore(value):
            log.warning("window layout: ignored an unreadable %s", key)


def save_layout(window: QMainWindow, splitter: QSplitter) -> None:
    store = _store()
    store.setValue("geometry", window.saveGeometry())
    store.setValue("state", window.saveState())
    store.setValue("splitter", splitter.saveState())
    store.sync()
