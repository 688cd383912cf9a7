"""Menus declared as tables of actions (after napari's qactions).

The window lists what it offers as ActionSpec rows (id, text, shortcut, callback,
menu, group); install() builds the menu bar from them in order, with a separator
between groups, and returns the QActions by id so the window can enable, check or
test them. Adding a command is one row, not five lines of Qt calls, and the
Help → Keyboard shortcuts list is made from the same rows (shortcut_rows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMenu

Shortcut = QKeySequence.StandardKey | Qt.Key | str | None


@dataclass(frozen=True)
class ActionSpec:
    id: str
    text: str
    menu: str  # the menu bar entry, e.g. "&File"
    callback: Callable[..., object] | None = None  # triggered(), or toggled(bool) when checkable
    shortcut: Shortcut = None
    group: str = ""  # consecutive rows of one menu with different groups get a separator
    checkable: bool = False
    checked: bool = False
    enabled: bool = True
    action: QAction | None = None  # an action Qt already made (a dock's toggle)


@dataclass(frozen=True)
class MenuSpec:
    """A whole menu made elsewhere (the Targets menu), placed among the others."""

    menu: QMenu


def install(window: QMainWindow, rows: list[ActionSpec | MenuSpec]) -> dict[str, QAction]:
    """Fill the window's menu bar from `rows`; the actions by id."""
    bar = window.menuBar()
    menus: dict[str, QMenu] = {}
    groups: dict[str, str] = {}
    actions: dict[str, QAction] = {}
    for row in rows:
        if isinstance(row, MenuSpec):
            bar.addMenu(row.menu)
            continue
        if row.menu not in menus:
            menus[row.menu] = bar.addMenu(row.menu)
            groups[row.menu] = row.group
        menu = menus[row.menu]
        if row.group != groups[row.menu]:
            menu.addSeparator()
            groups[row.menu] = row.group
        action = row.action or _make(window, row)
        if row.action is not None:
            action.setText(row.text)
            _set_shortcut(action, row.shortcut)
        menu.addAction(action)
        actions[row.id] = action
    return actions


def _make(window: QMainWindow, row: ActionSpec) -> QAction:
    action = QAction(row.text, window)
    action.setObjectName(row.id)
    _set_shortcut(action, row.shortcut)
    if row.checkable:
        action.setCheckable(True)
        action.setChecked(row.checked)
    action.setEnabled(row.enabled)
    if row.callback is not None:
        if row.checkable:
            action.toggled.connect(row.callback)
        else:
            action.triggered.connect(lambda _checked=False, f=row.callback: f())
    return action


def _set_shortcut(action: QAction, shortcut: Shortcut) -> None:
    if shortcut is not None:
        action.setShortcut(QKeySequence(shortcut))
        # Window-wide, so Esc stops a reply while the composer has the focus.
        action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)


def shortcut_rows(rows: list[ActionSpec | MenuSpec], actions: dict[str, QAction]) -> list[tuple[str, str, str]]:
    """(menu, command, keys as this platform writes them) for every row with a
    shortcut, in menu order: what Help → Keyboard shortcuts lists. Read from the
    installed actions, so the list is what the keys really do."""
    listed = []
    for row in rows:
        if isinstance(row, ActionSpec) and row.shortcut is not None:
            keys = actions[row.id].shortcut().toString(QKeySequence.SequenceFormat.NativeText)
            if keys:  # a standard key this platform has none for
                listed.append((row.menu.replace("&", ""), row.text.rstrip("…"), keys))
    return listed
