"""One message in the chat column: who wrote it, its actions, the body, a note.

Actions: Copy on every message; Edit on the user's (edited in place, then sent
again: the conversation forks there); Regenerate on the last reply and Continue
on a last reply that stopped at the token limit; "‹ 2/3 ›" on a message that
starts one of several versions. The widget only asks; the chat pane does it.
"""

from __future__ import annotations

import math
import time

from omnidraft.core.storage.attachments import split_attachments
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from .attachments import MessageFiles
from .markdown_blocks import ReplyBody, copy_button

# A streaming reply is re-rendered whole (markdown cannot be appended to safely), so
# a long one costs more per batch. Waiting this many times the last render's cost
# before the next keeps rendering under ~20% of the GUI thread at any length.
RENDER_COST_FACTOR = 4.0


def describe_stats(stats: dict | None, baseline: float | None = None) -> str:
    """One line of what the engine measured for a reply; empty when nothing was."""
    if not stats or not stats.get("new_tokens"):
        return ""
    parts = [f"{stats['new_tokens']} tokens"]
    if stats.get("first_token_seconds"):  # replies saved before it was measured have none
        parts.append(f"first after {stats['first_token_seconds']:.1f} s")
    speed = stats.get("tokens_per_s")  # None (or not a number) in an imported chat: not known
    parts.append(f"{speed:.1f} tok/s" if isinstance(speed, int | float) and math.isfinite(speed) else "speed unknown")
    if stats.get("tokens_per_step"):
        parts.append(f"{stats['tokens_per_step']:.2f} tokens/step")
    if stats.get("acceptance_rate") is not None:
        parts.append(f"{stats['acceptance_rate']:.0%} of drafts accepted")
    if (speedup := reply_speedup(stats, baseline)) is not None:
        parts.append(f"{speedup:.2f}x plain speed")
    return " · ".join(parts)


def reply_speedup(stats: dict, baseline: float | None) -> float | None:
    """A drafted reply's speedup over plain decoding as the engine estimated it;
    replies saved by versions without the estimate: their speed over the baseline."""
    if stats.get("method") == "target":
        return None  # it was plain decoding
    if "plain_seconds" in stats:
        return stats.get("speedup")
    return stats["tokens_per_s"] / baseline if baseline and stats.get("tokens_per_s") else None


def runs_from_mask(mask: list[bool]) -> list[list[int]]:
    """[start, end) runs of True: a compact way to persist which text was drafted."""
    runs, start = [], None
    for i, flag in enumerate(mask):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            runs.append([start, i])
            start = None
    if start is not None:
        runs.append([start, len(mask)])
    return runs


def mask_from_runs(runs: list, length: int) -> list[bool]:
    mask = [False] * length
    for a, b in runs or []:
        for i in range(max(0, int(a)), min(length, int(b))):
            mask[i] = True
    return mask


def action_button(text: str, tooltip: str, slot, name: str = "MessageAction") -> QToolButton:
    button = QToolButton()
    button.setText(text)
    button.setToolTip(tooltip)
    button.setObjectName(name)
    button.setCursor(Qt.CursorShape.PointingHandCursor)
    button.clicked.connect(slot)
    return button


