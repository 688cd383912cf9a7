"""Targets → Model info…: what the loaded target is and how the drafter's vocabulary
relates to it. The engine computes it (core.models.model_info); this asks for it
with a DescribeTarget request and shows the answer that carries the same id."""

from __future__ import annotations

from omnidraft.core.models.model_info import ModelInfo
from omnidraft.core.worker.protocol import DescribeTarget, ErrorEvent, TargetDescribed
from PySide6.QtCore import QObject, Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLayout,
    QVBoxLayout,
    QWidget,
)

from .worker_bridge import WorkerBridge


def count(n: int) -> str:
    """A parameter count as people say it: '1.54 billion', '135 million'."""
    for size, word in ((1e9, "billion"), (1e6, "million"), (1e3, "thousand")):
        if n >= size:
            return f"{n / size:.3g} {word}"
    return str(n)


def rows(info: ModelInfo) -> list[tuple[str, str]]:
    """The dialog's lines: (label, text)."""
    context = f"{info.context_length:,} tokens" if info.context_length else "not stated by the model"
    out = [
        ("Model", info.name),
        ("Architecture", info.architecture),
        ("Parameters", f"{count(info.parameters)} ({info.parameters:,})"),
        ("Stored as", info.quantization),
        ("Runs here as", info.runs_as),
        ("Context length", f"{context}; a chat gets the latest {info.context_used:,}"),
        ("Tokenizer", f"{info.tokenizer_size:,} tokens"),
    ]
    if info.drafter is None:
        return out + [("Drafter", "none: drafting is off for this model")]
    out.append(("Drafter", f"{info.drafter} ({info.drafter_vocab:,} tokens)"))
    if info.same_vocabulary:
        out.append(("Vocabularies", "the same tokenizer as the target: drafted tokens are used as they are"))
    else:
        direct = (
            f"{info.direct_share:.1%} of the drafter's tokens ({info.direct_mapped:,} of "
            f"{info.drafter_vocab:,}) are spelled like one of the target's and map to it directly"
        )
        runs = f"{info.ngram_entries:,} drafter-to-target token runs" if info.ngram_entries else "none yet"
        learned = f"{runs} (learned from accepted text, for what the direct map cannot express)"
        out += [("Direct mapping", direct), ("Learned n-grams", learned)]
    return out


class ModelInfoDialog(QDialog):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Model info")
        self.setObjectName("ModelInfoDialog")
        layout = QVBoxLayout(self)
        layout.setSizeConstraint(QLayout.SizeConstraint.SetFixedSize)  # exactly as big as what it says
        self.form = QFormLayout()
        self.form.setLabelAlignment(Qt.AlignmentFlag.AlignRight)
        layout.addLayout(self.form)
        self.note = QLabel()
        self.note.setWordWrap(True)
        layout.addWidget(self.note)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.hide)
        layout.addWidget(buttons)

    def _show(self, note: str, lines: list[tuple[str, str]] = ()) -> None:
        while self.form.rowCount():
            self.form.removeRow(0)
        for label, text in lines:
            value = QLabel(text)
            value.setWordWrap(True)
            value.setMinimumWidth(420)  # wrapped lines are measured at this width, not a sliver
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.form.addRow(f"{label}:", value)
        self.note.setText(note)
        self.note.setVisible(bool(note))

    def show_waiting(self) -> None:
        self._show("Asking the engine… (it answers once the reply it is writing is done)")

    def show_error(self, message: str) -> None:
        self._show(message)

    def show_info(self, info: ModelInfo) -> None:
        self._show("", rows(info))

    def texts(self) -> dict[str, str]:
        """What the dialog shows, label -> text (for tests and screen readers' sake alike)."""
        out = {}
        for row in range(self.form.rowCount()):
            label = self.form.itemAt(row, QFormLayout.ItemRole.LabelRole).widget().text()
            out[label.rstrip(":")] = self.form.itemAt(row, QFormLayout.ItemRole.FieldRole).widget().text()
        return out


class ModelInfoControl(QObject):
    """Sends DescribeTarget when the user asks and routes the answer (or the error)
    with that request id to the dialog; the window forwards both events here."""

    def __init__(self, bridge: WorkerBridge, parent: QWidget):
        super().__init__(parent)
        self.bridge = bridge
        self.dialog = ModelInfoDialog(parent)
        self.asked: int | None = None  # the request the dialog waits for
        bridge.died.connect(self._engine_stopped)

    def ask(self) -> None:
        request = DescribeTarget(self.bridge.next_id())
        if self.bridge.send(request):
            self.asked = request.request_id
            self.dialog.show_waiting()
        else:
            self.dialog.show_error("The engine is not running; ask again once it has started.")
        self.dialog.show()
        self.dialog.raise_()
        self.dialog.activateWindow()

    def _engine_stopped(self) -> None:
        if self.asked is not None:  # the answer will never come
            self.asked = None
            self.dialog.show_error("The engine stopped before it answered; ask again once it is back.")

    def on_described(self, event: TargetDescribed) -> None:
        if event.request_id == self.asked:
            self.asked = None
            self.dialog.show_info(event.info)

    def on_error(self, event: ErrorEvent) -> bool:
        """True when the error answers our request (and is shown in the dialog)."""
        if event.request_id is None or event.request_id != self.asked:
            return False
        self.asked = None
        self.dialog.show_error(event.message)
        return True
