"""Light and dark themes (following the system by default, charts included) and
the keyboard shortcuts with their Help dialog, in a window on a scripted worker."""

from __future__ import annotations

import pytest
from omnidraft.app import theme
from omnidraft.app.settings_dialog import SettingsDialog
from omnidraft.app.shortcuts_dialog import ShortcutsDialog
from omnidraft.core.worker.protocol import CancelRequest, ChatRequest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QKeySequence, QPalette
from PySide6.QtWidgets import QApplication, QFileDialog

from tests.gui_helpers import answer, scripted_window

# The actions that must have a key, by action id.
WANTED = {"new_chat", "search_chats", "stop", "regenerate", "switch_target", "charts_panel"}


@pytest.fixture
def scripted(home, qapp, qt_loop):
    with scripted_window(qapp) as pair:
        yield pair
    theme.apply_theme(qapp, "light")  # later tests in this process expect the light look


def window_colour(app) -> str:
    return app.palette().color(QPalette.ColorRole.Window).name()


def charts_colours(win) -> tuple[str, str]:
    """The charts' background and their axes' colour, as drawn."""
    axis = win.charts.speedup_plot.getAxis("left")
    return win.charts.plots.backgroundBrush().color().name(), axis.pen().color().name()


def test_the_theme_switches_live_palette_sheet_and_charts(scripted, qapp):
    win, _ = scripted
    assert win.settings.theme == "system" and win.theme.palette is theme.LIGHT  # offscreen: no scheme
    assert charts_colours(win) == (theme.LIGHT.surface, theme.LIGHT.chart_fg)

    win.apply_settings({"theme": "dark"})
    assert window_colour(qapp) == theme.DARK.window_bg
    assert theme.DARK.user_bubble in qapp.styleSheet() and theme.LIGHT.window_bg not in qapp.styleSheet()
    assert charts_colours(win) == (theme.DARK.surface, theme.DARK.chart_fg)
    assert QColor(theme.DARK.surface).lightness() < 80  # dark really is dark

    win.apply_settings({"theme": "light"})
    assert window_colour(qapp) == theme.LIGHT.window_bg
    assert charts_colours(win) == (theme.LIGHT.surface, theme.LIGHT.chart_fg)


def test_system_follows_the_desktop_scheme_and_a_fixed_choice_does_not(scripted, qapp):
    win, _ = scripted
    hints = QGuiApplication.styleHints()
    hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)  # the desktop switched to dark
    assert window_colour(qapp) == theme.DARK.window_bg
    assert charts_colours(win)[0] == theme.DARK.surface
    hints.colorSchemeChanged.emit(Qt.ColorScheme.Light)
    assert window_colour(qapp) == theme.LIGHT.window_bg

    win.apply_settings({"theme": "light"})
    hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)  # ignored: the user chose light
    assert window_colour(qapp) == theme.LIGHT.window_bg


def test_the_settings_dialog_offers_the_theme(scripted):
    win, _ = scripted
    dialog = SettingsDialog(win.settings, "/data", win)
    assert dialog.theme.currentData() == "system" and "theme" not in dialog.changes()
    dialog.theme.setCurrentIndex(dialog.theme.findData("dark"))
    assert dialog.changes() == {"theme": "dark"}


def test_the_draft_tint_is_the_themes_and_follows_a_switch(scripted, qapp):
    win, worker = scripted
    win.apply_settings({"theme": "dark", "highlight_drafts": True})
    win.pane.send_message("Hi")
    answer(win, worker, "Hello there", drafted=True)

    def tint() -> str:
        block = win.chat.messages[-1].body.blocks[0]
        return block.document().begin().begin().fragment().charFormat().background().color().name()

    assert tint() == theme.DARK.draft_tint
    win.apply_settings({"theme": "light"})
    assert tint() == theme.LIGHT.draft_tint


