"""The main window: conversations, the chat, the charts, and the engine's state.

It is the one place that turns user actions into protocol requests and
protocol events into what the user sees. It owns the user's data on the GUI
side (conversation store, settings, chart history) and saves it; the engine
worker owns the models. A reply is accumulated here, not only in the view, so
switching chats mid-reply or the worker dying never loses text.
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass, field

from omnidraft.core.storage import paths
from omnidraft.core.storage.conversations import ConversationStore
from omnidraft.core.storage.secure_store import default_keystore
from omnidraft.core.storage.settings import load_settings, save_settings
from omnidraft.core.worker.process import WorkerHandle
from omnidraft.core.worker.protocol import (
    AddModel,
    CancelRequest,
    CatalogChanged,
    ChatRequest,
    ErrorEvent,
    LearningProgress,
    LearnNow,
    ModelLoaded,
    ModelLoading,
    Notice,
    PauseLearning,
    ResetPersonalization,
    SwitchTarget,
    TokenBatch,
    TurnDone,
    UpdateSettings,
    WorkerReady,
)
from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QDockWidget,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from omnidraft import __version__

from .banner import Banner
from .charts import ChartsPanel
from .chat_view import ChatView
from .conversation_list import ConversationList
from .message_widget import describe_stats, runs_from_mask
from .metrics_history import MetricsHistory
from .settings_dialog import SettingsDialog
from .stall_monitor import StallMonitor
from .targets_menu import TargetsMenu
from .worker_bridge import WorkerBridge

log = logging.getLogger(__name__)

STATUS_MS = 8000
NOTES = {
    "cancelled": "Stopped.",
    "length": "Stopped at the maximum reply length (Settings → Max reply length).",
    "worker_died": "Interrupted: the engine stopped while writing this reply; the text so far is kept.",
    "closed": "Interrupted: the app was closed while this reply was being written.",
}


@dataclass
class ActiveReply:
    """The reply being streamed, kept whole whichever chat is on screen."""

    request_id: int
    conv_id: str
    author: str
    text: str = ""
    drafted: list[bool] = field(default_factory=list)
    error: str | None = None


class MainWindow(QMainWindow):
    closed = Signal()

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

        self.wanted_target: str = target or self.settings.last_target  # id or path to load
        self.current_target: str | None = None  # id of the model that is loaded
        self.current_conv: str | None = None
        self.active: ActiveReply | None = None
        # Requests still unanswered, by request id: what each load or add asked for.
        # Answers are matched by id, so an error tied to no request (or to another
        # one) is never taken for a load's failure.
        self.loads: dict[int, str] = {}  # SwitchTarget id -> the id or path asked for
        self.adds: dict[int, str] = {}  # AddModel id -> the path
        self.learning_state = "paused" if self.settings.learning_paused else "idle"
        self.engine_state = "starting"
        self._learning_detail: LearningProgress | None = None
        self._closed = False

        self.stall = StallMonitor(self)
        self.bridge = WorkerBridge(handle or WorkerHandle(), self)
        self.bridge.event.connect(self.on_event)
        self.bridge.died.connect(self._on_worker_died)
        self.bridge.restarted.connect(self._on_worker_restarted)
        self.bridge.gave_up.connect(self._on_worker_gave_up)

        self.targets_menu = TargetsMenu(self)  # first: the charts ask it for model names
        self._build_ui()
        self._build_menus()
        self._build_status_bar()
        for warning in [*settings_problems, *self.store.warnings]:
            self.banner.show_message(f"load:{warning}", warning)
        if self.history.load_warning:
            self.banner.show_message("history", self.history.load_warning)
        if self.keys.fallback_warning:
            self.banner.show_message("keys", self.keys.fallback_warning)
        self._show_conversation(self._first_conversation())
        self._refresh_learning_label()
        self._restore_layout()

    # ================================================================ building

    def _build_ui(self) -> None:
        self.sidebar = ConversationList()
        self.sidebar.setMinimumWidth(200)
        self.sidebar.selected.connect(lambda conv_id: self._show_conversation(conv_id, refresh=False))
        self.sidebar.new_requested.connect(self.new_chat)
        self.sidebar.rename_requested.connect(self._rename_conversation)
        self.sidebar.delete_requested.connect(self._delete_conversation)

        self.chat = ChatView()
        self.chat.set_highlight(self.settings.highlight_drafts)
        self.chat.send_requested.connect(self.send_message)
        self.chat.stop_requested.connect(self.stop_reply)
        self.banner = Banner()
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.setSpacing(0)
        right_layout.addWidget(self.banner)
        right_layout.addWidget(self.chat, 1)

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setHandleWidth(1)
        self.splitter.addWidget(self.sidebar)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([250, 700])
        self.splitter.setChildrenCollapsible(False)
        self.setCentralWidget(self.splitter)

        self.charts = ChartsPanel(self.history, self._name_of)
        self.charts.exported.connect(lambda path: self.statusBar().showMessage(f"Saved {path}", STATUS_MS))
        self.charts_dock = QDockWidget("Drafter performance", self)
        self.charts_dock.setObjectName("ChartsDock")
        self.charts_dock.setWidget(self.charts)
        self.charts_dock.setMinimumWidth(340)
        self.charts_dock.setFeatures(
            QDockWidget.DockWidgetFeature.DockWidgetClosable
            | QDockWidget.DockWidgetFeature.DockWidgetMovable
            | QDockWidget.DockWidgetFeature.DockWidgetFloatable
        )
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.charts_dock)
        self.resizeDocks([self.charts_dock], [400], Qt.Orientation.Horizontal)

    def _build_menus(self) -> None:
        bar = self.menuBar()
        file_menu = bar.addMenu("&File")
        file_menu.addAction("New chat", QKeySequence.StandardKey.New, self.new_chat)
        file_menu.addSeparator()
        file_menu.addAction("Export charts as PNG…", self.charts._ask_export_png)
        file_menu.addAction("Export chart data as CSV…", self.charts._ask_export_csv)
        file_menu.addSeparator()
        file_menu.addAction("Settings…", QKeySequence.StandardKey.Preferences, self.open_settings)
        file_menu.addSeparator()
        file_menu.addAction("Quit", QKeySequence.StandardKey.Quit, self.close)

        chat_menu = bar.addMenu("&Chat")
        self.stop_action = QAction("Stop reply", self, shortcut=QKeySequence(Qt.Key.Key_Escape))
        self.stop_action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        self.stop_action.triggered.connect(self.stop_reply)
        self.stop_action.setEnabled(False)
        chat_menu.addAction(self.stop_action)
        chat_menu.addSeparator()
        chat_menu.addAction("Rename chat…", lambda: self._with_chat(self.sidebar.ask_rename))
        chat_menu.addAction("Delete chat…", lambda: self._with_chat(self.sidebar.ask_delete))

        self.targets_menu.switch_requested.connect(self.switch_target)
        self.targets_menu.add_requested.connect(self.add_model)
        bar.addMenu(self.targets_menu)

        learning = bar.addMenu("&Learning")
        self.pause_action = QAction("Pause learning", self, checkable=True)
        self.pause_action.setChecked(self.settings.learning_paused)
        self.pause_action.toggled.connect(self.set_learning_paused)
        learning.addAction(self.pause_action)
        learning.addAction("Learn now", self.learn_now)
        learning.addSeparator()
        learning.addAction("Reset personalization for this target…", self.reset_personalization)
        learning.addSeparator()
        learning.addAction("Restart engine", self.restart_engine)

        view = bar.addMenu("&View")
        charts_toggle = self.charts_dock.toggleViewAction()
        charts_toggle.setText("Charts panel")
        view.addAction(charts_toggle)
        self.highlight_action = QAction("Highlight text from accepted drafts", self, checkable=True)
        self.highlight_action.setChecked(self.settings.highlight_drafts)
        self.highlight_action.toggled.connect(lambda on: self.apply_settings({"highlight_drafts": on}))
        view.addAction(self.highlight_action)

        help_menu = bar.addMenu("&Help")
        help_menu.addAction("Responsiveness…", self._show_responsiveness)
        help_menu.addAction("About OmniDraft", self._about)

    def _build_status_bar(self) -> None:
        status = self.statusBar()
        status.setSizeGripEnabled(False)
        self.model_label = QLabel("No model loaded")
        self.progress = QProgressBar()
        self.progress.setFixedWidth(160)
        self.progress.setRange(0, 0)  # busy until the engine reports a fraction
        self.learning_label = QLabel()
        status.addPermanentWidget(self.progress)
        status.addPermanentWidget(self.model_label)
        status.addPermanentWidget(self.learning_label)

    # ================================================================ lifecycle

    def _layout_store(self) -> QSettings:
        """Window size, position, docks and splitter, as Qt saves them (not user
        data, so a plain INI file beside settings.json)."""
        return QSettings(str(paths.config_dir() / "window.ini"), QSettings.Format.IniFormat)

    def _restore_layout(self) -> None:
        # restore*() returns False on unreadable data: the defaults above stay.
        store = self._layout_store()
        for key, restore in (("geometry", self.restoreGeometry), ("state", self.restoreState),
                             ("splitter", self.splitter.restoreState)):
            value = store.value(key)
            if isinstance(value, QByteArray) and not restore(value):
                log.warning("window layout: ignored an unreadable %s", key)

    def _save_layout(self) -> None:
        store = self._layout_store()
        store.setValue("geometry", self.saveGeometry())
        store.setValue("state", self.saveState())
        store.setValue("splitter", self.splitter.saveState())
        store.sync()

    def start(self) -> None:
        """Start measuring the event loop and the engine worker (needs the asyncio loop)."""
        # The widgets, Qt wrappers and pyqtgraph objects built so far live as long as
        # the window: exempt them from the garbage collector's full passes (20-30 ms
        # each here, a visible hitch when one lands in a repaint).
        gc.collect()
        gc.freeze()
        self.stall.start()
        self.stall.enter("engine start")
        self.statusBar().showMessage("Starting the engine…")
        self.bridge.start()

    def closeEvent(self, event: QCloseEvent) -> None:
        if not self._closed:
            self._closed = True
            self.shutdown()
            self.closed.emit()
        event.accept()

    def shutdown(self) -> None:
        """Save everything, then stop the worker cleanly."""
        if self.active is not None:
            self.bridge.send(CancelRequest(self.active.request_id))
            self._finish_reply(self.active.text, note=NOTES["closed"])
        save_settings(self.settings)
        self.charts.save()
        self._save_layout()
        self.stall.stop()
        log.info("%s", self.stall.summary())
        # A worker busy converting a model finishes its step before it reads Shutdown
        # (stop() kills it after a timeout); the window is gone meanwhile, not frozen.
        self.hide()
        self.bridge.stop()

    # ================================================================ events

    def on_event(self, event) -> None:
        handler = {
            WorkerReady: self._on_ready,
            CatalogChanged: self._on_catalog,
            ModelLoading: self._on_loading,
            ModelLoaded: self._on_loaded,
            TokenBatch: self._on_tokens,
            TurnDone: self._on_turn_done,
            LearningProgress: self._on_learning,
            ErrorEvent: self._on_error,
            Notice: self._on_notice,
        }.get(type(event))
        if handler is None:
            log.warning("unhandled event %r", event)
            return
        handler(event)

    def _on_ready(self, event: WorkerReady) -> None:
        self.engine_state = "ready"
        self.stall.leave("engine start")
        self.targets_menu.set_catalog(event.catalog)
        self._forget_requests()  # a fresh worker knows nothing of earlier requests
        self.bridge.send(UpdateSettings(self.bridge.next_id(), self.settings.to_dict()))
        self._request_switch(self.wanted_target)

    def _on_catalog(self, event: CatalogChanged) -> None:
        self.adds.pop(event.request_id, None)
        self.targets_menu.set_catalog(event.catalog)
        self.targets_menu.set_current(self.current_target)
        if event.added_id:
            self.statusBar().showMessage(f"Added {self._name_of(event.added_id)}", STATUS_MS)
            self.switch_target(event.added_id)

    def _on_loading(self, event: ModelLoading) -> None:
        self.stall.enter("model loading")
        self.progress.setRange(0, 100)
        self.progress.setValue(round(100 * max(0.0, min(1.0, event.fraction))))
        self.progress.setFormat(f"{event.stage} %p%")
        self.progress.show()
        self.statusBar().showMessage(f"Loading {self._name_of(event.model_id)}: {event.stage}")

    def _on_loaded(self, event: ModelLoaded) -> None:
        asked = self.loads.pop(event.request_id, event.model_id)  # the id or path this load answers
        self.stall.leave("model loading")
        self.progress.hide()
        self.current_target = event.model_id
        in_catalog = any(e.id == event.model_id for e in self.targets_menu.entries)
        opened_by_path = None if in_catalog or asked == event.model_id else asked
        self.targets_menu.set_current(event.model_id, event.name, opened_by_path)
        self.model_label.setText(event.name)
        self.model_label.setToolTip(f"Drafter: {event.drafter}" if event.drafter else "Plain decoding")
        self.charts.set_current_target(event.model_id)
        self.banner.remove("engine")
        drafter = f" · drafter: {event.drafter}" if event.drafter else " · plain decoding"
        self.statusBar().showMessage(
            f"Loaded {event.name} in {event.load_seconds:.1f} s{drafter}", STATUS_MS
        )
        self.chat.set_empty_hint(f"Chat with {event.name}. Type a message below to start.")
        # Remember what to open next time (and after a worker restart): the catalog id,
        # or the path a model was opened by, which is all the worker knows it by. A
        # switch still queued behind this one decides instead.
        if not self.loads:
            self.wanted_target = self.targets_menu.request_key(event.model_id)
            self.apply_settings({"last_target": self.wanted_target}, tell_worker=False)

    def _on_tokens(self, event: TokenBatch) -> None:
        reply = self.active
        if reply is None or event.request_id != reply.request_id:
            return  # a late batch of a reply already finished (e.g. after Stop)
        self.stall.enter("streaming")
        for text, drafted in event.pieces:
            reply.text += text
            reply.drafted.extend([bool(drafted)] * len(text))
        self.store.update_last_message(reply.conv_id, reply.text, persist=False)
        if self.current_conv == reply.conv_id:
            self.chat.stream(event.pieces)

    def _on_turn_done(self, event: TurnDone) -> None:
        reply = self.active
        if reply is None or event.request_id != reply.request_id:
            return
        # The conversation keeps the stats in their saved (dict) form.
        stats = event.stats.as_dict() if event.stats is not None else None
        if event.stats is not None and event.stats.new_tokens > 0 and event.reason != "error":
            self.charts.add_turn(event.stats, event.model_id, event.baseline_tokens_per_s)
            self.statusBar().showMessage(
                describe_stats(stats, event.baseline_tokens_per_s), STATUS_MS * 2
            )
        note = reply.error if event.reason == "error" else NOTES.get(event.reason)
        self._finish_reply(
            event.text or reply.text, note, stats, event.model_id, event.baseline_tokens_per_s
        )

    def _on_learning(self, event: LearningProgress) -> None:
        self.learning_state = event.state
        if event.state == "running":
            self.stall.enter("learning")
        else:
            self.stall.leave("learning")
        self._learning_detail = event
        if event.steps > 0 and (event.loss is not None or event.acceptance is not None):
            self.charts.add_learning(
                event.model_id, event.steps, event.samples, event.loss, event.acceptance
            )
        self._refresh_learning_label()

    def _on_error(self, event: ErrorEvent) -> None:
        if event.detail:
            log.warning("engine error: %s\n%s", event.message, event.detail)
        request_id = event.request_id
        if self.active is not None and request_id == self.active.request_id:
            self.active.error = event.message  # TurnDone follows and shows it on the reply
        elif request_id in self.loads:
            del self.loads[request_id]
            self.progress.hide()
            self.stall.leave("model loading")
            if self.current_target is not None:  # keep (and after a restart reload) the old one
                self.wanted_target = self.targets_menu.request_key(self.current_target)
            self.targets_menu.set_current(self.current_target)
            if self.current_target is None:
                self.banner.show_message("engine", f"No model is loaded: {event.message}")
            self._warn("Could not load the model", event)
        elif request_id in self.adds:
            del self.adds[request_id]
            self._warn("Could not add the model", event)
        else:
            self.banner.show_message("error", event.message)

    def _on_notice(self, event: Notice) -> None:
        log.info("engine notice: %s", event.message)
        self.statusBar().showMessage(event.message, STATUS_MS * 2)

    def _warn(self, title: str, event: ErrorEvent) -> None:
        """A message box, opened from a fresh timer callback rather than right here.

        Here we are inside the asyncio task that pumps worker events; a modal box's
        nested event loop would stall that task (no events drained while it is open)
        and asyncio refuses to run another task's step inside it.
        """
        # The message is written for people; the technical detail went to the log above.
        QTimer.singleShot(0, self, lambda: QMessageBox.warning(self, title, event.message))

    # ---------------------------------------------------------------- worker health

    def _on_worker_died(self, message: str) -> None:
        self.engine_state = "restarting"
        self._forget_requests()
        self.progress.setRange(0, 0)
        self.progress.show()
        if self.active is not None:
            self._finish_reply(self.active.text, NOTES["worker_died"])
        name = self._name_of(self.current_target or self.wanted_target)
        self.banner.show_message("engine", f"{message} Restarting it and reloading {name}…")
        self.statusBar().showMessage("Restarting the engine…")

    def _on_worker_restarted(self) -> None:
        self.stall.enter("engine start")

    def _on_worker_gave_up(self, message: str) -> None:
        self.engine_state = "stopped"
        self.progress.hide()
        self.banner.show_message("engine", message)
        self.statusBar().showMessage("The engine is not running.")

    def restart_engine(self) -> None:
        if self.active is not None:
            self._finish_reply(self.active.text, NOTES["worker_died"])
        self.engine_state = "restarting"
        self.progress.setRange(0, 0)
        self.progress.show()
        self.statusBar().showMessage("Restarting the engine…")
        self.bridge.restart_now()

    # ================================================================ chatting

    def send_message(self, text: str) -> None:
        if self.active is not None:
            return
        if self.current_conv is None or self.current_conv not in self.store:
            self.current_conv = self.store.new(self.current_target).id
        conv_id = self.current_conv
        author = self._name_of(self.current_target or self.wanted_target)
        self.store.append_message(conv_id, "user", text)
        history = [
            {"role": m["role"], "content": m["content"]}
            for m in self.store.get(conv_id).messages
            if m["content"] or m["role"] == "user"  # a failed, empty reply is not context
        ]
        self.store.append_message(conv_id, "assistant", "", model_id=self.current_target)
        self.store.get(conv_id).messages[-1]["author"] = author
        s = self.settings
        request = ChatRequest(
            request_id=self.bridge.next_id(),
            messages=history,
            max_new_tokens=s.max_new_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            speculative=s.speculative,
        )
        self.active = ActiveReply(request.request_id, conv_id, author)
        self.chat.add_user(text)
        self.chat.begin_reply(author)
        self._set_busy(True)
        self._refresh_sidebar()
        if not self.bridge.send(request):
            self.active.error = "The engine is not running; the message was kept, send it again later."
            self._finish_reply("", self.active.error)

    def stop_reply(self) -> None:
        if self.active is not None:
            self.bridge.send(CancelRequest(self.active.request_id))
            self.statusBar().showMessage("Stopping…", STATUS_MS)

    def _finish_reply(
        self, text: str, note: str | None, stats: dict | None = None,
        model_id: str | None = None, baseline: float | None = None,
    ) -> None:
        reply = self.active
        if reply is None:
            return
        self.active = None
        drafted = (reply.drafted + [False] * len(text))[: len(text)]
        if reply.conv_id in self.store:
            self.store.update_last_message(reply.conv_id, text, stats=stats, persist=False)
            message = self.store.get(reply.conv_id).messages[-1]
            message["drafted"] = runs_from_mask(drafted)
            if model_id:
                message["model_id"] = model_id
            if baseline:
                message["baseline_tokens_per_s"] = baseline
            if note:
                message["note"] = note
            self.store.save(reply.conv_id)
        widget = self.chat.current_reply() if self.current_conv == reply.conv_id else None
        if widget is not None:
            widget.flush()
            if widget.raw != text:
                widget.set_text(text, drafted)
            widget.set_note(note)
            widget.set_meta(describe_stats(stats, baseline))
        self._set_busy(False)
        self.stall.leave("streaming")
        self._refresh_sidebar()

    def _set_busy(self, busy: bool) -> None:
        self.chat.set_busy(busy)
        self.stop_action.setEnabled(busy)

    # ================================================================ conversations

    def _first_conversation(self) -> str | None:
        conversations = self.store.list()
        return conversations[0].id if conversations else None

    def new_chat(self) -> None:
        current = self.store.get(self.current_conv) if self.current_conv in self.store else None
        if current is not None and not current.messages:
            self.chat.composer.setFocus()  # already on an empty chat
            return
        self.current_conv = self.store.new(self.current_target).id
        self._show_conversation(self.current_conv)

    def _show_conversation(self, conv_id: str | None, refresh: bool = True) -> None:
        """Put a chat on screen. refresh=False when the sidebar itself asked: rebuilding
        its list inside its own selection signal would delete the item being selected."""
        self.current_conv = conv_id if conv_id in self.store else None
        if self.current_conv is None:
            self.chat.clear()
        else:
            conv = self.store.get(self.current_conv)
            self.chat.load(conv.messages, self._name_of(conv.model_id or self.wanted_target))
            if self.active is not None and self.active.conv_id == conv_id:
                reply = self.chat.current_reply()
                if reply is not None:  # keep the live tint and the "still writing" look
                    reply.set_text(self.active.text, self.active.drafted)
        if refresh:
            self._refresh_sidebar()
        self.chat.composer.setFocus()

    def _refresh_sidebar(self) -> None:
        self.sidebar.show_conversations(self.store.list(), self.current_conv)

    def _rename_conversation(self, conv_id: str, title: str) -> None:
        if conv_id in self.store:
            self.store.rename(conv_id, title)
            self._refresh_sidebar()

    def _delete_conversation(self, conv_id: str) -> None:
        if self.active is not None and self.active.conv_id == conv_id:
            self.bridge.send(CancelRequest(self.active.request_id))
            self.active = None
            self._set_busy(False)
            self.stall.leave("streaming")
        self.store.delete(conv_id)
        if self.current_conv == conv_id:
            self.current_conv = None
            self._show_conversation(self._first_conversation())
        self._refresh_sidebar()

    def _with_chat(self, action) -> None:
        if self.current_conv in self.store:
            action(self.current_conv)

    # ================================================================ targets

    def switch_target(self, model_id: str) -> None:
        """Load another target; the conversation on screen stays and continues with it."""
        self.wanted_target = model_id
        self._request_switch(model_id)

    def _request_switch(self, id_or_path: str) -> None:
        request = SwitchTarget(self.bridge.next_id(), id_or_path)
        if self.bridge.send(request):
            self.loads[request.request_id] = id_or_path
            self.stall.enter("model loading")
            self.progress.setRange(0, 0)
            self.progress.show()
            self.statusBar().showMessage(f"Loading {self._name_of(id_or_path)}…")

    def add_model(self, path: str) -> None:
        request = AddModel(self.bridge.next_id(), path)
        if self.bridge.send(request):
            self.adds[request.request_id] = path
            self.statusBar().showMessage(f"Checking {path}…")

    def _forget_requests(self) -> None:
        self.loads.clear()
        self.adds.clear()

    def _name_of(self, model_id: str | None) -> str:
        if not model_id:
            return "the model"
        return self.targets_menu.name_of(model_id)

    # ================================================================ learning

    def set_learning_paused(self, paused: bool) -> None:
        self.bridge.send(PauseLearning(self.bridge.next_id(), paused))
        self.apply_settings({"learning_paused": paused}, tell_worker=False)
        self.learning_state = "paused" if paused else "idle"
        self._refresh_learning_label()

    def learn_now(self) -> None:
        if self.bridge.send(LearnNow(self.bridge.next_id())):
            self.statusBar().showMessage("Learning from recent chats now…", STATUS_MS)

    def reset_personalization(self) -> None:
        if self.current_target is None:
            return
        name = self._name_of(self.current_target)
        answer = QMessageBox.question(
            self,
            "Reset personalization",
            f"Forget everything the drafter learned for {name}? Its speed-up goes back to "
            "what it was before any learning.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
            QMessageBox.StandardButton.Cancel,
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.bridge.send(ResetPersonalization(self.bridge.next_id(), self.current_target))

    def _refresh_learning_label(self) -> None:
        state = self.learning_state
        text = f"Learning: {state}"
        detail = self._learning_detail
        if state == "running" and detail is not None:
            text += f" · step {detail.steps}"
            if detail.loss is not None:
                text += f" · loss {detail.loss:.3f}"
        elif state == "waiting" and detail is not None and detail.buffered:
            text += f" · {detail.buffered} repl{'y' if detail.buffered == 1 else 'ies'} buffered"
        self.learning_label.setText(text)
        self.pause_action.blockSignals(True)
        self.pause_action.setChecked(state == "paused" or self.settings.learning_paused)
        self.pause_action.blockSignals(False)

    # ================================================================ settings

    def apply_settings(self, changes: dict, tell_worker: bool = True) -> None:
        self.settings, problems = self.settings.updated(**changes)
        for problem in problems:
            self.statusBar().showMessage(problem, STATUS_MS)
        save_settings(self.settings)
        if tell_worker:
            self.bridge.send(UpdateSettings(self.bridge.next_id(), self.settings.to_dict()))
        self.chat.set_highlight(self.settings.highlight_drafts)
        self.highlight_action.blockSignals(True)
        self.highlight_action.setChecked(self.settings.highlight_drafts)
        self.highlight_action.blockSignals(False)

    def open_settings(self) -> None:
        dialog = SettingsDialog(self.settings, str(paths.data_dir()), self)
        dialog.clear_all_requested.connect(self.clear_all_data)
        if dialog.exec() and dialog.changes():
            self.apply_settings(dialog.changes())

    def clear_all_data(self) -> None:
        """Delete every file in the data folder (core.paths.clear_data: chats, damaged
        ones set aside, chats under another key, chart history, added models, learned
        state) and say what was kept: the encryption key file, if there is one.

        The worker holds learned state in memory and files, so it is stopped
        first and started fresh afterwards.
        """
        if self.active is not None:
            self._finish_reply(self.active.text, None)
        self.bridge.stop()
        for conv in self.store.list():  # the store forgets them; clear_data removes the rest
            self.store.delete(conv.id)
        kept = paths.clear_data()
        self.charts.clear()
        self.current_target = None
        if self.targets_menu.path_of(self.wanted_target) and not self._is_bundled(self.wanted_target):
            self.wanted_target = self.targets_menu.path_of(self.wanted_target)
        self._show_conversation(None)
        message = "All conversations and learned data were deleted."
        if kept:
            message += (f" Kept: {', '.join(kept)} (the encryption key file: it holds no data "
                        "of yours, and the running app still encrypts with it).")
        self.banner.show_message("cleared", message)
        self.engine_state = "starting"
        self.bridge.start()

    def _is_bundled(self, model_id: str) -> bool:
        return any(e.id == model_id and e.bundled for e in self.targets_menu.entries)

    # ================================================================ help

    def _show_responsiveness(self) -> None:
        QMessageBox.information(
            self,
            "Responsiveness",
            "Longest time the window could not react (measured with a 10 ms timer):\n"
            + self.stall.summary(),
        )

    def _about(self) -> None:
        QMessageBox.about(
            self,
            "About OmniDraft",
            f"<b>OmniDraft Desktop {__version__}</b><br>Local chat whose one small drafter "
            "speeds up any target model, learning from your own chats (OmniDraft, "
            "arXiv 2507.02659).<br>Your data: " + str(paths.data_dir()),
        )
