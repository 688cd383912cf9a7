"""Helpers the fault tests start in other processes (they must be importable by
name there: multiprocessing's "spawn" pickles a process's target by reference)."""

from __future__ import annotations

import time


def slow_load_worker_main(*args, **kwargs) -> None:
    """The real engine worker, whose model loads take ten minutes (a first start
    converting a large model, compressed): every target load reports one stage
    and then works on without looking at anything else."""
    from omnidraft.core import engine
    from omnidraft.core.worker import process

    def slow_load(entry, dtype=None, progress=None, **_kwargs):
        if progress is not None:
            progress(f"Loading {entry.name} slowly", 0.5)
        time.sleep(600)
        raise AssertionError("the slow load was not interrupted")

    engine.load = slow_load
    process.worker_main(*args, **kwargs)