def expected_rows(win) -> list[tuple[str, str, str]]:
    native = QKeySequence.SequenceFormat.NativeText
    return [(row.menu.replace("&", ""), row.text.rstrip("…"), QKeySequence(row.shortcut).toString(native))
            for row in win.table if getattr(row, "shortcut", None) is not None]


def test_the_shortcuts_dialog_lists_the_action_tables_keys(scripted):
    win, _ = scripted
    help_menu = next(a.menu() for a in win.menuBar().actions() if a.text() == "&Help")
    shortcuts = next(a for a in help_menu.actions() if a.text() == "Keyboard shortcuts")
    shortcuts.trigger()
    dialog = next(w for w in QApplication.topLevelWidgets() if isinstance(w, ShortcutsDialog) and w.isVisible())
    listed = dialog.listed()
    assert listed == expected_rows(win) and len(listed) >= 10
    ids = {row.id for row in win.table if getattr(row, "shortcut", None) is not None}
    assert WANTED <= ids
    assert ("Chat", "Search chats", "Ctrl+K") in listed and ("View", "Charts panel", "Ctrl+Shift+G") in listed
    keys = [keys for _, _, keys in listed]
    assert len(keys) == len(set(keys)) and all(keys)  # every key set, none used twice
    dialog.close()


def press(qtbot, win, action_id: str) -> None:
    """Press the action's keys where a person's focus would be."""
    combo = win.actions[action_id].shortcut()[0]
    qtbot.keyClick(QApplication.focusWidget() or win, combo.key(), combo.keyboardModifiers())


def test_each_shortcut_triggers_its_action(scripted, qtbot, tmp_path, monkeypatch):
    win, worker = scripted
    win.show()
    win.activateWindow()
    qtbot.waitUntil(win.isActiveWindow)  # window shortcuts fire only in the active window
    monkeypatch.setattr(SettingsDialog, "exec", lambda self: 0)
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(tmp_path / "out"), ""))
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: ("", ""))

    press(qtbot, win, "new_chat")
    first = win.pane.current_conv
    assert first in win.store and len(win.store) == 1
    win.pane.send_message("Hello")
    press(qtbot, win, "stop")  # Esc, while the reply streams
    assert isinstance(worker.sent[-1], CancelRequest)
    answer(win, worker, "Hi.", "cancelled")
    press(qtbot, win, "regenerate")
    assert isinstance(worker.sent[-1], ChatRequest) and "versions" in win.store.get(first).messages[1]
    answer(win, worker, "Hello!")
    press(qtbot, win, "new_chat")
    assert len(win.store) == 2 and win.pane.current_conv != first

    press(qtbot, win, "search_chats")
    assert QApplication.focusWidget() is win.sidebar.search
    press(qtbot, win, "charts_panel")
    assert win.charts_dock.isHidden()
    press(qtbot, win, "charts_panel")
    assert not win.charts_dock.isHidden()
    press(qtbot, win, "switch_target")
    qtbot.waitUntil(win.targets_menu.isVisible)
    win.targets_menu.hide()
    win.activateWindow()
    qtbot.waitUntil(win.isActiveWindow)

    win.pane.show_conversation(first)
    press(qtbot, win, "export_markdown")
    assert (tmp_path / "out.md").read_text(encoding="utf-8").count("### You") == 1

    # Every other key triggers its own action.
    fired = []
    for action_id in ("import_chat", "settings", "shortcuts"):
        win.actions[action_id].triggered.connect(lambda _=False, a=action_id: fired.append(a))
        press(qtbot, win, action_id)
        for dialog in QApplication.topLevelWidgets():
            if isinstance(dialog, ShortcutsDialog):
                dialog.close()
        win.activateWindow()
        qtbot.waitUntil(win.isActiveWindow)
    assert fired == ["import_chat", "settings", "shortcuts"]
    pressed = {"new_chat", "stop", "regenerate", "search_chats", "charts_panel", "switch_target",
               "export_markdown", *fired, "quit"}
    press(qtbot, win, "quit")
    assert win._closed
    assert pressed == {row.id for row in win.table if getattr(row, "shortcut", None) is not None}
