"""Rendering one reply: prose as markdown, fenced code as copyable code blocks.

A reply is split into segments at ``` / ~~~ fences so each code block gets
its own monospace box with a Copy button (QTextDocument's markdown renders
code but offers no per-block action). Segments remember where they start in
the raw text so text that came from accepted drafts can be tinted after
rendering.

Code is coloured by Pygments: the fence's language names the lexer, else
Pygments guesses (accepted only for a common language; plain text otherwise).
Lexing a long block takes a few hundred milliseconds of pure Python, so it runs
on a background thread; the GUI thread only applies the finished token spans,
a slice of lines per event-loop pass, as layout formats (colour_lines). The
token types are kept, so a theme switch re-colours without lexing again.
"""

from __future__ import annotations

import re
import time
from bisect import bisect_right
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name, guess_lexer
from pygments.styles import get_style_by_name
from pygments.token import Token, _TokenType
from pygments.util import ClassNotFound
from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QGuiApplication,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextLayout,
)
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
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


# ------------------------------------------------------------------ highlighting

# Guessing reads the start of a block only (Pygments' guess scores every lexer it has).
GUESS_CHARS = 2000
# Pygments' guess is unreliable on short snippets (it may answer an obscure
# language); a guess outside these common ones shows the block as plain text.
GUESSABLE = frozenset({
    "bash", "batch", "c", "cmake", "cpp", "csharp", "css", "dart", "diff", "docker", "elixir", "go",
    "haskell", "html", "ini", "java", "javascript", "json", "kotlin", "lua", "make", "markdown",
    "objective-c", "perl", "php", "powershell", "python", "r", "ruby", "rust", "scala", "scss", "sql",
    "swift", "tex", "toml", "typescript", "xml", "yaml", "zig",
})
# Work per event-loop pass: lexing runs this long, then this many lines are coloured,
# so a 2,000-line block is done in many short passes instead of one long one.
LEX_SLICE_S = 0.008
APPLY_LINES = 100
_POLL_MS = 10
CODE_MAX_LINES = 40  # a longer block scrolls inside its box (see CodeView)

Spans = list[list[tuple[int, int, _TokenType]]]  # per line: (start, length, token type)
# Choosing the lexer runs here: a guess scores every lexer Pygments has (tens of
# ms; the first also imports them all), and a lexer's first use compiles its
# rules. Lexing, long but divisible, runs in slices on the GUI thread, where it
# does not contend for the GIL with a thread.
_guessing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="code-language-guess")


def named_lexer(lang: str) -> Lexer | None:
    try:
        return get_lexer_by_name(lang.lower(), stripnl=False, ensurenl=False) if lang else None
    except ClassNotFound:
        return None  # an unknown name ("pseudo", "output"): guessed as for no name


