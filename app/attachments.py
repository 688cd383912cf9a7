"""Files in the prompt: the chips above the composer, and those in a sent message.

A file is read and checked here (core.storage.attachments: text only, with a
reason when not), then the engine counts its tokens with the loaded model's own
tokenizer (CountTokens / TokensCounted: the GUI never loads one). A file whose
tokens, with those already attached, pass what the model reads of a chat is
refused with the numbers. Sending puts every file in the message, fenced.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from omnidraft.core.storage.attachments import Attachment, AttachmentError, fenced, read_attachment
from omnidraft.core.worker.protocol import CountTokens, ErrorEvent, TokensCounted
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QVBoxLayout, QWidget

from .markdown_blocks import CodeBlock


def chip_text(attachment: Attachment) -> str:
    if attachment.tokens is None:
        return f"{attachment.name} · counting…"
    return f"{attachment.name} · {attachment.tokens:,} token{'s' if attachment.tokens != 1 else ''}"


class Chip(QFrame):
    """One file: its name and token count; × removes it (in the composer)."""

    removed = Signal()
    clicked = Signal()

    def __init__(self, attachment: Attachment, removable: bool, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("AttachmentChip")
        self.attachment = attachment
        self.label = QLabel()
        self.label.setObjectName("AttachmentName")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 3, 4 if removable else 8, 3)
        layout.setSpacing(4)
        layout.addWidget(self.label)
        if removable:
            remove = QToolButton()
            remove.setObjectName("AttachmentRemove")
            remove.setText("×")
            remove.setToolTip(f"Remove {attachment.name}")
            remove.setCursor(Qt.CursorShape.PointingHandCursor)
            remove.clicked.connect(self.removed)
            layout.addWidget(remove)
        else:
            self.setCursor(Qt.CursorShape.PointingHandCursor)
            self.setToolTip("Show or hide the file")
        self.refresh()

    def refresh(self) -> None:
        self.label.setText(chip_text(self.attachment))

    def mouseReleaseEvent(self, event) -> None:
        super().mouseReleaseEvent(event)
        self.clicked.emit()


class AttachmentTray(QWidget):
    """The files attached to the message being typed, and why one was refused."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("AttachmentTray")
        # Set by the chat pane: how to reach the engine, and the loaded model's name.
        self.send_request: Callable[[object], bool] | None = None
        self.next_id: Callable[[], int] | None = None
        self.model_name: Callable[[], str] = lambda: "The model"
        self.files: list[Attachment] = []
        self.chips: list[Chip] = []
        self._counting: dict[int, Attachment] = {}  # request id -> the file it counts
        self.row = QHBoxLayout()
        self.row.setContentsMargins(0, 0, 0, 0)
        self.row.setSpacing(6)
        self.row.addStretch(1)
        self.note = QLabel()
        self.note.setObjectName("AttachNote")
        self.note.setWordWrap(True)
        self.note.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 6)
        layout.setSpacing(4)
        layout.addLayout(self.row)
        layout.addWidget(self.note)
        self._update()

    # ------------------------------------------------------------ adding

    def add_paths(self, paths: list[str]) -> None:
        """Read each file; a readable text file is counted, anything else refused with why."""
        refused = []
        for path in paths:
            try:
                attachment = read_attachment(Path(path))
            except AttachmentError as exc:
                refused.append(str(exc))
                continue
            if any(f.name == attachment.name and f.text == attachment.text for f in self.files):
                continue  # the same file twice
            if not self._count(attachment):
                refused.append(f"{attachment.name} was not attached: the engine is not running to count "
                               "its tokens.")
                continue
            self.files.append(attachment)
            chip = Chip(attachment, removable=True)
            chip.removed.connect(lambda a=attachment: self.remove(a))
            self.chips.append(chip)
            self.row.insertWidget(self.row.count() - 1, chip)
        self.set_note(" ".join(refused))
        self._update()

    def _count(self, attachment: Attachment) -> bool:
        if self.send_request is None or self.next_id is None:
            return False
        request_id = self.next_id()
        # Counted as the model will read it: the file's name line and fences included.
        if not self.send_request(CountTokens(request_id, [fenced(attachment)])):
            return False
        self._counting[request_id] = attachment
        return True

    def on_counted(self, event: TokensCounted) -> None:
        attachment = self._counting.pop(event.request_id, None)
        if attachment is None or attachment not in self.files:
            return  # removed meanwhile
        attachment.tokens = event.counts[0]
        others = sum(f.tokens or 0 for f in self.files if f is not attachment)
        total = others + attachment.tokens
        if total > event.limit:
            self.remove(attachment)
            with_others = (f"; with the files already attached that makes {total:,}" if others else "")
            self.set_note(f"{attachment.name} was not attached: it is {attachment.tokens:,} tokens{with_others}, "
                          f"and {self.model_name()} reads at most {event.limit:,} tokens of a chat "
                          "(its context, less room for the reply).")
            return
        for chip in self.chips:
            chip.refresh()
        self._update()

    def on_error(self, event: ErrorEvent) -> bool:
        """Claims the errors that answer its counts (no model loaded): the file is refused."""
        attachment = self._counting.pop(event.request_id, None)
        if attachment is None:
            return False
        self.remove(attachment)
        self.set_note(f"{attachment.name} was not attached: {event.message}")
        return True

    # ------------------------------------------------------------ the rest

    def remove(self, attachment: Attachment) -> None:
        for chip in [c for c in self.chips if c.attachment is attachment]:
            self.chips.remove(chip)
            chip.hide()
            chip.deleteLater()
        self.files = [f for f in self.files if f is not attachment]
        self._update()

    def ready(self) -> bool:
        """Every file counted (sending waits for that)."""
        return all(f.tokens is not None for f in self.files)

    def take(self) -> list[Attachment]:
        """The files, for the message being sent; the tray is empty after."""
        files = list(self.files)
        for attachment in files:
            self.remove(attachment)
        self._counting.clear()
        self.set_note("")
        return files

    def set_note(self, text: str) -> None:
        self.note.setText(text)
        self.note.setVisible(bool(text))
        self._update()

    def _update(self) -> None:
        self.setVisible(bool(self.files) or not self.note.isHidden())
        self.changed.emit()


