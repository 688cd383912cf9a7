"""Rendering one reply: prose as markdown, fenced code as copyable code blocks.

A reply is split into segments at ``` / ~~~ fences so each code block gets
its own monospace box with a Copy button (QTextDocument's markdown renders
code but offers no per-block action). Segments remember where they start in
the raw text so text that came from accepted drafts can be tinted after
rendering.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtGui import QColor, QFontDatabase, QGuiApplication, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from . import theme

_FENCE = re.compile(r"^[ \t]{0,3}(```+|~~~+)[ \t]*([\w+#.-]*)[^\n]*$", re.MULTILINE)


@dataclass
class Segment:
    kind: str  # "text" or "code"
    text: str
    start: int  # offset of `text` in the raw reply
    lang: str = ""


def split_segments(raw: str) -> list[Segment]:
    """Prose and fenced code, in order; an unclosed fence (still streaming) runs to the end."""
    segments: list[Segment] = []
    pos = 0
    while True:
        opening = _FENCE.search(raw, pos)
        if opening is None:
            break
        if opening.start() > pos:
            segments.append(Segment("text", raw[pos : opening.start()], pos))
        fence, lang = opening.group(1), opening.group(2)
        body_start = min(opening.end() + 1, len(raw))
        closing = re.compile(rf"^[ \t]{{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.MULTILINE)
        end = closing.search(raw, body_start)
        body_end = end.start() if end else len(raw)
        code = raw[body_start:body_end]
        segments.append(Segment("code", code.removesuffix("\n"), body_start, lang))
        if end is None:
            return segments
        pos = min(end.end() + 1, len(raw))
    if pos < len(raw) or not segments:
        segments.append(Segment("text", raw[pos:], pos))
    return segments


def align(source: str, rendered: str, lookahead: int = 16) -> list[int | None]:
    """Map each rendered character to the source character it shows.

    Markdown rendering drops markup (*, #, `, list markers) but keeps the
    words in order, so a greedy in-order match with a short lookahead finds
    nearly every character; those it cannot place map to None.
    """
    out: list[int | None] = []
    j = 0
    for ch in rendered:
        limit = min(len(source), j + lookahead)
        k = source.find(ch, j, limit)
        if k < 0:
            out.append(None)
        else:
            out.append(k)
            j = k + 1
    return out


def tint_ranges(drafted: list[bool], offset: int, mapping: list[int | None]) -> list[tuple[int, int]]:
    """Runs of rendered positions whose source character came from accepted drafts."""
    runs: list[tuple[int, int]] = []
    start = None
    for pos, src in enumerate(mapping):
        hit = src is not None and 0 <= src + offset < len(drafted) and drafted[src + offset]
        if hit and start is None:
            start = pos
        elif not hit and start is not None:
            runs.append((start, pos))
            start = None
    if start is not None:
        runs.append((start, len(mapping)))
    return runs


class AutoHeightBrowser(QTextBrowser):
    """A read-only text view as tall as its content, so the chat column scrolls, not it."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setOpenExternalLinks(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.document().setDocumentMargin(2)
        self.document().contentsChanged.connect(self._fit)

    def _fit(self) -> None:
        doc = self.document()
        doc.setTextWidth(self.viewport().width())
        height = int(doc.size().height()) + self.frameWidth() * 2 + 2
        if height != self.height():
            self.setFixedHeight(height)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit()

    def sizeHint(self) -> QSize:
        return QSize(200, self.height())

    def tint(self, runs: list[tuple[int, int]]) -> None:
        fmt = QTextCharFormat()
        # Soft green, "this text was proposed by the drafter and accepted", in the theme's shade.
        fmt.setBackground(QColor(theme.current().draft_tint))
        cursor = QTextCursor(self.document())
        for a, b in runs:
            cursor.setPosition(a)
            cursor.setPosition(b, QTextCursor.MoveMode.KeepAnchor)
            cursor.mergeCharFormat(fmt)


def copy_button(get_text, tooltip: str) -> QToolButton:
    """A small 'Copy' button that says 'Copied' for a moment, so the click is visible."""
    button = QToolButton()
    button.setText("Copy")
    button.setToolTip(tooltip)
    button.setObjectName("CopyButton")
    button.setCursor(Qt.CursorShape.PointingHandCursor)

    def clicked() -> None:
        QGuiApplication.clipboard().setText(get_text())
        button.setText("Copied")
        # Tied to the button: a chat switched within the moment deletes it first.
        QTimer.singleShot(1200, button, lambda: button.setText("Copy"))

    button.clicked.connect(clicked)
    return button


class TextBlock(AutoHeightBrowser):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("TextBlock")
        self._shown: tuple[str, bool] | None = None

    def show_markdown(self, text: str, markdown: bool = True) -> bool:
        """Render `text`; returns False when it was already showing (nothing to redo)."""
        if self._shown == (text, markdown):
            return False
        self._shown = (text, markdown)
        if markdown:
            self.setMarkdown(text)
        else:
            self.setPlainText(text)
        return True


class CodeBlock(QFrame):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("CodeBlock")
        self.lang = QLabel()
        self.lang.setObjectName("CodeLang")
        self.view = AutoHeightBrowser()
        self.view.setObjectName("CodeView")
        self.view.setLineWrapMode(QTextBrowser.LineWrapMode.WidgetWidth)
        self.view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self._code = ""

        header = QHBoxLayout()
        header.setContentsMargins(10, 4, 4, 0)
        header.addWidget(self.lang)
        header.addStretch(1)
        header.addWidget(copy_button(lambda: self._code, "Copy this code block"))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 6)
        layout.setSpacing(0)
        layout.addLayout(header)
        inner = QHBoxLayout()
        inner.setContentsMargins(10, 0, 10, 0)
        inner.addWidget(self.view)
        layout.addLayout(inner)

    def code(self) -> str:
        return self._code

    def show_code(self, code: str, lang: str) -> bool:
        if code == self._code and self.lang.text() == (lang or "code"):
            return False
        self._code = code
        self.lang.setText(lang or "code")
        self.view.setPlainText(code)
        return True


