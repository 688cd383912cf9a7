"""File → Export chat as Markdown / JSON and Import chat: the GUI side of
core/storage/chat_export.

Each command has a method taking a path (what tests call) and an ask_ variant
that first shows the file dialog. An import that fails says why in a box and
changes nothing; one that works adds a new chat and puts it on screen. The
menu's import reads, checks, encrypts and saves the file on a background
thread (a chat at the 20 MB cap takes seconds), so the window stays responsive.
"""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path

from omnidraft.core.storage.chat_export import (
    ChatImportError,
    ImportedChat,
    read_chat_file,
    write_export,
)
from omnidraft.core.storage.conversations import Conversation
from omnidraft.core.storage.persistence import save_failure
from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

from .actions import ActionSpec
from .chat_pane import ChatPane
from .target_control import STATUS_MS

log = logging.getLogger(__name__)
KINDS = {"markdown": ("Markdown", ".md", "Markdown (*.md)"), "json": ("JSON", ".json", "JSON (*.json)")}
UNCHANGED = "Nothing was imported; your chats are unchanged."


def file_name(title: str, suffix: str) -> str:
    """A file name from a chat title: letters, digits, spaces and dashes only."""
    stem = re.sub(r"[^\w\- ]+", "", title).strip()[:60].strip() or "chat"
    return stem + suffix


class ChatFiles(QObject):
    status = Signal(str, int)  # status-bar text, ms
    imported = Signal(object)  # the new chat's id, or None when the import was refused
    _done = Signal(object, object, object)  # (chat, conversation, refusal) from the import thread

    def __init__(self, pane: ChatPane, window: QWidget):
        super().__init__(window)
        self.pane, self.window = pane, window
        self.importing: threading.Thread | None = None
        self._done.connect(self._finish_import)  # queued: it runs on the window's thread

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
            self.import_in_background(Path(path))

    def import_file(self, path: Path) -> str | None:
        """Add the chat in `path` as a new conversation and show it; its id, or None
        when the file was refused (the box says why). Waits for it."""
        chat, conv, refusal = self._read_and_save(path)
        return self._finish_import(chat, conv, refusal)

    def import_in_background(self, path: Path) -> None:
        """import_file on a background thread; `imported` says when it is done."""
        if self.importing is not None and self.importing.is_alive():
            self.status.emit("An import is still under way; try again when it is done.", STATUS_MS)
            return
        self.status.emit(f"Importing {path.name}…", 0)
        self.importing = threading.Thread(target=lambda: self._done.emit(*self._read_and_save(path)),
                                          name="chat-import", daemon=True)
        self.importing.start()

    def _read_and_save(self, path: Path) -> tuple[ImportedChat | None, Conversation | None, str | None]:
        """Read, check and save the chat in `path` (any thread): (chat, its saved
        conversation, None), or (None, None, why it was refused)."""
        try:
            chat = read_chat_file(path)
            conv = self.pane.store.write_new(chat.title, chat.messages, chat.system_prompt, chat.model_id,
                                             chat.created)
        except ChatImportError as exc:
            return None, None, str(exc)
        except OSError as exc:  # the new chat could not be saved (a full disk, ...)
            return None, None, save_failure("the imported chat", self.pane.store.folder, exc,
                                            2 * path.stat().st_size, then="")
        except Exception:  # a thread's failure must still answer (the log has the rest)
            log.exception("importing %s failed", path)
            return None, None, f"{path.name} could not be imported: something in it is not what a chat holds."
        return chat, conv, None

    def _finish_import(self, chat: ImportedChat | None, conv: Conversation | None, refusal: str | None) -> str | None:
        if refusal is not None or chat is None or conv is None:
            self.status.emit("", 1)
            QMessageBox.warning(self.window, "Import chat", f"{refusal}\n\n{UNCHANGED}")
            self.imported.emit(None)
            return None
        self.pane.store.adopt(conv)
        self.pane.show_conversation(conv.id)
        note = " ".join(chat.warnings)
        self.status.emit(f"Imported “{conv.title}” ({len(conv.messages):,} messages). {note}".strip(),
                         STATUS_MS * 2)
        self.imported.emit(conv.id)
        return conv.id

    def _current(self):
        pane = self.pane
        return pane.store.get(pane.current_conv) if pane.current_conv in pane.store else None
