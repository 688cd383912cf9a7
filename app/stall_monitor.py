"""Measures how long the GUI event loop is blocked.

A QTimer asks to fire every 10 ms; when the loop is busy elsewhere (a long
slot, a blocking call, a heavy repaint) the tick arrives late, and the
lateness is exactly how long the user saw a frozen window. The worst stall is
kept overall and per named phase ("model loading", "streaming") so the README
can quote a measured figure instead of a claim.
"""

from __future__ import annotations

import logging
import time

from PySide6.QtCore import QObject, Qt, QTimer

log = logging.getLogger(__name__)

TICK_MS = 10
# Stalls below this are ordinary timer jitter, not something a person notices.
LOG_THRESHOLD_MS = 100.0


class StallMonitor(QObject):
    def __init__(self, parent: QObject | None = None, tick_ms: int = TICK_MS):
        super().__init__(parent)
        self.tick_ms = tick_ms
        self.max_stall_ms = 0.0
        self.ticks = 0
        self.phase_max_ms: dict[str, float] = {}
        self._phases: set[str] = set()
        self._last = 0.0
        self._timer = QTimer(self)
        # PreciseTimer: the default coarse timer may itself be 5% late, which would
        # show up as a false stall.
        self._timer.setTimerType(Qt.TimerType.PreciseTimer)
        self._timer.setInterval(tick_ms)
        self._timer.timeout.connect(self._tick)

    def start(self) -> None:
        self._last = time.perf_counter()
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

    def reset(self) -> None:
        self.max_stall_ms = 0.0
        self.phase_max_ms.clear()
        self.ticks = 0

    def enter(self, phase: str) -> None:
        """Attribute stalls from now on to `phase` as well (until leave)."""
        self._phases.add(phase)
        self.phase_max_ms.setdefault(phase, 0.0)

    def leave(self, phase: str) -> None:
        self._phases.discard(phase)

    def _tick(self) -> None:
        if not self._timer.isActive():  # a tick queued before stop(): not a measurement
            return
        now = time.perf_counter()
        late_ms = max(0.0, (now - self._last) * 1000.0 - self.tick_ms)
        self._last = now
        self.ticks += 1
        self.max_stall_ms = max(self.max_stall_ms, late_ms)
        for phase in self._phases:
            self.phase_max_ms[phase] = max(self.phase_max_ms[phase], late_ms)
        if late_ms >= LOG_THRESHOLD_MS:
            log.info("event loop stalled %.0f ms (phases: %s)", late_ms, sorted(self._phases))

    def summary(self) -> str:
        parts = [f"worst {self.max_stall_ms:.0f} ms"]
        parts += [f"{k} {v:.0f} ms" for k, v in sorted(self.phase_max_ms.items())]
        return "event-loop stall: " + ", ".join(parts)
