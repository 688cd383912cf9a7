"""The strip above the chat: the conversation's system prompt, shown and editable.

Collapsed it shows the prompt on one line ("Edit" opens it); open, a text box
with Save and Cancel. Saving emits the new text; the chat pane stores it for
this conversation, and the chat session sends it first with every request.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontMetrics, QResizeEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

NO_PROMPT = "None: the model's own default behaviour."
HINT = "Sent first with every reply in this chat. New chats start with the default from Settings."


def _row(widgets: list[QWidget], stretch: QWidget) -> QHBoxLayout:
    """Widgets side by side; `stretch` takes the room left."""
    row = QHBoxLayout()
    row.setContentsMargins(0, 0, 0, 0)
    row.setSpacing(10)
    for widget in widgets:
        row.addWidget(widget, 1 if widget is stretch else 0)
    return row


class ChatHeader(QFrame):
    system_prompt_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("ChatHeader")
        self.prompt = ""
        caption = QLabel("System prompt")
        caption.setObjectName("HeaderCaption")
        self.summary = QLabel()
        self.summary.setObjectName("SystemPromptSummary")
        self.summary.setTextFormat(Qt.TextFormat.PlainText)
        # Its width comes from the layout, not from the text (which is elided to it).
        self.summary.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.edit_button = QPushButton("Edit")
        self.edit_button.setObjectName("HeaderButton")
        self.edit_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.edit_button.clicked.connect(self.open_editor)
        row = _row([caption, self.summary, self.edit_button], stretch=self.summary)

        self.editor = QPlainTextEdit()
        self.editor.setObjectName("SystemPromptEditor")
        self.editor.setPlaceholderText("e.g. You are a concise assistant. Answer in English.")
        self.editor.setTabChangesFocus(True)
        self.editor.setFixedHeight(96)
        hint = QLabel(HINT)
        hint.setObjectName("HeaderHint")
        hint.setWordWrap(True)
        self.save_button = QPushButton("Save")
        self.save_button.setObjectName("HeaderSaveButton")
        self.save_button.clicked.connect(self._save)
        cancel = QPushButton("Cancel")
        cancel.clicked.connect(self.close_editor)
        buttons = _row([hint, cancel, self.save_button], stretch=hint)
        self.editing = QWidget()
        editing_layout = QVBoxLayout(self.editing)
        editing_layout.setContentsMargins(0, 6, 0, 0)
        editing_layout.setSpacing(6)
        editing_layout.addWidget(self.editor)
        editing_layout.addLayout(buttons)
        self.editing.hide()

        layout = QVBoxLayout(self)
        layout.setContentsMargins(16, 8, 16, 8)
        layout.setSpacing(0)
        layout.addLayout(row)
        layout.addWidget(self.editing)
        self.set_prompt("")

    def set_prompt(self, text: str) -> None:
        """Show the prompt of the chat on screen (closes an open editor)."""
        self.prompt = text
        self.close_editor()
        self._elide()
        self.summary.setToolTip(text)
        self.summary.setProperty("empty", not text)
        self.summary.style().unpolish(self.summary)  # re-apply the [empty] style
        self.summary.style().polish(self.summary)

    def open_editor(self) -> None:
        self.editor.setPlainText(self.prompt)
        self.editing.show()
        self.summary.hide()  # the editor shows it whole
        self.edit_button.hide()
        self.editor.setFocus()

    def close_editor(self) -> None:
        self.editing.hide()
        self.summary.show()
        self.edit_button.show()

    def _save(self) -> None:
        text = self.editor.toPlainText().strip()
        self.close_editor()
        if text != self.prompt:
            self.system_prompt_changed.emit(text)

    def _elide(self) -> None:
        """One line: the prompt's first lines joined, cut with "…" to the width."""
        text = " ".join(self.prompt.split()) or NO_PROMPT
        width = max(60, self.summary.width())
        self.summary.setText(QFontMetrics(self.summary.font()).elidedText(text, Qt.TextElideMode.ElideRight, width))

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._elide()
