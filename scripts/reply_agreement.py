"""How alike two bench reports' replies are, method by method: how many of the
prompts' token ids are the same, how many part at the first token, and where the
others part on average (the reply's length where they never do). A change of
rounding (another kernel build, attention in bf16) moves greedy replies at
near-ties; this puts a number on how far, beside what a build's summation order
alone moves them.

    OMNIDRAFT_KERNEL_ISA=avx512vnni .venv/bin/omnidraft-bench ... --methods target --json a.json
    .venv/bin/omnidraft-bench ... --methods target --json b.json
    .venv/bin/python scripts/reply_agreement.py a.json b.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from omnidraft.bench.report import first_difference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", type=Path, nargs=2)
    args = parser.parse_args()
    a, b = (json.loads(path.read_text()) for path in args.reports)
    for method in sorted(set(a["outputs"]) & set(b["outputs"])):
        pairs = list(zip(a["outputs"][method], b["outputs"][method], strict=True))
        parts = [first_difference(x, y) for x, y in pairs]
        where = [len(x) if at is None else at for at, (x, _) in zip(parts, pairs)]
        print(f"{method}: {sum(at is None for at in parts)}/{len(pairs)} the same, "
              f"{sum(at == 0 for at in parts)} part at the first token, "
              f"on average at token {statistics.mean(where):.1f}")


if __name__ == "__main__":
    main()
