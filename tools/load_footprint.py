"""A target's load from a fresh home: load time, peak RSS during the load, RSS after a first reply.

Runs the load in a new process (as the app's engine worker does) whose
OMNIDRAFT_HOME is an empty temporary folder, except for the model files already
assembled (cache/gguf) and the kernels already built (cache/kernels), linked in
from this user's cache: the parts are assembled once, outside the timing. The
process loads the target and the drafter as the engine does (Engine.load_target,
without the plain-speed measurement), then writes one greedy reply. Reported:
the GGUF file's size; the target's load seconds (loader.load) and the engine's
(target, drafter, learned state); the process's peak RSS up to the end of the
load (getrusage's maxrss); its RSS after the first reply; and that RSS against
the budget of the file's size + 1 GiB. RSS counts file-backed pages too (the
GGUF's mapped pages while they are read, the libraries' code), which the system
can drop and re-read: each figure is also split into anonymous memory and
file-backed pages (psutil's `shared`), the peaks sampled every 10 ms.

    .venv/bin/python -m omnidraft.tools.load_footprint
    .venv/bin/python -m omnidraft.tools.load_footprint --target gemma-3-270m --json footprint.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Self

from .common import output_file, positive_int, tool_parser, write_json

BUDGET_OVER_FILE = 1 << 30  # RSS after a first reply: at most the file's size + 1 GiB
_CHILD_FLAG = "--in-fresh-home"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = tool_parser(__file__, __doc__)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct", help="catalog id or model path")
    parser.add_argument("--drafter", default="smollm2-135m-instruct", help="the drafter's catalog id")
    parser.add_argument("--max-new-tokens", type=positive_int, default=16, help="of the first reply")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--json", type=output_file, help="write the report here")
    parser.add_argument(_CHILD_FLAG, dest="child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _link_assembled(home: Path) -> list[str]:
    """Link this user's assembled model files and built kernels into the fresh home."""
    from omnidraft.core.storage import paths

    linked = []
    for name in ("gguf", "kernels"):
        source = paths.cache_dir() / name
        if source.is_dir():
            (home / "cache").mkdir(parents=True, exist_ok=True)
            (home / "cache" / name).symlink_to(source, target_is_directory=True)
            linked.append(name)
    return linked


class _Sampler:
    """The highest anonymous and file-backed RSS while it runs, sampled on a thread."""

    def __init__(self, process, every_s: float = 0.01):
        import threading

        self.process, self.every_s = process, every_s
        self.peak_anon = self.peak_file = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _sample(self) -> None:
        anon, file = split_rss(self.process)
        self.peak_anon, self.peak_file = max(self.peak_anon, anon), max(self.peak_file, file)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()


def split_rss(process) -> tuple[int, int]:
    """(anonymous, file-backed) resident bytes: psutil's rss less its `shared`, and `shared`."""
    info = process.memory_info()
    shared = getattr(info, "shared", 0)  # Linux: RssFile + RssShmem
    return info.rss - shared, shared


def _measure(args: argparse.Namespace) -> dict:
    """In the fresh home's process: load, reply, and the figures."""
    import resource
    import time

    import psutil
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from omnidraft.core.decoding.sampling import GenerationConfig
    from omnidraft.core.engine import Engine
    from omnidraft.core.events import TurnFinished
    from omnidraft.core.models.loader import source_path

    process = psutil.Process()
    before = process.memory_info().rss
    engine = Engine(drafter_id=args.drafter)
    entry = engine.catalog.get(args.target)
    gguf = source_path(entry)  # already assembled: linked in
    start = time.perf_counter()
    with _Sampler(process) as sampled:
        engine.load_target(args.target, measure_baseline=False)
    engine_seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    after_load = process.memory_info().rss
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens)
    messages = [{"role": "user", "content": "Write a Python function that reverses a string."}]
    done = next(e for e in engine.chat(messages, cfg) if isinstance(e, TurnFinished))
    after_reply = process.memory_info().rss
    anon_after, file_after = split_rss(process)
    size = gguf.stat().st_size
    return {
        "target": args.target, "drafter": args.drafter, "file_bytes": size,
        "target_load_s": round(engine.target.load_seconds, 2), "engine_load_s": round(engine_seconds, 2),
        "rss_before_load": before, "peak_rss_during_load": peak_kib * 1024, "rss_after_load": after_load,
        "rss_after_first_reply": after_reply, "budget_bytes": size + BUDGET_OVER_FILE,
        "peak_anon_during_load": sampled.peak_anon, "peak_file_backed_during_load": sampled.peak_file,
        "anon_after_first_reply": anon_after, "file_backed_after_first_reply": file_after,
        "within_budget": after_reply <= size + BUDGET_OVER_FILE,
        "reply_tokens": done.stats.new_tokens, "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(), "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(_measure(args)))
        return 0
    with tempfile.TemporaryDirectory(prefix="omnidraft-footprint-") as home:
        linked = _link_assembled(Path(home))
        env = {**os.environ, "OMNIDRAFT_HOME": home, "PYTHONUNBUFFERED": "1"}
        child = [sys.executable, "-m", "omnidraft.tools.load_footprint", _CHILD_FLAG, "--target", args.target,
                 "--drafter", args.drafter, "--max-new-tokens", str(args.max_new_tokens)]
        if args.threads:
            child += ["--threads", str(args.threads)]
        run = subprocess.run(child, check=False, env=env, stdout=subprocess.PIPE, text=True)
        if run.returncode:
            print(f"the measurement failed (exit status {run.returncode})", file=sys.stderr)
            return 1
        report = json.loads(run.stdout.strip().splitlines()[-1])
    report["linked_from_cache"] = linked
    print(f"{report['target']} ({_gib(report['file_bytes'])} file), drafter {report['drafter']}, "
          f"{report['threads']} threads on {report['cpus']} CPUs (load average {report['load_average']})")
    print(f"  load: target {report['target_load_s']} s, engine {report['engine_load_s']} s")
    print(f"  peak RSS during the load: {_gib(report['peak_rss_during_load'])} (sampled peaks: "
          f"anonymous {_gib(report['peak_anon_during_load'])}, "
          f"file-backed {_gib(report['peak_file_backed_during_load'])})")
    print(f"  RSS after the first reply: {_gib(report['rss_after_first_reply'])} "
          f"(budget {_gib(report['budget_bytes'])}: {'within' if report['within_budget'] else 'OVER'}; "
          f"anonymous {_gib(report['anon_after_first_reply'])}, "
          f"file-backed {_gib(report['file_backed_after_first_reply'])})")
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
