"""Idle learning and power: on battery it waits for mains power (unless the user
lets it learn there), the status bar is told, and without a battery sensor
nothing changes. The sensor's reading is injected."""

from __future__ import annotations

import queue
import threading
import time

import pytest
from omnidraft.core.storage.settings import Settings
from omnidraft.core.worker import power, process
from omnidraft.core.worker.process import WorkerLoop
from omnidraft.core.worker.protocol import (
    LearningProgress,
    LearnNow,
    Shutdown,
    UpdateSettings,
    WorkerReady,
)

from tests.test_worker import TIMEOUT, Events, LearningEngine


class Sensor:
    """A battery sensor whose reading the test sets (True: on battery)."""

    def __init__(self, reading: bool | None):
        self.reading = reading

    def __call__(self) -> bool | None:
        return self.reading


@pytest.fixture
def run_loop(home, monkeypatch):
    monkeypatch.setattr(process, "BATTERY_CHECK_S", 0.0)  # read the sensor at each look
    loops = []

    def start(engine, settings: Settings, sensor) -> tuple[queue.Queue, Events]:
        requests, out = queue.Queue(), queue.Queue()
        loop = WorkerLoop(requests, out, engine, settings, power=sensor)
        thread = threading.Thread(target=loop.run, daemon=True)
        thread.start()
        loops.append((requests, thread))
        events = Events(out)
        events.until(lambda e: isinstance(e, WorkerReady))
        return requests, events

    yield start
    for requests, thread in loops:
        requests.put(Shutdown(0))
        thread.join(TIMEOUT)


def _states(seen: list) -> list[str]:
    return [e.state for e in seen if isinstance(e, LearningProgress)]


def test_on_battery_idle_learning_waits_for_mains_and_says_so(run_loop):
    engine, sensor = LearningEngine(), Sensor(True)
    _, events = run_loop(engine, Settings(idle_delay_s=0.05), sensor)
    events.until(lambda e: isinstance(e, LearningProgress) and e.state == power.BATTERY_STATUS)
    time.sleep(0.3)  # absence of steps cannot be awaited
    assert engine.steps == 0
    sensor.reading = False  # plugged in
    seen = events.until(lambda e: isinstance(e, LearningProgress) and e.state == "running")
    assert "idle" in _states(seen) and engine.steps >= 1


def test_learning_on_battery_when_the_user_allows_it_or_asks(run_loop):
    engine = LearningEngine()
    requests, events = run_loop(engine, Settings(idle_delay_s=60, learning_on_battery=True), Sensor(True))
    requests.put(LearnNow(1))
    seen = events.until(lambda e: isinstance(e, LearningProgress) and e.state == "running")
    assert power.BATTERY_STATUS not in _states(seen)
    requests.put(UpdateSettings(2, {"learning_on_battery": False}))  # the default: wait for mains
    events.until(lambda e: isinstance(e, LearningProgress) and e.state == power.BATTERY_STATUS)


def test_learn_now_runs_on_battery(run_loop):
    engine = LearningEngine()
    requests, events = run_loop(engine, Settings(idle_delay_s=60), Sensor(True))
    events.until(lambda e: isinstance(e, LearningProgress) and e.state == power.BATTERY_STATUS)
    requests.put(LearnNow(1))  # the user's explicit ask
    events.until(lambda e: isinstance(e, LearningProgress) and e.state == "running")


def test_without_a_battery_sensor_nothing_changes(run_loop):
    engine = LearningEngine()
    _, events = run_loop(engine, Settings(idle_delay_s=0.05), Sensor(None))
    seen = events.until(lambda e: isinstance(e, LearningProgress) and e.steps >= 2)
    assert power.BATTERY_STATUS not in _states(seen)


def test_the_default_sensor_reads_psutil(monkeypatch):
    import psutil

    battery = type("Battery", (), {})
    for plugged, want in ((False, True), (True, False), (None, None)):
        reading = battery()
        reading.power_plugged = plugged
        monkeypatch.setattr(psutil, "sensors_battery", lambda r=reading: r, raising=False)
        assert power.on_battery() is want
    monkeypatch.setattr(psutil, "sensors_battery", lambda: None, raising=False)  # a desktop
    assert power.on_battery() is None


def test_the_status_bar_says_learning_waits_on_battery():
    from omnidraft.app.learning_control import describe_learning

    event = LearningProgress("tiny", power.BATTERY_STATUS)
    assert describe_learning(event.state, event) == "Learning: paused on battery"
