"""What loading a target into the engine costs: seconds, the process's resident
memory afterwards, and the share of the target's and the drafter's packed weights
on 2 MB pages. --where-made keeps the weights where they were made (huge_pages'
gather off), as before the twenty-sixth session, to compare; run each way in its
own process (a fresh OMNIDRAFT_HOME each time; the converted model cache is shared).

    .venv/bin/python scripts/engine_load.py
    .venv/bin/python scripts/engine_load.py --where-made
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from huge_pages_ab import huge_share
from omnidraft.bench.cli import bench_home
from omnidraft.core.engine import Engine
from omnidraft.core.models import huge_pages


def resident_mb() -> float:
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmRSS"))
    return int(line.split()[1]) / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--where-made", action="store_true", help="leave the weights where they were made")
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.where_made:
        huge_pages.gather = lambda layers: None
    with bench_home(Path(tempfile.mkdtemp())):
        start = time.perf_counter()
        engine = Engine()
        engine.load_target(args.target)
        seconds = time.perf_counter() - start
        runner = getattr(engine.target, "runner", None)
        shares = {"drafter": huge_share(engine.drafter.net)}
        if runner is not None and runner.net is not None:
            shares["target"] = huge_share(runner.net)
        print(f"{args.target}{' (weights where made)' if args.where_made else ''}: loaded in {seconds:.1f} s, "
              f"{resident_mb():.0f} MB resident; on 2 MB pages: "
              + ", ".join(f"{name} {share:.0%}" for name, share in shares.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
