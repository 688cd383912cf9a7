"""Helpers the fault tests start in other processes (they must be importable by
name there: multiprocessing's "spawn" pickles a process's target by reference)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def kill_gui_of_busy_worker(script: str, home: Path, tmp_path: Path, smol_tok):
    """Run `script` as a stand-in GUI (argv: home, a tiny model's folder) that prints
    its engine worker's pid once the worker is busy; kill it there and return the
    worker (a psutil.Process)."""
    import psutil

    from tests.tiny import tiny_smol_target

    model = tmp_path / "tiny-smol"
    tiny_smol_target(model, smol_tok)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    gui = subprocess.Popen([sys.executable, "-c", script, str(home), str(model)], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, text=True)
    try:
        return psutil.Process(int(gui.stdout.readline()))
    finally:
        gui.kill()
        gui.wait(30)


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
