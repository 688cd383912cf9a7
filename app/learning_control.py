"""The drafter's learning as the user sees and steers it: pause, learn now,
reset, and the status-bar line saying what the learner is doing."""

from __future__ import annotations

from omnidraft.core.worker.protocol import (
    LearningProgress,
    LearnNow,
    PauseLearning,
    ResetPersonalization,
)
from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QLabel, QMessageBox, QWidget

from .charts import ChartsPanel
from .stall_monitor import StallMonitor
from .target_control import TargetControl
from .worker_bridge import WorkerBridge


def describe_learning(state: str, detail: LearningProgress | None) -> str:
    text = f"Learning: {state}"
    if state == "running" and detail is not None:
        text += f" · step {detail.steps}"
        if detail.loss is not None:
            text += f" · loss {detail.loss:.3f}"
    elif state == "waiting" and detail is not None and detail.buffered:
        text += f" · {detail.buffered} sample{'' if detail.buffered == 1 else 's'} to learn"
    return text


def set_checked_quietly(action: QAction, on: bool) -> None:
    """Show a state on a checkable action without running what it is connected to."""
    action.blockSignals(True)
    action.setChecked(on)
    action.blockSignals(False)


class LearningControl(QObject):
    paused_changed = Signal(bool)  # the user paused or resumed: a setting to save
    status = Signal(str, int)

    def __init__(
        self, bridge: WorkerBridge, targets: TargetControl, charts: ChartsPanel, stall: StallMonitor,
        paused: bool, parent: QObject | None = None,
    ):
        super().__init__(parent)
        self.bridge, self.targets, self.charts, self.stall = bridge, targets, charts, stall
        self.paused = paused  # the user's choice; the worker's reports may lag behind it
        self.state = "paused" if paused else "idle"
        self.detail: LearningProgress | None = None
        self.label = QLabel(describe_learning(self.state, None))
        self.pause_action: QAction | None = None  # the menu's, once the menus are built

    def set_paused(self, paused: bool) -> None:
        self.bridge.send(PauseLearning(self.bridge.next_id(), paused))
        self.paused = paused
        self.state = "paused" if paused else "idle"
        self.paused_changed.emit(paused)
        self._refresh()

    def learn_now(self) -> None:
        if self.bridge.send(LearnNow(self.bridge.next_id())):
            self.status.emit("Learning from recent chats now…", 8000)

    def reset(self, parent: QWidget) -> None:
        """Forget what the drafter learned for the current target, once the user agrees."""
        target = self.targets.current
        if target is None:
            return
        answer = QMessageBox.question(
            parent, "Reset personalization",
            f"Forget everything the drafter learned for {self.targets.name_of(target)}, "
            "and the recent turns it learns from? "
            "Its speed-up goes back to what it was before any learning.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
            QMessageBox.StandardButton.Cancel,
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.bridge.send(ResetPersonalization(self.bridge.next_id(), target))

    def on_progress(self, event: LearningProgress) -> None:
        self.state, self.detail = event.state, event
        (self.stall.enter if event.state == "running" else self.stall.leave)("learning")
        if event.steps > 0 and (event.loss is not None or event.acceptance is not None):
            self.charts.add_learning(event.model_id, event.steps, event.samples, event.loss, event.acceptance)
        self._refresh()

    def _refresh(self) -> None:
        self.label.setText(describe_learning(self.state, self.detail))
        if self.pause_action is not None:
            set_checked_quietly(self.pause_action, self.paused or self.state == "paused")
