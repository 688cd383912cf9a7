"""Speed and acceptance of a learned adapter streamed at a smaller rank.

The drafter streams its adapter's fp16 factors beside its 4-bit weights on
every forward (docs/learning.md). This runs the benchmark on a state folder an
adapt run (or the app) left, with the drafter's adapter cut to at most --rank
(its SVD, compact_low_rank) or left out (--rank 0), so the acceptance a rank
keeps can be weighed against what its bytes cost. The state folder is copied
first: the benchmark never changes it.

    PYTHONPATH=. .venv/bin/python scripts/adapter_rank_eval.py --rank 8 --from STATE_DIR -- \\
        --target qwen2.5-coder-1.5b-instruct --prompts eval/dev.jsonl \\
        --max-new-tokens 64 --methods target,omnidraft --json out.json
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from functools import partialmethod
from pathlib import Path

from omnidraft.bench import cli
from omnidraft.core.learning import adapters


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True, help="at most this rank; 0: no adapter")
    p.add_argument("--from", dest="source", type=Path, required=True, help="state folder (OMNIDRAFT_HOME)")
    p.add_argument("bench", nargs=argparse.REMAINDER, help="-- then omnidraft-bench's arguments")
    args = p.parse_args()
    rest = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
    if args.rank == 0:
        adapters.AdapterStore.low_rank_state = lambda *a, **k: None
    else:  # the best rank-r approximation of each projection's change
        adapters.AdapterStore.low_rank_state = partialmethod(
            adapters.AdapterStore.low_rank_state, keep=1.0, max_rank=args.rank)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        shutil.copytree(args.source, home, symlinks=True)
        return cli.main([*rest, "--state-dir", str(home)])


if __name__ == "__main__":
    sys.exit(main())
