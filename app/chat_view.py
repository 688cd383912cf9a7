"""The chat column: messages streaming in, and the box where the user types.

Enter sends, Shift+Enter starts a new line; while a reply streams the Send
button becomes Stop. The column sticks to the bottom while a reply grows
unless the user has scrolled up to read something.
"""

from __future__ import annotations

from omnidraft.core.storage.attachments import compose
from omnidraft.core.storage.conversations import version_of
from PySide6.QtCore import QPoint, Qt, QTimer, Signal
from PySide6.QtGui import QKeyEvent, QShowEvent
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from .attachments import AttachmentTray
from .chat_session import reply_actions
from .message_widget import MessageWidget, describe_stats, mask_from_runs

COLUMN_MAX_WIDTH = 860  # long lines are hard to read; wide windows get margins instead
COMPOSER_MAX_LINES = 8
# A long chat shows its latest messages, and earlier ones a page at a time on
# request: a widget per message of a 500,000-message chat would freeze the window.
SHOWN_MESSAGES = 200
# A message longer than this shows its beginning: laying out millions of
# characters (an imported chat at the import cap) takes the window minutes.
SHOWN_CHARS = 100_000


class Composer(QPlainTextEdit):
    submitted = Signal()
    files_dropped = Signal(list)  # local paths dropped on it: attached, not pasted as text

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("Composer")
        self.setPlaceholderText("Message OmniDraft…  (Enter sends, Shift+Enter adds a line)")
        self.setTabChangesFocus(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.document().contentsChanged.connect(self._fit)
        self._fit()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        if enter:  # Shift+Enter: a plain newline, not a paragraph-separator quirk
            self.insertPlainText("\n")
            return
        super().keyPressEvent(event)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self._fit()  # again: the style sheet's padding and font apply only once it is polished

    @staticmethod
    def _local_files(event) -> list[str]:
        urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
        return [url.toLocalFile() for url in urls if url.isLocalFile()]

    def dragEnterEvent(self, event) -> None:
        if self._local_files(event):
            event.acceptProposedAction()
        else:
            super().dragEnterEvent(event)

    def dragMoveEvent(self, event) -> None:
        if self._local_files(event):
            event.acceptProposedAction()
        else:
            super().dragMoveEvent(event)

    def dropEvent(self, event) -> None:
        if paths := self._local_files(event):
            event.acceptProposedAction()
            self.files_dropped.emit(paths)
        else:
            super().dropEvent(event)

    def _fit(self) -> None:
        """Grow with the text up to a few lines, then scroll."""
        lines = max(1, min(COMPOSER_MAX_LINES, self.document().lineCount()))
        line = self.fontMetrics().lineSpacing()
        margins = self.contentsMargins()
        self.setFixedHeight(lines * line + int(self.document().documentMargin() * 2)
                            + margins.top() + margins.bottom() + 4)


def _looks(message: dict, assistant_name: str) -> tuple[str, str, str, list[bool]]:
    """What a message widget shows of a message: role, author, text, drafted mask
    (the text's first SHOWN_CHARS characters, cut_note says the rest)."""
    content = message.get("content", "")[:SHOWN_CHARS]
    author = "You" if message["role"] == "user" else message.get("author") or assistant_name
    return message["role"], author, content, mask_from_runs(message.get("drafted", []), len(content))


def cut_note(message: dict) -> str | None:
    """What a message too long to lay out says under its beginning."""
    n = len(message.get("content", ""))
    if n <= SHOWN_CHARS:
        return None
    return (f"This message is {n:,} characters long; its first {SHOWN_CHARS:,} are shown here. "
            "File → Export chat keeps all of it.")


class ChatView(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()
    # What a message's own buttons ask for, by its index in the conversation's messages.
    edit_requested = Signal(int, str)  # a user message's index, its new text
    version_requested = Signal(int, int)  # a branch point's index, the version to show
    regenerate_requested = Signal()
    continue_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("ChatView")
        self.messages: list[MessageWidget] = []
        self.highlight = False
        self.busy = False
        self._stick_to_bottom = True
        self._pinned: MessageWidget | None = None  # a message opened from search, kept in view
        self._pinning = False
        self.shown_limit = SHOWN_MESSAGES  # how many of the latest messages have widgets
        self._loaded: tuple[list[dict], str] | None = None  # what load() showed last
        self._hidden = 0  # how many of its earliest messages have no widget

        self.scroll = QScrollArea()
        self.scroll.setObjectName("ChatScroll")
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        canvas = QWidget()
        canvas.setObjectName("ChatCanvas")
        self.column = QWidget()
        self.column.setObjectName("ChatColumn")
        self.column.setMaximumWidth(COLUMN_MAX_WIDTH)
        self.column_layout = QVBoxLayout(self.column)
        self.column_layout.setContentsMargins(16, 16, 16, 16)
        self.column_layout.setSpacing(12)
        self.context_cut = QLabel(self.column)  # placed in the column where the cut is
        self.context_cut.setObjectName("ContextCut")
        self.context_cut.setWordWrap(True)
        self.context_cut.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.context_cut.hide()
        self.earlier = QPushButton()  # "Show earlier messages", above a long chat's latest ones
        self.earlier.setObjectName("EarlierMessages")
        self.earlier.clicked.connect(self.show_earlier)
        self.earlier.hide()
        self.empty_hint = QLabel()
        self.empty_hint.setObjectName("EmptyHint")
        self.empty_hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_hint.setWordWrap(True)
        self.column_layout.addWidget(self.earlier)
        self.column_layout.addWidget(self.empty_hint)
        self.column_layout.addStretch(1)
        centred = QHBoxLayout(canvas)
        centred.setContentsMargins(0, 0, 0, 0)
        centred.addStretch(1)
        centred.addWidget(self.column, 100)
        centred.addStretch(1)
        self.scroll.setWidget(canvas)
        bar = self.scroll.verticalScrollBar()
        bar.rangeChanged.connect(self._follow_bottom)
        bar.valueChanged.connect(self._user_scrolled)

        self.composer = Composer()
        self.composer.submitted.connect(self._submit)
        # Files in the prompt: the attach button, drops on the composer, the chips above it.
        self.attachments = AttachmentTray()
        self.composer.files_dropped.connect(self.attachments.add_paths)
        self.attach_button = QToolButton()
        self.attach_button.setObjectName("AttachButton")
        self.attach_button.setText("+")
        self.attach_button.setToolTip("Attach text or source files (or drop them on the message box)")
        self.attach_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.attach_button.clicked.connect(self.choose_files)
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("SendButton")
        self.send_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.send_button.clicked.connect(self._send_or_stop)
        compose_row = QHBoxLayout()
        compose_row.setContentsMargins(0, 0, 0, 0)
        compose_row.setSpacing(8)
        compose_row.addWidget(self.attach_button, 0, Qt.AlignmentFlag.AlignBottom)
        compose_row.addWidget(self.composer, 1)
        compose_row.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        compose = QFrame()
        compose.setObjectName("ComposeBar")
        compose_inner = QHBoxLayout(compose)
        compose_inner.setContentsMargins(16, 10, 16, 14)
        compose_inner.addStretch(1)
        holder = QWidget()
        holder.setMaximumWidth(COLUMN_MAX_WIDTH)
        holder_layout = QVBoxLayout(holder)
        holder_layout.setContentsMargins(0, 0, 0, 0)
        holder_layout.setSpacing(0)
        holder_layout.addWidget(self.attachments)
        holder_layout.addLayout(compose_row)
        compose_inner.addWidget(holder, 100)
        compose_inner.addStretch(1)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.scroll, 1)
        layout.addWidget(compose)
        self.set_empty_hint("")

    # ------------------------------------------------------------ content

    def clear(self) -> None:
        for widget in self.messages:
            widget.hide()
            widget.deleteLater()
        self.messages.clear()
        self.context_cut.hide()
        self.earlier.hide()
        self.empty_hint.show()
        self._loaded = None
        self.shown_limit = SHOWN_MESSAGES

    def show_earlier(self) -> None:
        """Give the next page of earlier messages their widgets."""
        if self._loaded is not None:
            self.shown_limit += SHOWN_MESSAGES
            self._stick_to_bottom = False  # stay with what the person reads
            self.load(*self._loaded)

    def load(self, messages: list[dict], assistant_name: str) -> None:
        """Show a conversation: its latest `shown_limit` messages (show_earlier adds
        more). The messages already shown as they are stay (a new turn, an edit or a
        switch of version re-renders only what changed)."""
        visible = [i for i, m in enumerate(messages) if m.get("role") != "system"]
        hidden = max(0, len(visible) - self.shown_limit)
        if self._loaded is None or self._loaded[0] is not messages:  # another chat: its latest page
            self.shown_limit = SHOWN_MESSAGES
            hidden = max(0, len(visible) - self.shown_limit)
        else:  # the same chat: new turns add widgets below, the ones shown stay
            hidden = min(hidden, self._hidden)
        self._loaded, self._hidden = (messages, assistant_name), hidden
        shown = [(i, messages[i], _looks(messages[i], assistant_name)) for i in visible[hidden:]]
        self.earlier.setText(f"Show earlier messages ({hidden:,} not shown)")
        self.earlier.setVisible(hidden > 0)
        keep = 0
        while keep < min(len(self.messages), len(shown)) and self.messages[keep].looks() == shown[keep][2]:
            keep += 1
        for widget in self.messages[keep:]:
            widget.hide()  # at once: deleteLater leaves it in the column until the next loop pass
            widget.deleteLater()
        del self.messages[keep:]
        for _, _, (role, author, content, drafted) in shown[keep:]:
            self._add(role, author).set_text(content, drafted)
        for widget, (i, m, _) in zip(self.messages, shown):
            widget.flush()
            widget.index = i
            widget.set_note(" ".join(filter(None, [m.get("note"), cut_note(m)])) or None)
            widget.set_meta(describe_stats(m.get("stats"), m.get("baseline_tokens_per_s")))
            widget.set_version(version_of(m))
            widget.set_actions(*reply_actions(messages, i))
        self._place_context_cut(messages)
        self.empty_hint.setVisible(not self.messages)
        if keep < len(shown):  # something new at the end: show it (else stay where the user reads)
            self._stick_to_bottom = True

    def _place_context_cut(self, messages: list[dict]) -> None:
        """A line above the first message the model read for the latest reply, when it
        left older ones out to fit its context (ChatSession saves where it began)."""
        self.column_layout.removeWidget(self.context_cut)
        self.context_cut.hide()
        cut = next((m["context_from"] for m in reversed(messages) if "context_from" in m), 0)
        above = [w for w in self.messages if w.index < cut]
        if cut and len(above) < len(self.messages):
            self.context_cut.setText(
                f"The model no longer reads the {len(above)} message{'s' if len(above) != 1 else ''} above: "
                "this chat outgrew its context (Settings → Context length). The system prompt is always kept."
            )
            self.column_layout.insertWidget(self.column_layout.indexOf(self.messages[len(above)]), self.context_cut)
            self.context_cut.show()

    def current_reply(self) -> MessageWidget | None:
        if self.messages and self.messages[-1].role == "assistant":
            return self.messages[-1]
        return None

    def stream(self, pieces: list[tuple[str, bool]]) -> None:
        reply = self.current_reply()
        if reply is not None:
            if reply.note.text() == "…":
                reply.set_note(None)
            reply.append(pieces)

    def set_highlight(self, on: bool) -> None:
        self.highlight = on
        for widget in self.messages:
            widget.set_highlight(on)

    def restyle(self) -> None:
        """The theme changed: redraw what baked its colours in (the draft tint, code)."""
        for widget in self.messages:
            widget.restyle()

    def set_empty_hint(self, text: str) -> None:
        self.empty_hint.setText(text or "Type a message below to start a conversation.")

    def _add(self, role: str, author: str) -> MessageWidget:
        widget = MessageWidget(role, author)
        widget.set_highlight(self.highlight and role == "assistant")
        widget.set_actions_enabled(not self.busy)
        widget.edited.connect(lambda text: self.edit_requested.emit(widget.index, text))
        widget.version_requested.connect(lambda position: self.version_requested.emit(widget.index, position))
        widget.regenerate_requested.connect(self.regenerate_requested)
        widget.continue_requested.connect(self.continue_requested)
        self.column_layout.insertWidget(self.column_layout.count() - 1, widget)
        self.messages.append(widget)
        self.empty_hint.hide()
        return widget

    # ------------------------------------------------------------ sending

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        for widget in self.messages:
            widget.set_actions_enabled(not busy)
        self.send_button.setText("Stop" if busy else "Send")
        self.send_button.setProperty("stop", busy)
        self.send_button.style().unpolish(self.send_button)  # re-apply the [stop] style
        self.send_button.style().polish(self.send_button)

    def _send_or_stop(self) -> None:
        if self.busy:
            self.stop_requested.emit()
        else:
            self._submit()

    def _submit(self) -> None:
        if self.busy:
            return  # Enter while a reply streams does nothing; Esc or Stop cancels it
        text = self.composer.toPlainText().strip()
        if not self.attachments.ready():
            self.attachments.set_note("Counting the attached files' tokens; send again in a moment.")
            return
        if text or self.attachments.files:
            self.composer.clear()
            self.send_requested.emit(compose(text, self.attachments.take()))

    def choose_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach files", "",
                                                "Text and source files (*);;All files (*)")
        if paths:
            self.attachments.add_paths(paths)

    # ------------------------------------------------------------ scrolling

    FOUND_MS = 1500  # how long a message opened from search stays marked

    def scroll_to_message(self, index: int) -> None:
        """Scroll so message `index` (of the conversation's messages) is at the top, and
        mark it a moment. A chat just opened is still being laid out (code blocks
        colour and resize for a while), so the message stays pinned there while the
        column's height changes, for PIN_MS or until the person scrolls."""
        widget = next((w for w in self.messages if w.index == index), None)
        while widget is None and self._loaded is not None and self._hidden > 0:
            self.show_earlier()  # among the earlier messages that have no widget yet
            widget = next((w for w in self.messages if w.index == index), None)
        if widget is None:
            return
        self._stick_to_bottom = False
        self._pinned = widget
        self._scroll_to_pinned()
        QTimer.singleShot(0, self, self._scroll_to_pinned)
        QTimer.singleShot(self.PIN_MS, self, lambda: self._unpin(widget))
        widget.set_found(True)
        QTimer.singleShot(self.FOUND_MS, widget, lambda: widget.set_found(False))

    PIN_MS = 2000

    def _scroll_to_pinned(self) -> None:
        widget = self._pinned
        if widget is not None and widget in self.messages:
            top = widget.mapTo(self.scroll.widget(), QPoint(0, 0)).y()
            self._pinning = True  # our own move, not the person's
            self.scroll.verticalScrollBar().setValue(max(0, top - 12))
            self._pinning = False

    def _unpin(self, widget) -> None:
        if self._pinned is widget:
            self._pinned = None

    def _user_scrolled(self, value: int) -> None:
        bar = self.scroll.verticalScrollBar()
        self._stick_to_bottom = value >= bar.maximum() - 8
        if not self._pinning and bar.isSliderDown():
            self._pinned = None  # the person took over

    def _follow_bottom(self, _minimum: int, maximum: int) -> None:
        if self._pinned is not None:
            self._scroll_to_pinned()
        elif self._stick_to_bottom:
            self.scroll.verticalScrollBar().setValue(maximum)
