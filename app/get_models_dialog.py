"""The "Get models…" dialog: curated instruct models from Hugging Face, what each
needs, whether this computer has it, and their downloads.

Downloads run core.models.downloads.download on threads of their own (the GUI
never waits on the network); a finished file is handed on through
`add_requested`, which the Targets menu sends to the engine as "add this model",
the same path a local GGUF file takes. Closing the dialog hides it: downloads go
on. Cancelling, a failure or quitting keeps what arrived, and Resume continues it,
in this session or a later one.
"""

from __future__ import annotations

import logging
import shutil
import threading
from dataclasses import dataclass, field
from html import escape

import psutil
from omnidraft.core.models.downloads import (
    CURATED,
    DownloadCancelled,
    DownloadError,
    LocalState,
    Offer,
    download,
    local_state,
    models_dir,
)
from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from . import theme

log = logging.getLogger(__name__)


def download_failure(exc: BaseException) -> str:
    """A sentence for a download that failed unexpectedly (the log has the rest)."""
    from omnidraft.core.storage.persistence import is_disk_full

    if is_disk_full(exc):
        return "The download failed: the disk is full. Free some space and try again; it resumes where it stopped."
    return "The download failed unexpectedly; try again (it resumes where it stopped). The log has the details."

PROGRESS_MS = 100  # how often the progress bars are updated while downloads run
COLUMNS = ("Model", "Download", "Memory needed", "On this computer", "Status", "")


def gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


class _Relay(QObject):
    """Carries a download thread's end to the GUI thread (queued signals)."""

    finished = Signal(str, str)  # offer id, path of the checked file
    failed = Signal(str, str)  # offer id, message for people ("" when cancelled)


@dataclass
class _Transfer:
    """One download on its own thread. Its progress is read by the dialog's timer,
    so a stalled connection shows where it stalled, and the GUI is never flooded."""

    offer: Offer
    relay: _Relay
    cancel: threading.Event = field(default_factory=threading.Event)
    done: int = 0
    total: int = 0

    def run(self) -> None:
        try:
            path = download(self.offer, self._progress, self.cancel.is_set)
        except DownloadCancelled:
            self._emit(self.relay.failed, self.offer.id, "")
        except DownloadError as exc:
            self._emit(self.relay.failed, self.offer.id, str(exc))
        except Exception as exc:  # a thread's error must reach the person
            log.warning("download of %s failed", self.offer.id, exc_info=exc)
            self._emit(self.relay.failed, self.offer.id, download_failure(exc))
        else:
            self._emit(self.relay.finished, self.offer.id, str(path))

    def _progress(self, done: int, total: int) -> None:
        self.done, self.total = done, total

    @staticmethod
    def _emit(signal, *args) -> None:
        try:
            signal.emit(*args)
        except RuntimeError:  # the dialog is gone (the app is quitting): nobody to tell
            pass


def machine_fit(offer: Offer, memory_free: int, disk_free: int, on_disk: int = 0) -> tuple[bool, str]:
    """Whether this computer can take the model: (fits, a few words saying so)."""
    if offer.memory_bytes > memory_free:
        return False, f"Too little memory ({gb(memory_free)} free)"
    if offer.size_bytes - on_disk > disk_free:
        return False, f"Too little disk ({gb(disk_free)} free)"
    return True, "Fits"


