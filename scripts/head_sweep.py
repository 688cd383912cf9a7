"""Choose the acceptance head's training settings offline, and judge a saved head.

The head (core/learning/acceptance_head.py) is a logistic regression on the
drafter's hidden state and confidence, trained in the idle learner batch by
batch. This script computes its training data once, teacher-forced as the
learner does (labels from core/learning/acceptance_head.segment_labels, the
drafter's training copy with the target's adapter as --state-dir left it), on
the training prompts' and the dev prompts' greedy replies, then trains fresh
heads over the training replies in the learner's schedule (batches of 8, each
batch once, as the learner trains the head on a turn's first pass only; --passes
repeats each batch, as it did before) for each
optimizer setting, and scores them on the dev replies, which no head saw:
mean predicted chance against the mean label (calibration), the log loss, ROC
AUC (how well it ranks accepted drafts above rejected ones), and how far the
predicted mean swings over the last batches (a head the stop rule can trust
should not move with the last batch it saw). The saved head, if the
state has one, is scored the same way. No timing: a loaded machine changes nothing.

    .venv/bin/python scripts/head_sweep.py --state-dir /tmp/adapt5-state \
        --replies docs/results/bench-qwen15-xeon-q4k-raw.json --lrs 1e-2,1e-3,3e-4

Replies are served once (plain greedy decoding) and cached, as in
scripts/learning_sweep.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from learning_sweep import ROOT, emit, serve
from omnidraft.bench.cli import bench_home, read_prompts
from omnidraft.core.engine import Engine
from omnidraft.core.learning.acceptance_head import (
    STEPS,
    AcceptanceHead,
    HeadExample,
    fit_head,
    head_example,
    segment_labels,
    segment_log_chances,
)


def examples(engine: Engine, samples) -> list[HeadExample]:
    """The head's training data of each reply, as the learner computes it."""
    learner = engine.learner()
    model = learner.adapters.activate(learner.target_id)
    out = []
    with torch.no_grad():
        for s in samples:
            fwd = learner.forward(model, s)
            if fwd is None:
                continue
            s, d_logits, t_logits, hidden, d_off, t_off = fwd
            rows_of, labels = segment_labels(s, learner.bridge, d_logits, t_logits, d_off, t_off)
            if labels:
                out.append(head_example(hidden, d_logits, s.temperature, rows_of, labels))
    return out


def score(head: AcceptanceHead, dev: list[HeadExample]) -> dict:
    """Over all dev segments: mean label, mean predicted chance, log loss, ROC AUC."""
    with torch.no_grad():
        p = torch.cat([segment_log_chances(head, e).exp() for e in dev]).clamp(1e-6, 1 - 1e-6)
        y = torch.cat([e.labels for e in dev])
        bce = float(F.binary_cross_entropy(p, y))
        # ROC AUC: how well the chance ranks accepted segments above rejected ones
        ranks = torch.empty(len(p)).index_copy_(0, p.argsort(), torch.arange(1, len(p) + 1, dtype=torch.float))
        pos = int(y.sum())
        auc = (float(ranks[y.bool()].sum()) - pos * (pos + 1) / 2) / (pos * (len(p) - pos))
    return {"label_mean": float(y.mean()), "predicted_mean": float(p.mean()), "log_loss": bce, "auc": auc}


def train(train_set: list[HeadExample], dev: list[HeadExample], lr: float, steps: int, passes: int,
          batch: int = 8) -> dict:
    head = AcceptanceHead(train_set[0].hidden.shape[-1])
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    scores = []
    for start in range(0, len(train_set), batch):
        for _ in range(passes):
            fit_head(head, optimizer, train_set[start:start + batch], steps)
        scores.append(score(head, dev))
    last = [s["predicted_mean"] for s in scores[-8:]]
    return {**scores[-1], "lr": lr, "steps": steps, "passes": passes,
            "predicted_mean_last_batches": [round(x, 3) for x in last],
            "swing_last_batches": max(last) - min(last), "stdev_last_batches": statistics.pstdev(last)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--state-dir", type=Path, required=True, help="the adapter (and head) to judge with")
    ap.add_argument("--train", type=Path, default=ROOT / "eval/train.jsonl")
    ap.add_argument("--dev", type=Path, default=ROOT / "eval/dev.jsonl")
    ap.add_argument("--replies", type=Path, help="an omnidraft-bench --json raw report: its target replies")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--lrs", default="1e-2,3e-3,1e-3,3e-4")
    ap.add_argument("--steps", default=str(STEPS), help="head updates per learner step, comma-separated")
    ap.add_argument("--passes", type=int, default=1, help="head fits per batch (the learner's: 1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=ROOT / ".test-cache/learning-sweep")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with bench_home(args.state_dir):
        engine = Engine()
        engine.load_target(args.target, measure_baseline=False)
        replies = json.loads(args.replies.read_text())["outputs"]["target"] if args.replies else None
        tag = f"{args.target}-{args.max_new_tokens}"
        dev_samples = serve(engine, read_prompts(args.dev, None), args.max_new_tokens,
                            args.cache / f"dev-{tag}.json", replies)
        train_samples = serve(engine, read_prompts(args.train, None), args.max_new_tokens,
                              args.cache / f"train-{tag}.json")
        saved = engine.learner().head
        dev, train_set = examples(engine, dev_samples), examples(engine, train_samples)
        report = {
            "target": args.target, "state_dir": str(args.state_dir),
            "train_turns": len(train_set), "dev_turns": len(dev),
            "train_label_mean": float(torch.cat([e.labels for e in train_set]).mean()),
            "confidence_alone": score(AcceptanceHead(dev[0].hidden.shape[-1]), dev),
            "saved_head": {**score(saved, dev), "labels_seen": saved.labels_seen} if saved.ready else None,
            "heads": [],
        }
        for steps in [int(x) for x in args.steps.split(",")]:
            for lr in [float(x) for x in args.lrs.split(",")]:
                report["heads"].append(train(train_set, dev, lr, steps, args.passes))
                print(json.dumps(report["heads"][-1]), file=sys.stderr, flush=True)
    emit(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