def guessed_lexer(code: str) -> Lexer | None:
    """Pygments' guess from the start of `code`, when it is a common language."""
    try:
        guessed = guess_lexer(code[:GUESS_CHARS], stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None
    return guessed if guessed.aliases and guessed.aliases[0] in GUESSABLE else None


def lexer_for(lang: str, code: str) -> Lexer | None:
    """The lexer for a block fenced as `lang` ("" when none), or a guess from its
    text; None for plain text."""
    return choose_lexer(lang, code)[0]


def choose_lexer(lang: str, code: str) -> tuple[Lexer | None, bool]:
    """lexer_for's answer, and whether it came from the name (not a guess)."""
    named = named_lexer(lang)
    return (named, True) if named is not None else (guessed_lexer(code), False)


class Lexing:
    """Token spans of `code`, found a slice at a time (run until done)."""

    def __init__(self, code: str, lexer: Lexer | None):
        self.code = code
        self.starts = [0] + [m.end() for m in re.finditer("\n", code)]
        self.spans: Spans = [[] for _ in self.starts]
        self._tokens = lexer.get_tokens_unprocessed(code) if lexer is not None else iter(())

    def run(self, seconds: float = float("inf")) -> bool:
        """Lex for about `seconds`; True once every token is placed."""
        deadline = time.perf_counter() + seconds
        starts, spans = self.starts, self.spans
        for n, (index, ttype, value) in enumerate(self._tokens):
            if ttype not in Token.Text:  # plain text keeps the theme's own colour
                line = bisect_right(starts, index) - 1
                pos = index
                for k, piece in enumerate(value.split("\n")):
                    if k:
                        line += 1
                    if piece and line < len(spans):
                        spans[line].append((pos - starts[line], len(piece), ttype))
                    pos += len(piece) + 1
            if n % 64 == 63 and time.perf_counter() > deadline:
                return False
        return True


def token_spans(code: str, lexer: Lexer | None) -> Spans:
    """Each line's coloured runs, in the line's own character positions."""
    lexing = Lexing(code, lexer)
    lexing.run()
    return lexing.spans


_formats: dict[str, dict[_TokenType, QTextCharFormat | None]] = {}


def token_format(style_name: str, ttype: _TokenType) -> QTextCharFormat | None:
    """The character format Pygments' style gives a token type (None: plain text)."""
    formats = _formats.setdefault(style_name, {})
    if ttype not in formats:
        style = get_style_by_name(style_name)
        rule, plain = style.style_for_token(ttype), style.style_for_token(Token.Text)
        fmt = QTextCharFormat()
        if rule["color"] and rule["color"] != plain["color"]:
            fmt.setForeground(QColor(f"#{rule['color']}"))
        if rule["bold"]:  # code lines never wrap, so a bolder glyph leaves the height as it is
            fmt.setFontWeight(QFont.Weight.Bold)
        if rule["italic"]:
            fmt.setFontItalic(True)
        formats[ttype] = fmt if fmt.propertyCount() else None
    return formats[ttype]


def colour_lines(document: QTextDocument, spans: Spans, style_name: str, first: int, count: int) -> int:
    """Give lines first..first+count-1 their token colours; the next line to do, or -1.

    The formats go on each line's layout (as QSyntaxHighlighter's do, so they sit
    beside the draft tint's character formats), and the document is told once for
    the whole range: a QSyntaxHighlighter tells it once per line, and each telling
    lays out the rest of the block again."""
    block = document.findBlockByNumber(first)
    if not block.isValid():
        return -1
    start = block.position()
    end = start
    while block.isValid() and block.blockNumber() < first + count:
        ranges = []
        line = spans[block.blockNumber()] if block.blockNumber() < len(spans) else ()
        length = block.length() - 1
        for pos, size, ttype in line:
            if pos < length and (fmt := token_format(style_name, ttype)) is not None:
                r = QTextLayout.FormatRange()
                r.start, r.length, r.format = pos, min(size, length - pos), fmt
                ranges.append(r)
        block.layout().setFormats(ranges)
        end = block.position() + block.length()
        block = block.next()
    document.markContentsDirty(start, end - start)
    return block.blockNumber() if block.isValid() else -1


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
        # Not yet shown: its width is a default one, and laying a long text out at
        # it would be thrown away once the layout gives it its real width.
        if not self.isVisible():
            return
        doc = self.document()
        doc.setTextWidth(self.viewport().width())
        height = int(doc.size().height()) + self.frameWidth() * 2 + 2
        if height != self.height():
            self.setFixedHeight(height)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self._fit()

    def sizeHint(self) -> QSize:
        return QSize(200, self.height())

    def tint(self, runs: list[tuple[int, int]]) -> None:
        tint_document(self.document(), runs)


def tint_document(document: QTextDocument, runs: list[tuple[int, int]]) -> None:
    fmt = QTextCharFormat()
    # Soft green, "this text was proposed by the drafter and accepted", in the theme's shade.
    fmt.setBackground(QColor(theme.current().draft_tint))
    cursor = QTextCursor(document)
    for a, b in runs:
        cursor.setPosition(a)
        cursor.setPosition(b, QTextCursor.MoveMode.KeepAnchor)
        cursor.mergeCharFormat(fmt)


class CodeView(QPlainTextEdit):
    """Code as written: lines unwrapped (a wider one scrolls sideways), the view as
    tall as its lines up to CODE_MAX_LINES, a longer block scrolling inside it.

    A view as tall as 2,000 lines would have Qt lay out and measure every one of
    them whenever it is shown or resized (a visible stall); this way only the
    lines in view are ever laid out, and the height is counted, not measured."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("CodeView")
        self.setReadOnly(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                     | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.document().setDocumentMargin(2)
        self.document().blockCountChanged.connect(self._fit)
        self.horizontalScrollBar().rangeChanged.connect(self._fit)

    def _fit(self, *_args) -> None:
        doc = self.document()
        line = self.blockBoundingRect(doc.firstBlock()).height() or self.fontMetrics().lineSpacing()
        lines = min(doc.blockCount(), CODE_MAX_LINES)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded if doc.blockCount() > lines
                                        else Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        bar = self.horizontalScrollBar()
        height = (int(lines * line + 2 * doc.documentMargin()) + self.frameWidth() * 2 + 2
                  + (bar.sizeHint().height() if bar.maximum() > 0 else 0))
        if height != self.height():
            self.setFixedHeight(height)

    def setPlainText(self, text: str) -> None:
        super().setPlainText(text)
        self._fit()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self._fit()  # the font's line height is final once the style sheet is applied

    def sizeHint(self) -> QSize:
        return QSize(200, self.height())

    def tint(self, runs: list[tuple[int, int]]) -> None:
        tint_document(self.document(), runs)


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
        self.view = CodeView()
        self.view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self._code = ""
        self._lang = ""
        self.style_name = theme.current().code_style
        self.spans: Spans = []
        self._lexer: Lexer | None = None
        self._guessed_on = -1  # the length of code the lexer was chosen on (-1: not yet)
        self._guess: Future | None = None  # the lexer being chosen, on its thread
        self._named = False  # the lexer came from the fence's language name
        self._lexing: Lexing | None = None
        self._spans_for: str | None = None  # the code the applied spans were lexed from
        self._apply_at = -1  # the next line to colour; -1 when all are
        self._timer = QTimer(self)
        self._timer.setInterval(_POLL_MS)
        self._timer.timeout.connect(self._step)

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
        if code == self._code and lang == self._lang:
            return False
        if lang != self._lang:
            self._lexer, self._named, self._guessed_on, self._lexing = None, False, -1, None
            self.lang.setText(lang or "code")
        if self._code and code.startswith(self._code) and lang == self._lang:
            # A streaming block grows at its end: append, so earlier lines keep their layout.
            cursor = QTextCursor(self.view.document())
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.insertText(code[len(self._code):])
        else:
            self.spans, self._spans_for, self._lexing = [], None, None  # old colours would land on new lines
            self.view.setPlainText(code)
        self._code, self._lang = code, lang
        self._timer.start()
        return True

    def highlighted(self) -> bool:
        """Whether the colours shown are those of the code shown (nothing left to do)."""
        return self._lexing is None and self._spans_for == self._code and self._apply_at < 0

    def restyle(self) -> None:
        """The theme changed: the same tokens in the new theme's colours."""
        self.style_name = theme.current().code_style
        self._apply_at = 0
        self._timer.start()

    def _step(self) -> None:
        """One slice of work: choose the lexer, lex a while, colour some lines."""
        if self._guess is not None:
            if not self._guess.done():
                return
            (self._lexer, self._named), self._guess = self._guess.result(), None
            if not self._named:  # unnamed, or a name Pygments does not know: say what it guessed
                self.lang.setText(self._lang or (self._lexer.aliases[0] if self._lexer else "code"))
        if self._lexing is None and self._spans_for != self._code:
            # A named language's lexer is found once; a guess is made again while the
            # block is still short enough that more text may change the answer.
            shown = min(len(self._code), GUESS_CHARS)
            if self._guessed_on < 0 or (self._guessed_on < shown and not self._named):
                self._guessed_on = shown
                self._guess = _guessing.submit(choose_lexer, self._lang, self._code)
                return
            self._lexing = Lexing(self._code, self._lexer)
        if self._lexing is not None and self._lexing.run(LEX_SLICE_S):
            done, self._lexing = self._lexing, None
            old = self.spans
            self.spans, self._spans_for = done.spans, done.code
            # Lines that kept their text and tokens keep their colours.
            same = next((i for i, (a, b) in enumerate(zip(old, done.spans)) if a != b), min(len(old), len(done.spans)))
            first = max(0, min(same, len(old) - 1))
            self._apply_at = first if self._apply_at < 0 else min(self._apply_at, first)
        if self._apply_at >= 0:
            self._apply_at = colour_lines(self.view.document(), self.spans, self.style_name,
                                          self._apply_at, APPLY_LINES)
        if self._lexing is None and self._guess is None and self._apply_at < 0 and self._spans_for == self._code:
            self._timer.stop()


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
