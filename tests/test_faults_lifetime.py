"""The fault tier (marker `fault`): an engine never outlives its app, and model
switches never pile up.

* A GUI killed while its worker loads a model: the worker ends within seconds
  (a model load checks nothing for minutes), frees the data folder, and the
  next app starts its engine.
* Target switches sent in a row: only the newest is served; the older ones are
  answered as superseded, and a load under way stops at its next layer.
"""

from __future__ import annotations

import queue
import time
from pathlib import Path

import pytest

from tests.fault_helpers import kill_gui_of_busy_worker

pytestmark = pytest.mark.fault

ROOT = Path(__file__).resolve().parent.parent

GUI_LOADING = r"""
import sys, time
from omnidraft.core.worker import process
from omnidraft.core.worker.protocol import ModelLoading, SwitchTarget, WorkerReady
from tests.fault_helpers import slow_load_worker_main

process.worker_main = slow_load_worker_main  # the real worker, its loads slowed down
handle = process.WorkerHandle(home=sys.argv[1], threads=1)
handle.start()
handle.send(SwitchTarget(handle.next_id(), sys.argv[2]))
while True:
    if any(isinstance(e, ModelLoading) and "slowly" in e.stage for e in handle.poll(0.1)):
        print(handle.pid, flush=True)
        break
time.sleep(600)
"""


def _wait(handle, match, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in handle.poll(0.1):
            if match(event):
                return event
    return None


def test_a_gui_killed_during_a_model_load_takes_its_engine_along(home, tmp_path, smol_tok):
    """Before: the worker, re-parented to PID 1, went on loading for minutes and
    held engine.lock, so the next app's engine did not start."""
    from omnidraft.core.storage.folder_lock import ENGINE_LOCK_NAME, FolderLock
    from omnidraft.core.worker.process import WorkerHandle
    from omnidraft.core.worker.protocol import ErrorEvent, WorkerReady

    worker = kill_gui_of_busy_worker(GUI_LOADING, home, tmp_path, smol_tok)  # killed while loading
    killed = time.monotonic()
    worker.wait(10)  # psutil.TimeoutExpired when the orphan goes on loading
    assert time.monotonic() - killed < 10
    with FolderLock(ENGINE_LOCK_NAME) as lock:
        assert lock.held

    again = WorkerHandle(home=str(home), threads=1)  # the app started again
    again.start()
    try:
        first = _wait(again, lambda e: isinstance(e, (WorkerReady, ErrorEvent)), 120)
        assert isinstance(first, WorkerReady), first
    finally:
        again.stop()


def test_the_give_up_message_names_the_menu_restart_engine_is_in():
    """Before: it said "Engine → Restart engine"; the item is in the Learning menu."""
    from omnidraft.app import main_window
    from omnidraft.app.worker_bridge import RESTART_HINT

    source = Path(main_window.__file__).read_text()
    row = next(line for line in source.splitlines() if '"restart_engine", "Restart engine"' in line)
    menu = row.split('"Restart engine", "')[1].split('"')[0].replace("&", "")
    assert f"{menu} → Restart engine" in RESTART_HINT


class _Events(list):
    """The worker's event queue, which calls `on_put` with each event as it is put."""

    def __init__(self, on_put):
        super().__init__()
        self.on_put = on_put

    def put(self, event) -> None:
        self.append(event)
        self.on_put(event)


def _serve(loop) -> None:
    """Run the worker's loop until every request is handled (no idle work)."""
    while (request := loop._next_request_now()) is not None:
        loop._handle_safely(request)


def _second_model(tmp_path, smol_tok) -> Path:
    from tests.tiny import tiny_llama

    folder = tmp_path / "tiny-smol"
    tiny_llama(len(smol_tok), seed=5).save_pretrained(folder)
    smol_tok.save_pretrained(folder)
    return folder


@pytest.fixture
def engine(home, target_dir):
    from tests.tiny import learning_engine

    return learning_engine(target_dir)


def _loop(engine, on_put=lambda event: None):
    from omnidraft.core.worker.process import WorkerLoop

    requests: queue.Queue = queue.Queue()
    loop = WorkerLoop(requests, _Events(on_put), engine)
    loop._next_request_now = lambda: loop.pending.popleft() if loop.pending else (
        None if requests.empty() else requests.get_nowait())
    return loop, requests


def test_superseded_switches_are_not_served(engine, tmp_path, smol_tok):
    """Before: five switches sent while a reply streamed were all served, one after another."""
    from omnidraft.core.worker.protocol import (
        ChatRequest,
        LoadStopped,
        ModelLoaded,
        SwitchTarget,
        TurnDone,
    )

    other = str(_second_model(tmp_path, smol_tok))
    first = engine.target.entry.id
    loop, requests = _loop(engine)
    requests.put(ChatRequest(1, [{"role": "user", "content": "a story"}], max_new_tokens=40))
    for i, model in enumerate([other, first, other, first, other]):
        requests.put(SwitchTarget(10 + i, model))
    _serve(loop)
    events = loop.events
    assert [e.request_id for e in events if isinstance(e, TurnDone)] == [1]
    assert [e.request_id for e in events if isinstance(e, ModelLoaded)] == [14]
    stopped = [e for e in events if isinstance(e, LoadStopped)]
    assert [(e.request_id, e.reason) for e in stopped] == [(i, "superseded") for i in range(10, 14)]
    assert engine.target.entry.path == other


@pytest.mark.parametrize("how", ["cancel", "newer switch"])
def test_a_load_under_way_stops_when_cancelled_or_superseded(engine, tmp_path, smol_tok, how):
    from omnidraft.core.worker.protocol import (
        CancelRequest,
        LoadStopped,
        ModelLoaded,
        ModelLoading,
        SwitchTarget,
    )

    other = str(_second_model(tmp_path, smol_tok))
    first = engine.target
    requests: queue.Queue = queue.Queue()

    def on_put(event) -> None:  # the person acts once the load has begun
        if isinstance(event, ModelLoading) and event.request_id == 20 and requests.empty():
            requests.put(CancelRequest(20) if how == "cancel" else SwitchTarget(21, first.entry.path))

    loop, requests = _loop(engine, on_put)
    requests.put(SwitchTarget(20, other))
    _serve(loop)
    events = loop.events
    (stopped,) = [e for e in events if isinstance(e, LoadStopped)]
    assert stopped.request_id == 20 and stopped.reason == ("cancelled" if how == "cancel" else "superseded")
    assert not any(isinstance(e, ModelLoaded) and e.request_id == 20 for e in events)
    if how == "cancel":
        assert engine.target is first  # the model loaded before stays
    else:
        assert [e.request_id for e in events if isinstance(e, ModelLoaded)] == [21]
