"""One app and one engine per data folder (core/storage/folder_lock.py,
app/single_instance.py, the worker's engine lock and its end with its GUI)."""

from __future__ import annotations

import os
import queue
import threading

import pytest
from omnidraft.core.storage import paths
from omnidraft.core.storage.folder_lock import (
    ENGINE_LOCK_NAME,
    INSTANCE_LOCK_NAME,
    FolderBusyError,
    FolderLock,
)
from omnidraft.core.worker import process
from omnidraft.core.worker.protocol import (
    ChatRequest,
    ErrorEvent,
    TokenBatch,
    TurnDone,
    WorkerReady,
)

from tests.test_worker import TIMEOUT, Events, user


def test_a_second_holder_is_refused_with_the_first_ones_pid(home):
    first = FolderLock().acquire()
    try:
        with pytest.raises(FolderBusyError) as refused:
            FolderLock().acquire()
        assert refused.value.pid == os.getpid()
        message = str(refused.value)
        assert f"process {os.getpid()}" in message and str(paths.data_dir()) in message
        assert first.held
    finally:
        first.release()
    with FolderLock() as second:  # released: the next start takes it
        assert second.held


def test_the_app_and_engine_locks_are_independent(home):
    with FolderLock(INSTANCE_LOCK_NAME), FolderLock(ENGINE_LOCK_NAME) as engine:
        assert engine.held


def test_clear_all_data_keeps_the_held_lock_working(home):
    held = FolderLock().acquire()
    try:
        (paths.data_dir() / "conversations").mkdir()
        kept = paths.clear_data()
        assert kept == [INSTANCE_LOCK_NAME]
        with pytest.raises(FolderBusyError):  # not a fresh file a second app could lock
            FolderLock().acquire()
    finally:
        held.release()


def test_a_second_app_brings_the_first_one_forward_and_does_not_open_the_folder(home, qtbot):
    from omnidraft.app.single_instance import RaiseServer, claim_folder

    folder = paths.data_dir()
    lock, message = claim_folder(folder)
    assert lock is not None and message == ""
    try:
        server = RaiseServer(folder)
        with qtbot.waitSignal(server.raise_requested, timeout=5000):
            second, message = claim_folder(folder)
        assert second is None
        assert "already open" in message and "brought to the front" in message
        assert f"process {os.getpid()}" in message
    finally:
        lock.release()


def test_without_an_answer_the_second_app_still_explains(home, qapp):
    from omnidraft.app.single_instance import claim_folder

    with FolderLock(folder=paths.data_dir()):  # an app that does not answer (no server)
        second, message = claim_folder(paths.data_dir())
    assert second is None and "Only one can use a folder at a time" in message


def test_a_second_engine_on_a_folder_does_not_start(home, monkeypatch):
    import torch

    monkeypatch.setattr(process, "ENGINE_LOCK_WAIT_S", 0.3)
    events: queue.Queue = queue.Queue()
    with FolderLock(ENGINE_LOCK_NAME):  # this process's torch threads stay as they are
        process.worker_main(queue.Queue(), events, str(home), threads=torch.get_num_threads())
    error = events.get_nowait()
    assert isinstance(error, ErrorEvent) and "did not start" in error.message
    assert events.empty()  # no WorkerReady: no engine ran


def test_a_running_reply_stops_when_the_gui_is_gone(home, tiny_engine_model):
    """Without this the worker writes up to max_new_tokens for nobody, holding the folder."""
    from omnidraft.core.engine import Engine

    engine = Engine()
    engine.load_target(str(tiny_engine_model), measure_baseline=False)
    requests: queue.Queue = queue.Queue()
    out: queue.Queue = queue.Queue()
    gui = threading.Event()
    gui.set()
    loop = process.WorkerLoop(requests, out, engine, parent_alive=gui.is_set)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    events = Events(out)
    events.until(lambda e: isinstance(e, WorkerReady))
    requests.put(ChatRequest(1, user("a long story"), max_new_tokens=100_000))
    events.until(lambda e: isinstance(e, TokenBatch))
    gui.clear()
    done = events.until(lambda e: isinstance(e, TurnDone))[-1]
    assert done.reason == "cancelled" and 0 < done.stats.new_tokens < 100_000
    thread.join(TIMEOUT)
    assert not thread.is_alive(), "an orphaned worker ends"


@pytest.fixture
def tiny_engine_model(tmp_path, smol_tok):
    from tests.tiny import tiny_smol_target

    folder = tmp_path / "tiny-smol"
    tiny_smol_target(folder, smol_tok)
    return folder
