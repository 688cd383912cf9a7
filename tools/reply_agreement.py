"""How alike two bench reports' replies are, method by method: how many of the
prompts' token ids are the same, how many part at the first token, and where the
others part on average (the reply's length where they never do). A change of
rounding (another kernel build, attention in bf16) moves greedy replies at
near-ties; this puts a number on how far, beside what a build's summation order
alone moves them. Nothing is loaded or timed: it reads the two reports.

    OMNIDRAFT_KERNEL_ISA=avx512vnni .venv/bin/omnidraft-bench ... --methods target --json a.json
    .venv/bin/omnidraft-bench ... --methods target --json b.json
    .venv/bin/python -m omnidraft.tools.reply_agreement a.json b.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from omnidraft.bench.report import first_difference

from .common import existing_file, tool_parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = tool_parser(__file__, __doc__)
    parser.add_argument("reports", type=existing_file, nargs=2, help="two omnidraft-bench --json reports")
    return parser.parse_args(argv)


def agreement(a: dict, b: dict) -> dict[str, dict]:
    """Per method both reports ran: prompts, replies the same, replies parting at
    the first token, and the mean token where they part."""
    out = {}
    for method in sorted(set(a["outputs"]) & set(b["outputs"])):
        pairs = list(zip(a["outputs"][method], b["outputs"][method], strict=True))
        parts = [first_difference(x, y) for x, y in pairs]
        where = [len(x) if at is None else at for at, (x, _) in zip(parts, pairs)]
        out[method] = {"prompts": len(pairs), "same": sum(at is None for at in parts),
                       "part_at_first": sum(at == 0 for at in parts), "mean_part": statistics.mean(where)}
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    a, b = (json.loads(path.read_text()) for path in args.reports)
    for method, row in agreement(a, b).items():
        print(f"{method}: {row['same']}/{row['prompts']} the same, "
              f"{row['part_at_first']} part at the first token, "
              f"on average at token {row['mean_part']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
