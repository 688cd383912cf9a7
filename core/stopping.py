"""The one "should I stop?" callable that long work checks between its steps.

A decode loop checks it between decoding steps (the user cancelled, or the worker
is shutting down), learning between layers (a request is waiting), a download
between reads. Each caller passes one; `never` is the default.
"""

from __future__ import annotations

from collections.abc import Callable

ShouldStop = Callable[[], bool]


def never() -> bool:
    return False
