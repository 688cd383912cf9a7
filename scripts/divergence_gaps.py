"""How close a call each greedy divergence of a bench report was, as this engine's
plain decoding saw it.

The bench report's own `top2_gap` is one fresh transformers forward of the
target model, whose activations differ from the runtime the engine decodes with
(core/models/target_runtime.py: float32 activations around the int8 layers). This
replays the engine's plain decoding (prompt, then one token per forward, the same
session) up to each method's first difference from the target's output and
reports the target's top-2 logit margin there.

    .venv/bin/python scripts/divergence_gaps.py docs/results/bench-qwen15-lean-raw.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from omnidraft.bench.report import first_difference, margin
from omnidraft.bench.runners import prompt_ids
from omnidraft.core.models.catalog import ModelCatalog
from omnidraft.core.models.loader import load


def plain_gap(runner, ids: list[int], reply: list[int], position: int) -> float:
    """The margin plain decoding saw when it picked reply[position]."""
    session = runner.session()
    logits = session.forward(ids, last=1)[-1]
    for token in reply[:position]:
        logits = session.forward([token])[-1]
    return margin(logits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--prompts", type=Path, help="the report's prompts file (default: from its command)")
    args = parser.parse_args()
    report = json.loads(args.report.read_text())
    words = report["command"].split()
    prompts = args.prompts or Path(words[words.index("--prompts") + 1])
    rows = [json.loads(line) for line in prompts.read_text().splitlines() if line.strip()][: report["prompts"]]
    target = load(ModelCatalog().get(report["target_id"]), torch.bfloat16, int8=report["target_int8"])
    plain = report["outputs"]["target"]
    for method, outputs in report["outputs"].items():
        if method == "target":
            continue
        gaps = []
        for i, (mine, ref) in enumerate(zip(outputs, plain)):
            pos = first_difference(mine, ref)
            if pos is None:
                continue
            ids = prompt_ids(target.tokenizer, rows[i]["prompt"], report["chat"])
            gaps.append(round(plain_gap(target.runner, ids, ref, pos), 4))
        summary = f"{len(gaps)} of {len(plain)} differ"
        if gaps:
            summary += f"; plain decoding's top-2 margin there: max {max(gaps)}, median {sorted(gaps)[len(gaps) // 2]}"
        print(f"{method}: {summary}\n  {gaps}")


if __name__ == "__main__":
    main()