class ReplyBody(QWidget):
    """The segments of one message, re-rendered incrementally while it streams."""

    def __init__(self, markdown: bool = True, parent: QWidget | None = None):
        super().__init__(parent)
        self.markdown = markdown
        self.blocks: list[TextBlock | CodeBlock] = []
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(6)

    def render(self, raw: str, drafted: list[bool] | None = None) -> None:
        segments = split_segments(raw) if self.markdown else [Segment("text", raw, 0)]
        for i, seg in enumerate(segments):
            block = self._block(i, seg.kind)
            if seg.kind == "code":
                changed = block.show_code(seg.text, seg.lang)
                view = block.view
            else:
                changed = block.show_markdown(seg.text, self.markdown)
                view = block
            if changed and drafted and any(drafted[seg.start : seg.start + len(seg.text)]):
                rendered = view.document().toRawText().replace("\u2029", "\n")
                view.tint(tint_ranges(drafted, seg.start, align(seg.text, rendered)))
        for block in self.blocks[len(segments) :]:
            block.deleteLater()
        del self.blocks[len(segments) :]

    def reset(self) -> None:
        """Forget what is shown so the next render redraws every block (e.g. tint toggled)."""
        for block in self.blocks:
            block.deleteLater()
        self.blocks.clear()

    def _block(self, index: int, kind: str) -> TextBlock | CodeBlock:
        wanted = CodeBlock if kind == "code" else TextBlock
        if index < len(self.blocks) and isinstance(self.blocks[index], wanted):
            return self.blocks[index]
        block = wanted()
        if index < len(self.blocks):
            old = self.blocks[index]
            self._layout.replaceWidget(old, block)
            old.deleteLater()
            self.blocks[index] = block
        else:
            self._layout.addWidget(block)
            self.blocks.append(block)
        return block

    def code_blocks(self) -> list[CodeBlock]:
        return [b for b in self.blocks if isinstance(b, CodeBlock)]