class GetModelsDialog(QDialog):
    add_requested = Signal(str)  # a downloaded model file, for the catalog

    def __init__(self, parent: QWidget | None = None, offers: tuple[Offer, ...] | None = None):
        super().__init__(parent)
        self.setWindowTitle("Get models")
        self.setObjectName("GetModelsDialog")
        self.resize(1080, 430)
        self.offers = {o.id: o for o in offers or CURATED}
        self.transfers: dict[str, _Transfer] = {}
        self.errors: dict[str, str] = {}
        self.relay = _Relay(self)
        self.timer = QTimer(self, interval=PROGRESS_MS)
        self.timer.timeout.connect(self._show_progress)
        self.relay.finished.connect(self._on_finished)
        self.relay.failed.connect(self._on_failed)
        # The threads outlive nothing: when the dialog goes (the window closed), every
        # download stops at its next piece. A closure, not a method: self is gone then.
        transfers = self.transfers
        self.destroyed.connect(lambda *_: [t.cancel.set() for t in transfers.values()])

        layout = QVBoxLayout(self)
        intro = QLabel(
            "Instruct models in GGUF format (Q4_K_M) from Hugging Face. A downloaded model "
            "is added to the Targets menu; the drafter works with every one of them."
        )
        intro.setWordWrap(True)
        layout.addWidget(intro)
        self.machine = QLabel()
        self.machine.setObjectName("MachineSummary")
        layout.addWidget(self.machine)
        self.table = QTableWidget(len(self.offers), len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.table.setWordWrap(True)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column in range(1, len(COLUMNS)):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(4, QHeaderView.ResizeMode.Fixed)
        self.table.setColumnWidth(4, 150)  # room for a progress bar's "37% of 4.7 GB"
        layout.addWidget(self.table, 1)
        note = QLabel(
            "Memory needed: the model file (its weights run as the file stores them), its "
            "memory of the conversation (the KV cache) at your context length (Settings; else "
            "the model's own), and about 1.3 GB for the app and the drafter."
        )
        note.setWordWrap(True)
        note.setObjectName("MessageMeta")
        layout.addWidget(note)
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setObjectName("ErrorText")  # the theme's sheet colours it
        self.message.hide()
        layout.addWidget(self.message)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.hide)
        layout.addWidget(buttons)
        self.refresh()

    # ------------------------------------------------------------ what is shown

    def showEvent(self, event) -> None:
        self.refresh()  # free memory and disk change while the dialog is closed
        super().showEvent(event)

    def refresh(self) -> None:
        memory_free = psutil.virtual_memory().available
        disk_free = shutil.disk_usage(models_dir()).free
        self.machine.setText(
            f"This computer: {gb(memory_free)} of memory free, {gb(disk_free)} of disk free "
            f"in {models_dir()}."
        )
        for row, offer in enumerate(self.offers.values()):
            self._fill_row(row, offer, memory_free, disk_free)
        self.table.resizeRowsToContents()

    def row_of(self, offer_id: str) -> int:
        return list(self.offers).index(offer_id)

    def _fill_row(self, row: int, offer: Offer, memory_free: int, disk_free: int) -> None:
        name = QLabel(
            f"<b>{escape(offer.name)}</b><br><span style='color:{theme.current().muted}'>"
            f"{escape(offer.description)} · {escape(offer.license)}</span>"
        )
        name.setContentsMargins(6, 3, 6, 3)
        name.setToolTip(f"{offer.repo_id}/{offer.filename}\n{offer.page}")
        self.table.setCellWidget(row, 0, name)
        self.table.setItem(row, 1, QTableWidgetItem(gb(offer.size_bytes)))
        self.table.setItem(row, 2, QTableWidgetItem(gb(offer.memory_bytes)))
        state = local_state(offer)
        fits, words = machine_fit(offer, memory_free, disk_free, state.partial_bytes)
        fit = QTableWidgetItem(words)
        fit.setForeground(QColor(theme.current().good if fits else theme.current().bad))
        self.table.setItem(row, 3, fit)
        self._show_state(row, offer, state)

    def _show_state(self, row: int, offer: Offer, state: LocalState | None = None) -> None:
        """The status cell and the button for what the offer's download is doing now."""
        state = state or local_state(offer)
        running = offer.id in self.transfers
        if running:
            if not isinstance(self.table.cellWidget(row, 4), QProgressBar):
                bar = QProgressBar()
                bar.setRange(0, 1000)
                bar.setFormat("Starting…")
                self.table.setCellWidget(row, 4, bar)
        else:
            self.table.removeCellWidget(row, 4)
            self.table.setItem(row, 4, QTableWidgetItem(self._status_text(offer, state)))
        if running:
            text, slot = "Cancel", lambda _=False, i=offer.id: self.cancel(i)
        elif state.path is not None:
            text, slot = "Use", lambda _=False, p=str(state.path): self.add_requested.emit(p)
        elif state.partial_bytes:
            text, slot = "Resume", lambda _=False, i=offer.id: self.start(i)
        else:
            text, slot = "Download", lambda _=False, i=offer.id: self.start(i)
        button = QPushButton(text)
        button.setObjectName(f"action-{offer.id}")
        button.clicked.connect(slot)
        self.table.setCellWidget(row, 5, button)

    def _status_text(self, offer: Offer, state: LocalState) -> str:
        if state.path is not None:
            return "Downloaded"
        at = f" at {state.fraction:.0%}" if state.partial_bytes else ""
        if offer.id in self.errors:
            return "Failed" + at
        return f"Paused{at}" if at else ""

    def button(self, offer_id: str) -> QPushButton:
        return self.table.cellWidget(self.row_of(offer_id), 5)

    def status(self, offer_id: str) -> str:
        """What the status cell says (the progress bar's text while downloading)."""
        row = self.row_of(offer_id)
        bar = self.table.cellWidget(row, 4)
        if isinstance(bar, QProgressBar):
            return bar.text()
        item = self.table.item(row, 4)
        return item.text() if item else ""

    # ------------------------------------------------------------ downloads

    def start(self, offer_id: str) -> None:
        if offer_id in self.transfers:
            return
        self.errors.pop(offer_id, None)
        self._show_message()
        transfer = _Transfer(self.offers[offer_id], self.relay)
        self.transfers[offer_id] = transfer
        self._show_state(self.row_of(offer_id), transfer.offer)
        self.timer.start()
        threading.Thread(target=transfer.run, name=f"download-{offer_id}", daemon=True).start()

    def cancel(self, offer_id: str) -> None:
        transfer = self.transfers.get(offer_id)
        if transfer is not None:
            transfer.cancel.set()
            self.button(offer_id).setEnabled(False)
            self.button(offer_id).setText("Cancelling…")

    def downloading(self) -> list[str]:
        return list(self.transfers)

    def _show_progress(self) -> None:
        for offer_id, transfer in self.transfers.items():
            bar = self.table.cellWidget(self.row_of(offer_id), 4)
            if isinstance(bar, QProgressBar) and transfer.total > 0:
                bar.setValue(round(1000 * transfer.done / transfer.total))
                bar.setFormat(f"{transfer.done / transfer.total:.0%} of {gb(transfer.total)}")

    def _ended(self, offer_id: str) -> None:
        self.transfers.pop(offer_id, None)
        if not self.transfers:
            self.timer.stop()

    def _on_finished(self, offer_id: str, path: str) -> None:
        self._ended(offer_id)
        self.refresh()
        self.add_requested.emit(path)

    def _on_failed(self, offer_id: str, message: str) -> None:
        self._ended(offer_id)
        if message:
            self.errors[offer_id] = message
        self._show_message()
        self.refresh()

    def _show_message(self) -> None:
        text = "\n".join(self.errors.values())
        self.message.setText(text)
        self.message.setVisible(bool(text))
