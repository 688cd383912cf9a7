"""The main window: conversations, the chat, the charts, and the engine's state.

It puts the parts together and routes the worker's events to them: the chat
session (app/chat_session) writes replies, the target control
(app/target_control) loads models, the charts plot what the engine measured. It
owns the user's data on the GUI side (conversation store, settings, chart
history) and saves it; the engine worker owns the models.
"""

from __future__ import annotations

import gc
import logging

from omnidraft.core.storage import paths
from omnidraft.core.storage.conversations import ConversationStore
from omnidraft.core.storage.secure_store import default_keystore
from omnidraft.core.storage.settings import load_settings, save_settings
from omnidraft.core.worker.process import WorkerHandle
from omnidraft.core.worker.protocol import (
    CatalogChanged,
    ErrorEvent,
    LearningProgress,
    LoadStopped,
    ModelLoaded,
    ModelLoading,
    Notice,
    RemoveModel,
    TargetDescribed,
    TokenBatch,
    TokensCounted,
    TurnDone,
    UpdateSettings,
    WorkerReady,
)
from omnidraft.server.runner import AppServer, ServerError
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QKeySequence
from PySide6.QtWidgets import QDockWidget, QMainWindow, QMessageBox

from omnidraft import __version__

from .actions import ActionSpec, MenuSpec, install, shortcut_rows
from .banner import Banner
from .charts import ChartsPanel
from .chat_files import ChatFiles
from .chat_pane import ChatPane
from .chat_session import ChatSession
from .learning_control import LearningControl, set_checked_quietly
from .message_widget import describe_stats
from .metrics_history import MetricsHistory
from .model_info_dialog import ModelInfoControl
from .settings_dialog import SettingsDialog
from .shortcuts_dialog import ShortcutsDialog
from .stall_monitor import StallMonitor
from .target_control import STATUS_MS, TargetControl
from .targets_menu import TargetsMenu
from .theme import ThemeFollower
from .window_layout import restore_layout, save_layout
from .worker_bridge import WorkerBridge

log = logging.getLogger(__name__)
Key, StandardKey = Qt.Key, QKeySequence.StandardKey