class MessageFiles(QWidget):
    """The files in a sent message: a chip each, a click shows the file's text."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.files: list[Attachment] = []
        self.chips: list[Chip] = []
        self.views: dict[int, CodeBlock] = {}
        self.row = QHBoxLayout()
        self.row.setContentsMargins(0, 0, 0, 0)
        self.row.setSpacing(6)
        self.row.addStretch(1)
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 2, 0, 0)
        self._layout.setSpacing(4)
        self._layout.addLayout(self.row)
        self.hide()

    def show_files(self, files: list[Attachment]) -> None:
        if [(f.name, f.text, f.tokens) for f in files] == [(f.name, f.text, f.tokens) for f in self.files]:
            return
        for widget in [*self.chips, *self.views.values()]:
            widget.hide()
            widget.deleteLater()
        self.chips.clear()
        self.views.clear()
        self.files = list(files)
        for i, attachment in enumerate(files):
            chip = Chip(attachment, removable=False)
            chip.clicked.connect(lambda i=i: self.toggle(i))
            self.chips.append(chip)
            self.row.insertWidget(self.row.count() - 1, chip)
        self.setVisible(bool(files))

    def toggle(self, i: int) -> None:
        """Show file `i`'s text under the chips (highlighted for its language), or hide it."""
        view = self.views.get(i)
        if view is None:
            view = self.views[i] = CodeBlock()
            view.show_code(self.files[i].text, self.files[i].lang)
            view.lang.setText(self.files[i].name)
            self._layout.addWidget(view)
        else:
            view.setVisible(view.isHidden())

    def restyle(self) -> None:
        for view in self.views.values():
            view.restyle()
