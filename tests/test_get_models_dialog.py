"""The Get models dialog as a person uses it: what each model needs and whether this
computer has it, Download with a progress bar, Cancel, Resume (also after a
restart), a clear message when offline, and the finished file handed on to be
added to the catalog. Downloads go to a local server that answers like the Hub."""

from __future__ import annotations

import socket

import pytest
from omnidraft.app import get_models_dialog
from omnidraft.app.get_models_dialog import GetModelsDialog, machine_fit
from omnidraft.app.targets_menu import TargetsMenu
from omnidraft.core.models.downloads import CURATED, Offer, local_state
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QProgressBar

from tests.tiny import write_tiny_gguf

WAIT_MS = 30_000
OFFER = Offer("tiny-test", "Tiny Test", "test-org/Tiny-GGUF", "tiny-q8_0.gguf",
              1_000_000, 30_000, "a test model", "MIT")


@pytest.fixture
def gguf_bytes(tmp_path) -> bytes:
    return write_tiny_gguf(tmp_path / "source.gguf").read_bytes()


@pytest.fixture
def dialog(home, qtbot):
    made: list[GetModelsDialog] = []

    def make(offers=(OFFER,)) -> GetModelsDialog:
        dlg = GetModelsDialog(offers=offers)
        qtbot.addWidget(dlg)
        made.append(dlg)
        return dlg

    yield make
    for dlg in made:  # no download thread outlives its test
        for transfer in dlg.transfers.values():
            transfer.cancel.set()


def click(qtbot, dlg: GetModelsDialog, offer_id: str) -> None:
    qtbot.mouseClick(dlg.button(offer_id), Qt.MouseButton.LeftButton)


def test_every_curated_model_shows_size_memory_and_whether_it_fits(dialog, monkeypatch):
    plenty, little = 64 * 10**9, 3 * 10**9
    memory = type("M", (), {"available": little})()
    monkeypatch.setattr(get_models_dialog.psutil, "virtual_memory", lambda: memory)
    dlg = dialog(CURATED)
    table = dlg.table
    assert table.rowCount() == len(CURATED)
    for row, offer in enumerate(CURATED):
        assert offer.name in table.cellWidget(row, 0).text()
        assert table.item(row, 1).text() == f"{offer.size_bytes / 1e9:.1f} GB"
        assert table.item(row, 2).text() == f"{offer.memory_bytes / 1e9:.1f} GB"
        fits = offer.memory_bytes <= little
        assert table.item(row, 3).text().startswith("Fits" if fits else "Too little memory"), offer
        assert dlg.button(offer.id).text() == "Download"
    assert "3.0 GB of memory free" in dlg.machine.text()
    small = min(CURATED, key=lambda o: o.params)
    assert machine_fit(small, plenty, 0) == (False, "Too little disk (0.0 GB free)")
    assert machine_fit(small, plenty, plenty) == (True, "Fits")


def test_download_shows_progress_and_hands_the_file_on(dialog, qtbot, hub, gguf_bytes):
    served = hub.add(OFFER.repo_id, OFFER.filename, gguf_bytes)
    served.hold_at = len(gguf_bytes) // 2  # the transfer pauses half-way until released
    dlg = dialog()
    click(qtbot, dlg, OFFER.id)
    assert isinstance(dlg.table.cellWidget(0, 4), QProgressBar)
    assert dlg.button(OFFER.id).text() == "Cancel"
    qtbot.waitUntil(lambda: dlg.status(OFFER.id).endswith(f"of {len(gguf_bytes) / 1e9:.1f} GB")
                    and not dlg.status(OFFER.id).startswith("0%"), timeout=WAIT_MS)
    served.go.set()
    with qtbot.waitSignal(dlg.add_requested, timeout=WAIT_MS) as added:
        pass
    path = local_state(OFFER).path
    assert added.args == [str(path)] and path.read_bytes() == gguf_bytes
    assert dlg.status(OFFER.id) == "Downloaded" and dlg.button(OFFER.id).text() == "Use"
    with qtbot.waitSignal(dlg.add_requested) as again:
        click(qtbot, dlg, OFFER.id)  # Use: add it (again) to the catalog
    assert again.args == [str(path)]


