"""The Targets menu: every catalog model, a check mark on the one in use, "Model
info…" about it, "Get models…" (downloads) and "Add local model…". It only emits
what the user picked (a finished download is added like a local file); the window
sends it."""

from __future__ import annotations

from omnidraft.core.models.catalog import ModelEntry
from PySide6.QtCore import Signal
from PySide6.QtGui import QAction, QActionGroup
from PySide6.QtWidgets import QFileDialog, QMainWindow, QMenu, QWidget

from .get_models_dialog import GetModelsDialog


def entry_label(entry: ModelEntry) -> str:
    """'Name  (1.1 GB, what it is)': size and a few words, so a user can choose."""
    about = [f"{entry.size_bytes / 1e9:.1f} GB"] if entry.size_bytes else []
    if entry.description:
        about.append(entry.description)
    elif not entry.bundled:
        about.append("local")
    return entry.name + (f"  ({', '.join(about)})" if about else "")


class TargetsMenu(QMenu):
    switch_requested = Signal(str)  # catalog id, or the path of a model opened by path
    add_requested = Signal(str)  # a path (a local model, or a finished download)
    info_requested = Signal()  # Model info… about the current target

    def __init__(self, parent: QWidget | None = None):
        super().__init__("&Targets", parent)
        self.entries: list[ModelEntry] = []
        # Models opened by path (--target, a restored last target) are not catalog
        # entries: the worker knows them only by path, so they are kept apart and
        # switched to by path.
        self.opened: list[ModelEntry] = []
        self.current: str | None = None
        self.get_models: GetModelsDialog | None = None  # made on first use; lives with the window
        self._group = QActionGroup(self)
        self._group.setExclusive(True)
        self.rebuild()

    def set_catalog(self, entries: list[ModelEntry]) -> None:
        ids = {e.id for e in entries}
        self.opened = [e for e in self.opened if e.id not in ids]
        self.entries = list(entries) + self.opened
        self.rebuild()

    def set_current(self, model_id: str | None, name: str | None = None, path: str | None = None) -> None:
        """Check `model_id`; a model opened by `path` (not in the catalog) is listed too."""
        self.current = model_id
        if model_id and name and path and all(e.id != model_id for e in self.entries):
            entry = ModelEntry(model_id, name, path)
            self.opened.append(entry)
            self.entries.append(entry)
        self.rebuild()

    def request_key(self, model_id: str) -> str:
        """What to send in SwitchTarget for `model_id`: its id, or its path if opened by path."""
        for entry in self.opened:
            if entry.id == model_id:
                return entry.path
        return model_id

    def name_of(self, model_id: str) -> str:
        for entry in self.entries:
            if entry.id == model_id:
                return entry.name
        return model_id

    def path_of(self, model_id: str) -> str | None:
        for entry in self.entries:
            if entry.id == model_id:
                return entry.path or None
        return None

    def rebuild(self) -> None:
        self.clear()
        for action in self._group.actions():
            self._group.removeAction(action)
        if not self.entries:
            waiting = self.addAction("Waiting for the engine…")
            waiting.setEnabled(False)
        for entry in self.entries:
            action = QAction(entry_label(entry), self, checkable=True)
            action.setData(entry.id)
            action.setToolTip(entry.path or entry.id)
            action.setChecked(entry.id == self.current)
            action.triggered.connect(lambda _checked=False, i=entry.id: self._picked(i))
            self._group.addAction(action)
            self.addAction(action)
        self.addSeparator()
        info = self.addAction("Model info…", self.info_requested.emit)
        info.setEnabled(self.current is not None)
        self.addSeparator()
        self.addAction("Get models…", self.show_get_models)
        self.addAction("Add local model folder…", self.ask_add_folder)
        self.addAction("Add local GGUF file…", self.ask_add_file)

    def drop_open(self) -> None:
        """Open this menu from the window's menu bar, so the keyboard can pick a model."""
        window = self.parentWidget()
        if isinstance(window, QMainWindow):
            window.menuBar().setActiveAction(self.menuAction())

    def checked_id(self) -> str | None:
        action = self._group.checkedAction()
        return action.data() if action else None

    def _picked(self, model_id: str) -> None:
        # The check mark moves only once the model has loaded (set_current); until
        # then it stays on the model that is actually answering.
        self.rebuild()
        if model_id != self.current:
            self.switch_requested.emit(self.request_key(model_id))

    def show_get_models(self) -> None:
        if self.get_models is None:
            self.get_models = GetModelsDialog(self.parentWidget())
            self.get_models.add_requested.connect(self.add_requested)
        self.get_models.show()
        self.get_models.raise_()
        self.get_models.activateWindow()

    def ask_add_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(
            self.parentWidget(), "Add a Hugging Face model folder"
        )
        if folder:
            self.add_requested.emit(folder)

    def ask_add_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self.parentWidget(), "Add a GGUF model file", "", "GGUF models (*.gguf);;All files (*)"
        )
        if path:
            self.add_requested.emit(path)

