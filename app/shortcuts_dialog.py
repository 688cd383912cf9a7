"""Help → Keyboard shortcuts: every command with a key, as the menus declare it.

The rows come from the window's action table (actions.shortcut_rows), so a
shortcut added, changed or removed there shows here without another edit.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

EXTRA_NOTE = ("In the message box: Enter sends, Shift+Enter starts a new line. "
              "In the chat list: F2 renames, Delete deletes.")


class ShortcutsDialog(QDialog):
    def __init__(self, rows: list[tuple[str, str, str]], parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts — OmniDraft")
        self.setObjectName("ShortcutsDialog")
        self.table = QTableWidget(len(rows), 3)
        self.table.setObjectName("ShortcutsTable")
        self.table.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.table.setHorizontalHeaderLabels(["Command", "Keys", "Menu"])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.setShowGrid(False)
        for r, (menu, command, keys) in enumerate(rows):
            for c, text in enumerate((command, keys, menu)):
                self.table.setItem(r, c, QTableWidgetItem(text))
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for c in (1, 2):
            header.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        self.table.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        note = QLabel(EXTRA_NOTE)
        note.setWordWrap(True)
        note.setObjectName("MessageMeta")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        layout.addWidget(note)
        layout.addWidget(buttons)
        self.setMinimumWidth(480)

    def showEvent(self, event) -> None:
        # As tall as its rows, measured once the theme's padding applies: the whole
        # list at once, no scroll bar, no empty space.
        self.table.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 10)
        rows = sum(self.table.rowHeight(r) for r in range(self.table.rowCount()))
        self.table.setFixedHeight(rows + self.table.horizontalHeader().height() + 2 * self.table.frameWidth())
        self.adjustSize()
        super().showEvent(event)

    def listed(self) -> list[tuple[str, str, str]]:
        """(menu, command, keys) per row, as shown."""
        return [(self.table.item(r, 2).text(), self.table.item(r, 0).text(), self.table.item(r, 1).text())
                for r in range(self.table.rowCount())]