class MessageWidget(QFrame):
    edited = Signal(str)  # a user message, edited: send it again in its place
    version_requested = Signal(int)  # the position of the version to show instead
    regenerate_requested = Signal()
    continue_requested = Signal()

    def __init__(self, role: str, author: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.role = role
        self.index = -1  # its place in the conversation's messages (set by the chat view)
        self.version: tuple[int, int] | None = None  # (position, count) when it has versions
        self.setObjectName("UserMessage" if role == "user" else "AssistantMessage")
        self.raw = ""
        self.drafted: list[bool] = []  # per character of raw: came from accepted drafts
        self.highlight = False
        self._render_cost = 0.0
        self._rendered_at = 0.0
        self._render_timer = QTimer(self, singleShot=True)
        self._render_timer.timeout.connect(self._render)

        self.author = QLabel(author)
        self.author.setObjectName("Author")
        # The raw text: a reply's Markdown source, fences and all, as the model wrote it.
        self.copy = copy_button(lambda: self.raw, "Copy this message" if role == "user" else
                                "Copy this reply as Markdown")
        # Users type plain text; replies are markdown.
        self.body = ReplyBody(markdown=role != "user")
        self.files = MessageFiles()  # the files a user message holds, as chips
        self.note = QLabel()
        self.note.setObjectName("MessageNote")
        self.note.setWordWrap(True)
        self.note.hide()
        self.meta = QLabel()
        self.meta.setObjectName("MessageMeta")
        self.meta.hide()

        self.previous = action_button("‹", "Previous version", lambda: self._step_version(-1), "VersionArrow")
        self.next = action_button("›", "Next version", lambda: self._step_version(1), "VersionArrow")
        self.version_label = QLabel()
        self.version_label.setObjectName("VersionLabel")
        self.edit = action_button("Edit", "Edit this message and send it again", self.open_editor)
        self.regenerate = action_button("Regenerate", "Write this reply again (this one is kept)",
                                        self.regenerate_requested)
        self.continue_ = action_button("Continue", "Go on writing this reply", self.continue_requested)
        self.versions_row = (self.previous, self.version_label, self.next)
        self.actions = (self.edit, self.regenerate, self.continue_)

        header = QHBoxLayout()
        header.setContentsMargins(0, 0, 0, 0)
        header.setSpacing(2)
        header.addWidget(self.author)
        header.addSpacing(8)
        for widget in self.versions_row:
            header.addWidget(widget)
        header.addStretch(1)
        for widget in (*self.actions, self.copy):
            header.addWidget(widget)
        self.editor = QPlainTextEdit()
        self.editor.setObjectName("MessageEditor")
        self.editor.setTabChangesFocus(True)
        self.edit_buttons = QWidget()
        edit_row = QHBoxLayout(self.edit_buttons)
        edit_row.setContentsMargins(0, 0, 0, 0)
        edit_row.addStretch(1)
        self.cancel_edit = action_button("Cancel", "Keep the message as it was", self.close_editor)
        self.send_edit = action_button("Send", "Send the edited message (the old one is kept)", self._send_edit,
                                       "EditSendButton")
        edit_row.addWidget(self.cancel_edit)
        edit_row.addWidget(self.send_edit)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 8, 14, 10)
        layout.setSpacing(4)
        layout.addLayout(header)
        for widget in (self.body, self.files, self.editor, self.edit_buttons, self.note, self.meta):
            layout.addWidget(widget)
        self.close_editor()
        self.set_version(None)
        self.set_actions(False, False)

    # ------------------------------------------------------------ actions

    def set_version(self, version: tuple[int, int] | None) -> None:
        """(position, count) of the version this message starts, or None."""
        self.version = version
        for widget in self.versions_row:
            widget.setVisible(version is not None)
        if version is not None:
            position, count = version
            self.version_label.setText(f"{position + 1}/{count}")
            self.previous.setEnabled(position > 0)
            self.next.setEnabled(position < count - 1)

    def set_actions(self, regenerate: bool, continue_: bool) -> None:
        """Which of Regenerate and Continue this reply offers (Edit: every user message)."""
        self.edit.setVisible(self.role == "user" and self.editor.isHidden())
        self.regenerate.setVisible(regenerate)
        self.continue_.setVisible(continue_)

    def set_actions_enabled(self, on: bool) -> None:
        """Off while a reply is being written: the conversation must not change under it."""
        for widget in (*self.actions, self.previous, self.next, self.send_edit):
            widget.setEnabled(on)
        if on and self.version is not None:
            self.set_version(self.version)  # first/last keep their arrow off

    def _step_version(self, step: int) -> None:
        if self.version is not None:
            self.version_requested.emit(self.version[0] + step)

    def open_editor(self) -> None:
        self.editor.setPlainText(self.raw)
        self.editor.setFixedHeight(max(60, min(240, int(self.body.height()) + 24)))
        self._show_editor(True)
        self.editor.setFocus()

    def close_editor(self) -> None:
        self._show_editor(False)

    def _show_editor(self, on: bool) -> None:
        for widget in (self.editor, self.edit_buttons):
            widget.setVisible(on)
        self.body.setVisible(not on)
        self.edit.setVisible(self.role == "user" and not on)

    def _send_edit(self) -> None:
        text = self.editor.toPlainText().strip()
        if text:
            self.close_editor()
            self.edited.emit(text)

    # ------------------------------------------------------------ content

    def looks(self) -> tuple[str, str, str, list[bool]]:
        """Role, author, text and drafted mask, as the chat view compares them."""
        return self.role, self.author.text(), self.raw, self.drafted

    def set_text(self, raw: str, drafted: list[bool] | None = None) -> None:
        self.raw = raw
        self.drafted = list(drafted) if drafted is not None else [False] * len(raw)
        self._render()

    def append(self, pieces: list[tuple[str, bool]]) -> None:
        for text, from_draft in pieces:
            self.raw += text
            self.drafted.extend([bool(from_draft)] * len(text))
        if self._render_timer.isActive():
            return  # already scheduled; it will show this text too
        wait = self._rendered_at + self._render_cost * RENDER_COST_FACTOR - time.perf_counter()
        if wait <= 0:
            self._render()
        else:
            self._render_timer.start(max(1, int(wait * 1000)))

    def flush(self) -> None:
        """Show everything appended so far now (the reply finished)."""
        if self._render_timer.isActive():
            self._render()

    def set_highlight(self, on: bool) -> None:
        if on != self.highlight:
            self.highlight = on
            self.body.reset()  # the tint is baked into the rendered blocks
            self._render()

    def restyle(self) -> None:
        for block in self.body.code_blocks():
            block.restyle()  # the code's colours come from the theme
        self.files.restyle()
        if self.highlight:
            self.body.reset()  # the tint's colour is baked into the rendered blocks
            self._render()

    def set_found(self, on: bool) -> None:
        """Mark it as the message a search opened (the style sheet's [found] rule)."""
        self.setProperty("found", on)
        self.style().unpolish(self)
        self.style().polish(self)

    def set_note(self, text: str | None) -> None:
        self.note.setText(text or "")
        self.note.setVisible(bool(text))

    def set_meta(self, text: str) -> None:
        self.meta.setText(text)
        self.meta.setVisible(bool(text))

    def _render(self) -> None:
        self._render_timer.stop()
        start = time.perf_counter()
        text = self.raw
        if self.role == "user":  # attached files show as chips, not as the fenced text the model reads
            text, files = split_attachments(self.raw)
            self.files.show_files(files)
        self.body.render(text, self.drafted if self.highlight else None)
        self._rendered_at = time.perf_counter()
        self._render_cost = self._rendered_at - start
