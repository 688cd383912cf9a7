"""File → Export chat as Markdown / JSON and Import chat: the GUI side of
core/storage/chat_export.

Each command has a method taking a path (what tests call) and an ask_ variant
that first shows the file dialog. An import that fails says why in a box and
changes nothing; one that works adds a new chat and puts it on screen.
"""

from __future__ import annotations

import re
from pathlib import Path

from omnidraft.core.storage.chat_export import ChatImportError, read_chat_file, write_export
from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

from .actions import ActionSpec
from .chat_pane import ChatPane
from .target_control import STATUS_MS

KINDS = {"markdown": ("Markdown", ".md", "Markdown (*.md)"), "json": ("JSON", ".json", "JSON (*.json)")}
UNCHANGED = "Nothing was imported; your chats are unchanged."


def file_name(title: str, suffix: str) -> str:
    """A file name from a chat title: letters, digits, spaces and dashes only."""
    stem = re.sub(r"[^\w\- ]+", "", title).strip()[:60].strip() or "chat"
    return stem + suffix


class ChatFiles(QObject):
    status = Signal(str, int)  # status-bar text, ms

    def __init__(self, pane: ChatPane, window: QWidget):
        super().__init__(window)
        self.pane, self.window = pane, window

    def rows(self) -> list[ActionSpec]:
        """The File menu's rows for these commands."""
        return [
            ActionSpec("export_markdown", "Export chat as Markdown…", "&File",
                       lambda: self.ask_export("markdown"), "Ctrl+Shift+E", group="chat_files"),
            ActionSpec("export_json", "Export chat as JSON…", "&File", lambda: self.ask_export("json"),
                       group="chat_files"),
            ActionSpec("import_chat", "Import chat…", "&File", self.ask_import, "Ctrl+Shift+O",
                       group="chat_files"),
        ]

    # ------------------------------------------------------------ export

    def ask_export(self, kind: str) -> None:
        conv = self._current()
        if conv is None:
            self.status.emit("Open a chat to export it.", STATUS_MS)
            return
        name, suffix, pattern = KINDS[kind]
        path, _ = QFileDialog.getSaveFileName(self.window, f"Export chat as {name}",
                                              file_name(conv.title, suffix), pattern)
        if path:
            self.export(kind, Path(path if path.lower().endswith(suffix) else path + suffix))

    def export(self, kind: str, path: Path) -> bool:
        """Write the chat on screen to `path`; False (and a box saying why) when it fails."""
        conv = self._current()
        if conv is None:
            return False
        targets = self.pane.targets
        try:
            write_export(conv, path, kind, targets.name_of(conv.model_id or targets.wanted))
        except OSError as exc:
            QMessageBox.warning(self.window, "Export chat", f"Could not write {path}: {exc.strerror or exc}.")
            return False
        self.status.emit(f"Saved the chat to {path}", STATUS_MS)
        return True

    # ------------------------------------------------------------ import

    def ask_import(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Import chat", "",
                                              "Chats (*.json *.md *.markdown);;All files (*)")
        if path:
            self.import_file(Path(path))

    def import_file(self, path: Path) -> str | None:
        """Add the chat in `path` as a new conversation and show it; its id, or None
        when the file was refused (the box says why)."""
        try:
            chat = read_chat_file(path)
            conv = self.pane.store.add(chat.title, chat.messages, chat.system_prompt, chat.model_id,
                                       chat.created)
        except ChatImportError as exc:
            QMessageBox.warning(self.window, "Import chat", f"{exc}\n\n{UNCHANGED}")
            return None
        except OSError as exc:  # the new chat could not be saved (disk full, ...)
            QMessageBox.warning(self.window, "Import chat", f"Could not save the imported chat: "
                                f"{exc.strerror or exc}.\n\n{UNCHANGED}")
            return None
        self.pane.show_conversation(conv.id)
        note = " ".join(chat.warnings)
        self.status.emit(f"Imported “{conv.title}” ({len(conv.messages)} messages). {note}".strip(),
                         STATUS_MS * 2)
        return conv.id

    def _current(self):
        pane = self.pane
        return pane.store.get(pane.current_conv) if pane.current_conv in pane.store else None
