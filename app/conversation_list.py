"""The sidebar: saved conversations, newest first, with new / rename / delete,
and a search field that filters the titles and lists the messages holding the
words (each with its matching line; opening one shows the chat at it).

It only shows and asks; the main window owns the ConversationStore and does
the changes, so there is one place that writes the user's data. The message
search itself is the chat pane's `searcher` (core.storage.search_index).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QPoint, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QFrame,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)


def when(seconds: float, now: float | None = None) -> str:
    """'14:05' today, 'Mon 14:05' this week, '3 Mar' before."""
    now = now or time.time()
    t, n = time.localtime(seconds), time.localtime(now)
    if (t.tm_year, t.tm_yday) == (n.tm_year, n.tm_yday):
        return time.strftime("%H:%M", t)
    if now - seconds < 6 * 86400:
        return time.strftime("%a %H:%M", t)
    return time.strftime("%d %b", t).lstrip("0")


class ConversationList(QFrame):
    selected = Signal(str)  # conversation id
    new_requested = Signal()
    rename_requested = Signal(str, str)  # id, new title
    delete_requested = Signal(str)
    result_opened = Signal(str, int)  # conversation id, the message's index

    SEARCH_DELAY_MS = 120  # typing a word searches once, not per key

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("Sidebar")
        self.new_button = QPushButton("+  New chat")
        self.new_button.setObjectName("NewChatButton")
        self.new_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.new_button.clicked.connect(self.new_requested)
        self.search = QLineEdit()
        self.search.setObjectName("SidebarSearch")
        self.search.setPlaceholderText("Search chats and messages")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self._filter)
        self.search.returnPressed.connect(self._open_first_match)
        self.list = QListWidget()
        self.list.setObjectName("ConversationList")
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        # Long titles end in "…" instead of growing a horizontal scroll bar.
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setUniformItemSizes(True)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.currentItemChanged.connect(self._current_changed)
        self.list.itemDoubleClicked.connect(lambda item: self.ask_rename(item.data(Qt.ItemDataRole.UserRole)))
        title = self.chats_title = QLabel("Chats")
        title.setObjectName("SidebarTitle")
        # Message search: set by the chat pane; query -> [Hit] (core.storage.search_index).
        self.searcher: Callable[[str], list] | None = None
        self.results_title = QLabel()
        self.results_title.setObjectName("SidebarTitle")
        self.results = QListWidget()
        self.results.setObjectName("SearchResults")
        self.results.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.results.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.results.setWordWrap(False)
        self.results.itemClicked.connect(self._open_result)
        self.results.itemActivated.connect(self._open_result)
        self._search_timer = QTimer(self, singleShot=True, interval=self.SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(self.refresh_results)

        rename = QAction("Rename", self.list, shortcut=QKeySequence(Qt.Key.Key_F2))
        rename.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        rename.triggered.connect(lambda: self._with_current(self.ask_rename))
        delete = QAction("Delete", self.list, shortcut=QKeySequence.StandardKey.Delete)
        delete.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        delete.triggered.connect(lambda: self._with_current(self.ask_delete))
        self.list.addActions([rename, delete])

        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 12, 10, 10)
        layout.setSpacing(8)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(title)
        layout.addWidget(self.list, 1)
        layout.addWidget(self.results_title)
        layout.addWidget(self.results, 2)
        self._show_results([], "")

    def show_conversations(self, conversations, current_id: str | None) -> None:
        """Rebuild the list (conversations newest first), keeping `current_id` selected."""
        self.list.blockSignals(True)
        self.list.clear()
        for conv in conversations:
            item = QListWidgetItem(conv.title)
            item.setData(Qt.ItemDataRole.UserRole, conv.id)
            item.setToolTip(f"{conv.title}\n{len(conv.messages)} messages · {when(conv.updated)}")
            self.list.addItem(item)
            if conv.id == current_id:
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)
        self._filter(self.search.text())

    def focus_search(self) -> None:
        """Put the cursor in the search field, its text selected to type over."""
        self.search.setFocus()
        self.search.selectAll()

    def _open_first_match(self) -> None:
        """Enter in the search field opens the first chat it shows, else the first message found."""
        shown = [self.list.item(i) for i in range(self.list.count()) if not self.list.item(i).isHidden()]
        if shown:
            self.list.setCurrentItem(shown[0])
            self.list.setFocus()
            return
        self.refresh_results()
        if self.results.count():
            self.results.setCurrentRow(0)
            self._open_result(self.results.item(0))

    def refresh_results(self) -> None:
        """Search the messages for the text in the search field (again: they changed)."""
        self._search_timer.stop()
        query = self.search.text().strip()
        hits = self.searcher(query) if query and self.searcher is not None else []
        self._show_results(hits, query)

    def _show_results(self, hits: list, query: str) -> None:
        self.results.clear()
        titles = {self.list.item(i).data(Qt.ItemDataRole.UserRole): self.list.item(i).text()
                  for i in range(self.list.count())}
        for hit in hits:
            who = "You" if hit.role == "user" else "Reply"
            title = titles.get(hit.conv_id, "")
            item = QListWidgetItem(f"{title}\n{who}: {hit.line}")
            item.setData(Qt.ItemDataRole.UserRole, (hit.conv_id, hit.index))
            item.setToolTip(f"{title}\n{hit.line}")
            self.results.addItem(item)
        found = len(hits)
        self.results_title.setText(f"In messages · {found}{'+' if found >= 200 else ''}" if found
                                   else "No message holds these words")
        self.results_title.setVisible(bool(query))
        self.results.setVisible(bool(found))

    def _open_result(self, item: QListWidgetItem | None) -> None:
        if item is not None:
            conv_id, index = item.data(Qt.ItemDataRole.UserRole)
            # After this signal returns: opening rebuilds the chat list, not this one.
            QTimer.singleShot(0, self, lambda: self.result_opened.emit(conv_id, index))

    def current_id(self) -> str | None:
        item = self.list.currentItem()
        return item.data(Qt.ItemDataRole.UserRole) if item else None

    def ids(self) -> list[str]:
        return [self.list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.list.count())]

    def title_of(self, conv_id: str) -> str:
        for i in range(self.list.count()):
            item = self.list.item(i)
            if item.data(Qt.ItemDataRole.UserRole) == conv_id:
                return item.text()
        return ""

    def ask_rename(self, conv_id: str) -> None:
        title, ok = QInputDialog.getText(
            self, "Rename chat", "New name:", QLineEdit.EchoMode.Normal, self.title_of(conv_id)
        )
        if ok and title.strip():
            self.rename_requested.emit(conv_id, title.strip())

    def ask_delete(self, conv_id: str) -> None:
        answer = QMessageBox.question(
            self,
            "Delete chat",
            f"Delete “{self.title_of(conv_id)}”? This cannot be undone.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
            QMessageBox.StandardButton.Cancel,
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.delete_requested.emit(conv_id)

    def _with_current(self, action) -> None:
        conv_id = self.current_id()
        if conv_id:
            action(conv_id)

    def _menu(self, pos: QPoint) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        conv_id = item.data(Qt.ItemDataRole.UserRole)
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.ask_rename(conv_id))
        menu.addAction("Delete…", lambda: self.ask_delete(conv_id))
        menu.exec(self.list.viewport().mapToGlobal(pos))

    def _current_changed(self, current: QListWidgetItem | None, _previous) -> None:
        if current is not None:
            self.selected.emit(current.data(Qt.ItemDataRole.UserRole))

    def _filter(self, text: str) -> None:
        needle = text.strip().lower()
        for i in range(self.list.count()):
            item = self.list.item(i)
            item.setHidden(bool(needle) and needle not in item.text().lower())
        # While searching, a chat list no title matches gives its room to the messages found.
        titles_shown = not needle or any(not self.list.item(i).isHidden() for i in range(self.list.count()))
        self.list.setVisible(titles_shown)
        self.chats_title.setVisible(titles_shown)
        if needle:
            self._search_timer.start()
        else:
            self._search_timer.stop()
            self._show_results([], "")