def test_cancel_then_resume_after_a_restart(dialog, qtbot, hub, gguf_bytes):
    served = hub.add(OFFER.repo_id, OFFER.filename, gguf_bytes)
    served.hold_at = len(gguf_bytes) // 2
    dlg = dialog()
    click(qtbot, dlg, OFFER.id)
    qtbot.waitUntil(lambda: local_state(OFFER).partial_bytes > 0, timeout=WAIT_MS)
    click(qtbot, dlg, OFFER.id)  # Cancel
    assert dlg.button(OFFER.id).text() == "Cancelling…"
    served.go.set()  # the next piece arrives, and the thread sees the cancel
    qtbot.waitUntil(lambda: not dlg.downloading(), timeout=WAIT_MS)
    partial = local_state(OFFER).partial_bytes
    assert 0 < partial < len(gguf_bytes)
    assert dlg.status(OFFER.id) == f"Paused at {partial / len(gguf_bytes):.0%}"
    assert dlg.button(OFFER.id).text() == "Resume" and not dlg.message.isVisible()

    restarted = dialog()  # a new session: only the files on disk remain
    assert restarted.button(OFFER.id).text() == "Resume"
    with qtbot.waitSignal(restarted.add_requested, timeout=WAIT_MS):
        click(qtbot, restarted, OFFER.id)
    assert served.ranges[-1] == f"bytes={partial}-"
    assert local_state(OFFER).path.read_bytes() == gguf_bytes


def test_offline_is_explained_and_the_download_can_be_tried_again(dialog, qtbot, monkeypatch):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    dlg = dialog()
    dlg.show()
    click(qtbot, dlg, OFFER.id)
    qtbot.waitUntil(lambda: not dlg.downloading(), timeout=WAIT_MS)
    assert dlg.message.isVisible() and "seems to be offline" in dlg.message.text()
    assert dlg.status(OFFER.id) == "Failed" and dlg.button(OFFER.id).text() == "Download"


def test_targets_menu_opens_the_dialog_and_adds_what_it_downloaded(home, qtbot, tmp_path):
    menu = TargetsMenu()
    action = next(a for a in menu.actions() if a.text() == "Get models…")
    action.trigger()
    assert menu.get_models is not None and menu.get_models.isVisible()
    qtbot.addWidget(menu.get_models)
    path = str(tmp_path / "model.gguf")
    with qtbot.waitSignal(menu.add_requested) as added:
        menu.get_models.add_requested.emit(path)
    assert added.args == [path]
    first = menu.get_models
    first.hide()
    action.trigger()  # the same dialog again, with its downloads
    assert menu.get_models is first and first.isVisible()


def test_a_finished_download_is_sent_to_the_engine_to_join_the_catalog(home, qapp, qt_loop, qtbot, hub,
                                                                       gguf_bytes, monkeypatch):
    """In the window: Targets → Get models…, Download; the file goes to the engine as
    AddModel, whose answer (CatalogChanged) then switches to it like any added model."""
    from omnidraft.app.main_window import MainWindow
    from omnidraft.core.worker.protocol import AddModel

    from tests.gui_helpers import ScriptedWorker, dispose

    monkeypatch.setattr(get_models_dialog, "CURATED", (OFFER,))  # what the menu's dialog lists
    hub.add(OFFER.repo_id, OFFER.filename, gguf_bytes)
    worker = ScriptedWorker()
    win = MainWindow(target="qwen", handle=worker)
    try:
        next(a for a in win.targets_menu.actions() if a.text() == "Get models…").trigger()
        dlg = win.targets_menu.get_models
        click(qtbot, dlg, OFFER.id)
        qtbot.waitUntil(lambda: any(isinstance(r, AddModel) for r in worker.sent), timeout=WAIT_MS)
        add = next(r for r in worker.sent if isinstance(r, AddModel))
        assert add.path == str(local_state(OFFER).path) and add.request_id in win.targets.adds
    finally:
        win.close()
        dispose(qapp, win)
