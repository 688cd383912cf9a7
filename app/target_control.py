"""Which target the user wants and which one answers: load and add requests.

TargetControl sends SwitchTarget and AddModel and matches their answers by
request id (an error tied to no request, or to another one, is never taken for
a load's failure), shows loading progress and the loaded model in the status
bar, and remembers what to load again after a restart. The window reacts to
`loaded` (charts, hints, settings) and shows `failed` in a message box.
"""

from __future__ import annotations

from omnidraft.core.worker.protocol import (
    AddModel,
    CatalogChanged,
    ErrorEvent,
    ModelLoaded,
    ModelLoading,
    SwitchTarget,
    WorkerReady,
)
from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QLabel, QProgressBar

from .banner import Banner
from .stall_monitor import StallMonitor
from .targets_menu import TargetsMenu
from .worker_bridge import WorkerBridge

STATUS_MS = 8000


class TargetControl(QObject):
    loaded = Signal(object)  # ModelLoaded, once the menu and the status bar show it
    failed = Signal(str, str)  # title, message: a load or add the user asked for failed
    status = Signal(str, int)  # status-bar text and how long (ms; 0 = until replaced)

    def __init__(
        self, bridge: WorkerBridge, menu: TargetsMenu, banner: Banner, stall: StallMonitor,
        wanted: str, parent: QObject | None = None,
    ):
        super().__init__(parent)
        self.bridge, self.menu, self.banner, self.stall = bridge, menu, banner, stall
        self.wanted = wanted  # catalog id or path to load (again after a restart)
        self.current: str | None = None  # id of the model that is loaded
        # The worker said it is ready and was asked for its model: requests sent
        # from now on queue behind that load.
        self.ready = False
        self.context_window = 0  # the most tokens it reads (0: not known yet)
        # Requests still unanswered, by request id: what each load or add asked for.
        self.loads: dict[int, str] = {}  # SwitchTarget id -> the id or path asked for
        self.adds: dict[int, str] = {}  # AddModel id -> the path
        self.model_label = QLabel("No model loaded")
        self.progress = QProgressBar()
        self.progress.setFixedWidth(160)
        self.busy()  # busy until the engine reports a fraction
        menu.switch_requested.connect(self.switch)
        menu.add_requested.connect(self.add)

    def name_of(self, model_id: str | None) -> str:
        return self.menu.name_of(model_id) if model_id else "the model"

    def busy(self) -> None:
        self.progress.setRange(0, 0)
        self.progress.show()

    # ------------------------------------------------------------ requests

    def switch(self, model_id: str) -> None:
        """Load another target; the conversation on screen stays and continues with it."""
        self.wanted = model_id
        self.request(model_id)

    def request(self, id_or_path: str) -> None:
        request = SwitchTarget(self.bridge.next_id(), id_or_path)
        if self.bridge.send(request):
            self.loads[request.request_id] = id_or_path
            self.stall.enter("model loading")
            self.busy()
            self.status.emit(f"Loading {self.name_of(id_or_path)}…", 0)

    def add(self, path: str) -> None:
        request = AddModel(self.bridge.next_id(), path)
        if self.bridge.send(request):
            self.adds[request.request_id] = path
            self.status.emit(f"Checking {path}…", 0)

    def forget_requests(self) -> None:
        """A fresh worker knows nothing of earlier requests (nor is it ready yet)."""
        self.loads.clear()
        self.adds.clear()
        self.ready = False

    def forget_loaded(self) -> None:
        """The learned state is gone (Clear all data): load the wanted model afresh,
        by path when it was a model the user added (the catalog forgot it)."""
        self.current = None
        path = self.menu.path_of(self.wanted)
        if path and not any(e.id == self.wanted and e.bundled for e in self.menu.entries):
            self.wanted = path

    # ------------------------------------------------------------ answers

    def on_ready(self, event: WorkerReady) -> None:
        self.menu.set_catalog(event.catalog)
        self.forget_requests()
        self.request(self.wanted)
        self.ready = True

    def on_catalog(self, event: CatalogChanged) -> None:
        self.adds.pop(event.request_id, None)
        self.menu.set_catalog(event.catalog)
        self.menu.set_current(self.current)
        if event.added_id:
            self.status.emit(f"Added {self.name_of(event.added_id)}", STATUS_MS)
            self.switch(event.added_id)

    def on_loading(self, event: ModelLoading) -> None:
        self.stall.enter("model loading")
        self.progress.setRange(0, 100)
        self.progress.setValue(round(100 * max(0.0, min(1.0, event.fraction))))
        self.progress.setFormat(f"{event.stage} %p%")
        self.progress.show()
        self.status.emit(f"Loading {self.name_of(event.model_id)}: {event.stage}", 0)

    def on_loaded(self, event: ModelLoaded) -> None:
        asked = self.loads.pop(event.request_id, event.model_id)  # the id or path this load answers
        self.stall.leave("model loading")
        self.progress.hide()
        self.current, self.context_window = event.model_id, event.context_window
        in_catalog = any(e.id == event.model_id for e in self.menu.entries)
        opened_by_path = None if in_catalog or asked == event.model_id else asked
        self.menu.set_current(event.model_id, event.name, opened_by_path)
        self.model_label.setText(event.name)
        self.model_label.setToolTip(f"Drafter: {event.drafter}" if event.drafter else "Plain decoding")
        self.banner.remove("engine")
        drafter = f" · drafter: {event.drafter}" if event.drafter else " · plain decoding"
        self.status.emit(f"Loaded {event.name} in {event.load_seconds:.1f} s{drafter}", STATUS_MS)
        # Remember what to open next time (and after a worker restart): the catalog id,
        # or the path a model was opened by, which is all the worker knows it by. A
        # switch still queued behind this one decides instead.
        if not self.loads:
            self.wanted = self.menu.request_key(event.model_id)
        self.loaded.emit(event)

    def on_error(self, event: ErrorEvent) -> bool:
        """True when the error answers a load or an add of ours."""
        if event.request_id in self.loads:
            del self.loads[event.request_id]
            self.progress.hide()
            self.stall.leave("model loading")
            if self.current is not None:  # keep (and after a restart reload) the old one
                self.wanted = self.menu.request_key(self.current)
            self.menu.set_current(self.current)
            if self.current is None:
                self.banner.show_message("engine", f"No model is loaded: {event.message}")
            self.failed.emit("Could not load the model", event.message)
            return True
        if event.request_id in self.adds:
            del self.adds[event.request_id]
            self.failed.emit("Could not add the model", event.message)
            return True
        return False
