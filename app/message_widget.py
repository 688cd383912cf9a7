"""One message in the chat column: who wrote it, a Copy button, the body, a note."""

from __future__ import annotations

import time

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from .markdown_blocks import ReplyBody, copy_button

# A streaming reply is re-rendered whole (markdown cannot be appended to safely), so
# a long one costs more per batch. Waiting this many times the last render's cost
# before the next keeps rendering under ~20% of the GUI thread at any length.
RENDER_COST_FACTOR = 4.0


def describe_stats(stats: dict | None, baseline: float | None = None) -> str:
    """One line of what the engine measured for a reply; empty when nothing was."""
    if not stats or not stats.get("new_tokens"):
        return ""
    parts = [f"{stats['new_tokens']} tokens", f"{stats.get('tokens_per_s') or 0:.1f} tok/s"]
    if stats.get("tokens_per_step"):
        parts.append(f"{stats['tokens_per_step']:.2f} tokens/step")
    if stats.get("acceptance_rate") is not None:
        parts.append(f"{stats['acceptance_rate']:.0%} of drafts accepted")
    if baseline and stats.get("tokens_per_s"):
        parts.append(f"{stats['tokens_per_s'] / baseline:.2f}x plain speed")
    return " · ".join(parts)


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


class MessageWidget(QFrame):
    def __init__(self, role: str, author: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.role = role
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
        self.copy = copy_button(lambda: self.raw, "Copy this message")
        # Users type plain text; replies are markdown.
        self.body = ReplyBody(markdown=role != "user")
        self.note = QLabel()
        self.note.setObjectName("MessageNote")
        self.note.setWordWrap(True)
        self.note.hide()
        self.meta = QLabel()
        self.meta.setObjectName("MessageMeta")
        self.meta.hide()

        header = QHBoxLayout()
        header.setContentsMargins(0, 0, 0, 0)
        header.addWidget(self.author)
        header.addStretch(1)
        header.addWidget(self.copy)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 8, 14, 10)
        layout.setSpacing(4)
        layout.addLayout(header)
        layout.addWidget(self.body)
        layout.addWidget(self.note)
        layout.addWidget(self.meta)

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

    def set_note(self, text: str | None) -> None:
        self.note.setText(text or "")
        self.note.setVisible(bool(text))

    def set_meta(self, text: str) -> None:
        self.meta.setText(text)
        self.meta.setVisible(bool(text))

    def _render(self) -> None:
        self._render_timer.stop()
        start = time.perf_counter()
        self.body.render(self.raw, self.drafted if self.highlight else None)
        self._rendered_at = time.perf_counter()
        self._render_cost = self._rendered_at - start
