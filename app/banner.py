"""A dismissable strip at the top of the chat for things the user must not miss
(the engine crashed and is restarting, conversations kept in a key file, ...)."""

from __future__ import annotations

from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QWidget


class Banner(QFrame):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("Banner")
        self.messages: dict[str, str] = {}  # key -> text; a key replaces its own earlier text
        self.label = QLabel()
        self.label.setWordWrap(True)
        close = QToolButton()
        close.setText("✕")
        close.setToolTip("Dismiss")
        close.clicked.connect(self.clear)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(14, 8, 8, 8)
        layout.addWidget(self.label, 1)
        layout.addWidget(close)
        self.hide()

    def show_message(self, key: str, text: str) -> None:
        self.messages[key] = text
        self._update()

    def remove(self, key: str) -> None:
        self.messages.pop(key, None)
        self._update()

    def clear(self) -> None:
        self.messages.clear()
        self._update()

    def text(self) -> str:
        return self.label.text()

    def _update(self) -> None:
        self.label.setText("\n".join(self.messages.values()))
        self.setVisible(bool(self.messages))