class MainWindow(QMainWindow):
    closed = Signal()
    served = Signal(object)  # a served reply's TurnDone (from the server's thread)

    def __init__(self, target: str | None = None, handle: WorkerHandle | None = None):
        super().__init__()
        self.setWindowTitle(f"OmniDraft Desktop {__version__}")
        self.resize(1280, 800)
        self.setMinimumSize(760, 480)
        self.settings, settings_problems = load_settings()
        self.keys = default_keystore()
        self.store = ConversationStore(keys=self.keys)
        self.history = MetricsHistory()
        self.history.load()
        self._closed = False
        self._failed_load: str | None = None  # the model of the last load that failed
        self._model_context = 0  # the loaded model's own window (Settings shows it beside ours)

        self.stall = StallMonitor(self)
        self.bridge = WorkerBridge(handle or WorkerHandle(), self)
        # Settings → Local server, on this worker: offered each event first (on_event).
        self.server = AppServer(self.bridge.send, self.bridge.next_id,
                                lambda: self.settings.learn_from_api, self.served.emit)
        self._served_at: tuple | None = None  # (host, port, key) it serves on
        self.banner = Banner()
        self.targets_menu = TargetsMenu(self)  # before the charts: they ask it for model names
        self.targets = TargetControl(self.bridge, self.targets_menu, self.banner, self.stall,
                                     target or self.settings.last_target, self)
        self.model_info = ModelInfoControl(self.bridge, self)
        self.session = ChatSession(self.store, self.bridge, self.targets, lambda: self.settings, self)
        self.pane = ChatPane(self.store, self.session, self.targets, self.banner)
        self.chat, self.sidebar = self.pane.chat, self.pane.sidebar
        self.chat.set_highlight(self.settings.highlight_drafts)
        self.setCentralWidget(self.pane)
        self.charts = ChartsPanel(self.history, self.targets.name_of)
        self.learning = LearningControl(self.bridge, self.targets, self.charts, self.stall,
                                        self.settings.learning_paused, self)
        self.files = ChatFiles(self.pane, self)
        self.theme = ThemeFollower(self.settings.theme, self)
        self.theme.changed.connect(lambda palette: (self.charts.set_palette(palette), self.chat.restyle()))
        self.theme.set_choice(self.settings.theme)
        self._build_docks()
        self.table = self._action_table()
        self.actions = install(self, self.table)
        self.learning.pause_action = self.actions["pause_learning"]
        self._connect()
        for warning in [*settings_problems, *self.store.warnings, self.history.load_warning,
                        self.keys.fallback_warning]:
            if warning:
                self.banner.show_message(f"load:{warning}", warning)
        self.pane.show_conversation(self.pane.first_conversation())
        restore_layout(self, self.pane)

    # ================================================================ building

    def _build_docks(self) -> None:
        self.charts_dock = QDockWidget("Drafter performance", self)
        self.charts_dock.setObjectName("ChartsDock")
        self.charts_dock.setWidget(self.charts)
        self.charts_dock.setMinimumWidth(340)
        features = QDockWidget.DockWidgetFeature
        self.charts_dock.setFeatures(features.DockWidgetClosable | features.DockWidgetMovable
                                     | features.DockWidgetFloatable)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.charts_dock)
        self.resizeDocks([self.charts_dock], [400], Qt.Orientation.Horizontal)
        status = self.statusBar()
        status.setSizeGripEnabled(False)
        for widget in (self.targets.progress, self.targets.model_label, self.learning.label):
            status.addPermanentWidget(widget)

    def _action_table(self) -> list[ActionSpec | MenuSpec]:
        chat, learning = self.pane, self.learning
        return [
            ActionSpec("new_chat", "New chat", "&File", chat.new_chat, StandardKey.New),
            *self.files.rows(),
            ActionSpec("export_png", "Export charts as PNG…", "&File", self.charts._ask_export_png, group="export"),
            ActionSpec("export_csv", "Export chart data as CSV…", "&File", self.charts._ask_export_csv,
                       group="export"),
            ActionSpec("settings", "Settings…", "&File", self.open_settings, "Ctrl+,",
                       group="settings"),
            ActionSpec("quit", "Quit", "&File", self.close, "Ctrl+Q", group="quit"),
            ActionSpec("search_chats", "Search chats", "&Chat", self.sidebar.focus_search, "Ctrl+K"),
            ActionSpec("stop", "Stop reply", "&Chat", chat.stop_reply, Key.Key_Escape, enabled=False),
            ActionSpec("regenerate", "Regenerate reply", "&Chat", lambda: chat.with_chat(self.session.regenerate),
                       "Ctrl+R"),
            ActionSpec("switch_target", "Switch target…", "&Chat", self.targets_menu.drop_open, "Ctrl+T"),
            ActionSpec("rename_chat", "Rename chat…", "&Chat", lambda: chat.with_chat(self.sidebar.ask_rename),
                       group="chat"),
            ActionSpec("delete_chat", "Delete chat…", "&Chat", lambda: chat.with_chat(self.sidebar.ask_delete),
                       group="chat"),
            MenuSpec(self.targets_menu),
            ActionSpec("pause_learning", "Pause learning", "&Learning", learning.set_paused,
                       checkable=True, checked=self.settings.learning_paused),
            ActionSpec("learn_now", "Learn now", "&Learning", learning.learn_now),
            ActionSpec("reset_learning", "Reset personalization for this target…", "&Learning",
                       lambda: learning.reset(self), group="reset"),
            ActionSpec("restart_engine", "Restart engine", "&Learning", self.restart_engine, group="engine"),
            ActionSpec("charts_panel", "Charts panel", "&View", shortcut="Ctrl+Shift+G",
                       action=self.charts_dock.toggleViewAction()),
            ActionSpec("highlight", "Highlight text from accepted drafts", "&View",
                       lambda on: self.apply_settings({"highlight_drafts": on}),
                       checkable=True, checked=self.settings.highlight_drafts),
            ActionSpec("shortcuts", "Keyboard shortcuts", "&Help", self.show_shortcuts, StandardKey.HelpContents),
            ActionSpec("responsiveness", "Responsiveness…", "&Help", self._show_responsiveness),
            ActionSpec("about", "About OmniDraft", "&Help", self._about),
        ]

    def _connect(self) -> None:
        self.bridge.event.connect(self.on_event)
        self.served.connect(self._on_served)
        self.bridge.died.connect(self._on_worker_died)
        self.bridge.restarted.connect(lambda: self.stall.enter("engine start"))
        self.bridge.gave_up.connect(self._on_worker_gave_up)
        self.session.streamed.connect(lambda *_: self.stall.enter("streaming"))
        self.session.finished.connect(lambda *_: self.stall.leave("streaming"))
        self.session.busy_changed.connect(self.actions["stop"].setEnabled)
        self.targets.loaded.connect(self._on_loaded)
        self.targets_menu.info_requested.connect(self.model_info.ask)
        for part in (self.targets, self.learning, self.pane, self.files):
            part.status.connect(self._status)
        self.learning.paused_changed.connect(
            lambda paused: self.apply_settings({"learning_paused": paused}, tell_worker=False))
        self.charts.exported.connect(lambda path: self._status(f"Saved {path}", STATUS_MS))
        # A box opened from a fresh timer callback, not from inside the asyncio task
        # that pumps worker events: a modal box's nested loop would stall that task.
        self.targets.failed.connect(self._failure_later)

    def _status(self, text: str, ms: int = 0) -> None:
        self.statusBar().showMessage(text, ms)

    # ================================================================ lifecycle

    def start(self) -> None:
        """Start measuring the event loop and the engine worker (needs the asyncio loop)."""
        # The widgets, Qt wrappers and pyqtgraph objects built so far live as long as
        # the window: exempt them from the garbage collector's full passes (20-30 ms
        # each here, a visible hitch when one lands in a repaint).
        gc.collect()
        gc.freeze()
        self.stall.start()
        self.stall.enter("engine start")
        self._status("Starting the engine…")
        self.bridge.start()
        self._apply_server()

    def closeEvent(self, event: QCloseEvent) -> None:
        if not self._closed:
            self._closed = True
            self.shutdown()
            self.closed.emit()
        event.accept()

    def shutdown(self) -> None:
        """Save everything, then stop the worker cleanly."""
        self.session.interrupt("closed")
        save_settings(self.settings)
        self.charts.save()
        save_layout(self, self.pane)
        self.stall.stop()
        log.info("%s", self.stall.summary())
        # A worker busy converting a model finishes its step before it reads Shutdown
        # (stop() kills it after a timeout); the window is gone meanwhile, not frozen.
        self.hide()
        self.server.stop()
        self.bridge.stop()

    # ================================================================ engine events

    def on_event(self, event) -> None:
        if self.server.route(event):  # an answer to a served request
            return
        handler = {
            WorkerReady: self._on_ready,
            CatalogChanged: self.targets.on_catalog,
            ModelLoading: self.targets.on_loading,
            ModelLoaded: self.targets.on_loaded,
            LoadStopped: self._on_load_stopped,
            TokenBatch: self.session.on_tokens,
            TurnDone: self._on_turn_done,
            LearningProgress: self.learning.on_progress,
            TargetDescribed: self.model_info.on_described,
            TokensCounted: self.chat.attachments.on_counted,
            ErrorEvent: self._on_error,
            Notice: lambda e: self._status(e.message, STATUS_MS * 2),
        }.get(type(event))
        if handler is None:
            log.warning("unhandled event %r", event)
            return
        handler(event)

    def _on_ready(self, event: WorkerReady) -> None:
        self.stall.leave("engine start")
        self.bridge.send(UpdateSettings(self.bridge.next_id(), self.settings.to_dict()))
        self.targets.on_ready(event)
        self.session.engine_ready()

    def _on_loaded(self, event: ModelLoaded) -> None:
        self.charts.set_current_target(event.model_id)
        self._model_context = event.model_context
        self.chat.set_empty_hint(f"Chat with {event.name}. Type a message below to start.")
        if not self.targets.loads:
            self.apply_settings({"last_target": self.targets.wanted}, tell_worker=False)

    def _on_turn_done(self, event: TurnDone) -> None:
        active = self.session.active
        if active is None or event.request_id != active.request_id:
            return
        if event.stats is not None and event.stats.new_tokens > 0 and event.reason != "error":
            self.charts.add_turn(event.stats, event.model_id, event.baseline_tokens_per_s)
            self._status(describe_stats(event.stats.as_dict(), event.baseline_tokens_per_s), STATUS_MS * 2)
        self.session.on_turn_done(event)

    def _on_load_stopped(self, event: LoadStopped) -> None:
        """A switch the worker did not serve: a later one replaced it, or it was cancelled."""
        self.targets.loads.pop(event.request_id, None)
        if not self.targets.loads:
            self.targets.progress.hide()
            self.stall.leave("model loading")
            self.targets.menu.set_current(self.targets.current)
        if event.reason == "cancelled":
            self._status(f"Loading {self.targets.name_of(event.model_id)} was stopped.", STATUS_MS)

    def _failure_later(self, title: str, text: str) -> None:
        model_id = self._failed_load  # the load this answers, read now: another may fail meanwhile
        QTimer.singleShot(0, self, lambda: self._show_failure(title, text, model_id))

    def _show_failure(self, title: str, text: str, model_id: str | None) -> None:
        """A load or add that failed; a model the user added that does not load can
        be taken off the list from the same box."""
        added = next((e for e in self.targets.menu.entries if e.id == model_id and not e.bundled), None)
        if added is None:
            QMessageBox.warning(self, title, text)
            return
        buttons = QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No
        question = f"{text}\n\nRemove {added.name} from the model list? Its files stay where they are."
        if QMessageBox.warning(self, title, question, buttons, QMessageBox.StandardButton.No) \
                == QMessageBox.StandardButton.Yes:
            self.remove_model(added.id)

    def remove_model(self, model_id: str) -> None:
        """Take a model the user added off the Targets menu (its files stay where they are)."""
        self.bridge.send(RemoveModel(self.bridge.next_id(), model_id))

    def _on_error(self, event: ErrorEvent) -> None:
        # The model a failed load asked for (read before the answer is claimed), for
        # the box that offers to remove it.
        self._failed_load = self.targets.loads.get(event.request_id)
        if event.detail:  # the message is written for people; the detail goes to the log
            log.warning("engine error: %s\n%s", event.message, event.detail)
        # Each claims the answers to its requests.
        parts = (self.session, self.targets, self.model_info, self.chat.attachments)
        if not any(part.on_error(event) for part in parts):
            self.banner.show_message("error", event.message)

    def _on_worker_died(self, message: str) -> None:
        self.server.worker_lost(f"{message} This request was lost; try again.")
        self.targets.forget_requests()
        self.targets.busy()
        self.session.interrupt("worker_died")
        name = self.targets.name_of(self.targets.current or self.targets.wanted)
        self.banner.show_message("engine", f"{message} Restarting it and reloading {name}…")
        self._status("Restarting the engine…")

    def _on_worker_gave_up(self, message: str) -> None:
        self.targets.progress.hide()
        self.banner.show_message("engine", message)
        self._status("The engine is not running.")

    def restart_engine(self) -> None:
        self.server.worker_lost("The engine was restarted; this request was lost. Try again.")
        self.session.interrupt("worker_died")
        self.targets.forget_requests()
        self.targets.busy()
        self._status("Restarting the engine…")
        self.bridge.restart_now()

    # ================================================================ settings

    def apply_settings(self, changes: dict, tell_worker: bool = True) -> None:
        self.settings, problems = self.settings.updated(**changes)
        for problem in problems:
            self._status(problem, STATUS_MS)
        save_settings(self.settings)
        if tell_worker:
            self.bridge.send(UpdateSettings(self.bridge.next_id(), self.settings.to_dict()))
        self.chat.set_highlight(self.settings.highlight_drafts)
        set_checked_quietly(self.actions["highlight"], self.settings.highlight_drafts)
        if self.settings.theme != self.theme.choice:
            self.theme.set_choice(self.settings.theme)
        self._apply_server()

    def _apply_server(self) -> None:
        """Settings → Local server: start it, move it to another address, or stop it."""
        s = self.settings
        wanted = (s.server_host, s.server_port, s.server_api_key) if s.server_enabled else None
        if wanted == self._served_at:
            return
        self._served_at = wanted
        self.server.stop()
        if wanted is None:
            self.banner.remove("server")
            return
        try:
            url = self.server.start(*wanted)
        except ServerError as exc:
            self.banner.show_message("server", f"The local server did not start: {exc}")
            return
        self.banner.remove("server")
        self._status(f"Local server at {url}", STATUS_MS)

    def _on_served(self, event: TurnDone) -> None:
        if event.stats is not None and event.stats.new_tokens > 0:
            self.charts.add_turn(event.stats, event.model_id, event.baseline_tokens_per_s, served=True)

    def open_settings(self) -> None:
        dialog = SettingsDialog(self.settings, str(paths.data_dir()), self, max_context=self.targets.context_window,
                                server_status=self.server.status(), model_context=self._model_context)
        dialog.clear_all_requested.connect(self.clear_all_data)
        if dialog.exec() and dialog.changes():
            self.apply_settings(dialog.changes())

    def clear_all_data(self) -> None:
        """Delete every file in the data folder (paths.clear_data) and say what was kept.
        The worker holds learned state in memory and files: it is stopped first and
        started fresh afterwards."""
        self.session.interrupt("cleared")
        self.server.worker_lost("All data was cleared in the app; this request was lost. Try again.")
        self.bridge.stop()
        self.store.forget_all()
        kept = paths.clear_data()
        self.charts.clear()
        self.targets.forget_loaded()
        self.pane.show_conversation(None)
        message = "All conversations and learned data were deleted."
        why = {paths.KEY_FILE_NAME: "the encryption key file: it holds no data of yours, "
               "and the running app still encrypts with it"}
        for name in paths.LOCK_FILE_NAMES:
            why[name] = "it holds only this app's process id and keeps a second OmniDraft off this folder"
        if kept:
            kept.sort(key=lambda name: name != paths.KEY_FILE_NAME)  # the one that matters first
            message += " Kept: " + "; ".join(f"{name} ({why.get(name, 'asked to keep')})" for name in kept) + "."
        self.banner.show_message("cleared", message)
        self.bridge.start()

    # ================================================================ help

    def show_shortcuts(self) -> ShortcutsDialog:
        dialog = ShortcutsDialog(shortcut_rows(self.table, self.actions), self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.show()
        return dialog

    def _show_responsiveness(self) -> None:
        QMessageBox.information(self, "Responsiveness", "Longest time the window could not react "
                                "(measured with a 10 ms timer):\n" + self.stall.summary())

    def _about(self) -> None:
        QMessageBox.about(
            self, "About OmniDraft",
            f"<b>OmniDraft Desktop {__version__}</b><br>Local chat whose one small drafter "
            "speeds up any target model, learning from your own chats (OmniDraft, "
            "arXiv 2507.02659).<br>Your data: " + str(paths.data_dir()),
        )
