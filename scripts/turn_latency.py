"""Seconds to a conversation's first reply token, turn by turn, with the caches
kept between turns (the app's way) and with every prompt read afresh.

A chat app sends the whole conversation each turn. Kept caches mean a turn reads
only what is new since the last reply: the user's new message and the reply's
closing markup. Each conversation here is --turns dev prompts as user
messages, each answered with --max-new-tokens tokens through Engine.chat (the
app's path, omnidraft drafting). The conversation is run twice, kept and
afresh, the order swapped from one conversation to the next, so a busy machine
slows both alike. Both runs decode the same replies (checked), so their
prompts are the same.

    .venv/bin/python scripts/turn_latency.py --json docs/results/turn-latency.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine
from omnidraft.core.events import TokenChunk, TurnFinished
from omnidraft.core.models.catalog import ModelCatalog


def conversation(engine: Engine, prompts: list[str], cfg: GenerationConfig, kept: bool) -> list[dict]:
    engine.forget_context()
    messages: list[dict] = []
    turns = []
    for prompt in prompts:
        messages.append({"role": "user", "content": prompt})
        if not kept:
            engine.forget_context()
        tokens = len(engine.encode(messages).ids)
        start = time.perf_counter()
        first = None
        for event in engine.chat(messages, cfg):
            if isinstance(event, TokenChunk) and first is None:
                first = time.perf_counter() - start
            if isinstance(event, TurnFinished):
                done = event
        turns.append({"prompt_tokens": tokens, "first_token_s": round(first, 3),
                      "reply_s": round(time.perf_counter() - start, 3), "reply": done.text})
        messages.append({"role": "assistant", "content": done.text})
    return turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--prompts", type=Path, default=Path("eval/dev.jsonl"))
    parser.add_argument("--conversations", type=int, default=2)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [json.loads(line)["prompt"] for line in args.prompts.read_text().splitlines() if line.strip()]
    engine = Engine(ModelCatalog())
    engine.load_target(args.target)
    engine.evaluating = True  # nothing learned between the two runs of a conversation
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens)
    conversation(engine, rows[:1], GenerationConfig(max_new_tokens=4), kept=False)  # warm-up
    report = {"target": args.target, "threads": torch.get_num_threads(), "max_new_tokens": args.max_new_tokens,
              "conversations": []}
    for c in range(args.conversations):
        prompts = rows[c * args.turns : (c + 1) * args.turns]
        runs = {}
        for kept in ((True, False) if c % 2 == 0 else (False, True)):
            runs["kept" if kept else "afresh"] = conversation(engine, prompts, cfg, kept)
        same = [a.pop("reply") == b.pop("reply") for a, b in zip(runs["kept"], runs["afresh"])]
        report["conversations"].append({**runs, "same_replies": same})
        for turn, (k, f) in enumerate(zip(runs["kept"], runs["afresh"])):
            print(f"conversation {c + 1} turn {turn + 1}: {k['prompt_tokens']} prompt tokens, first token "
                  f"{k['first_token_s']:.2f} s kept vs {f['first_token_s']:.2f} s afresh; reply "
                  f"{k['reply_s']:.2f} vs {f['reply_s']:.2f} s", flush=True)
    later = [(k, f) for conv in report["conversations"] for k, f in list(zip(conv["kept"], conv["afresh"]))[1:]]
    report["later_turns"] = {
        "median_first_token_s": {"kept": statistics.median(k["first_token_s"] for k, _ in later),
                                 "afresh": statistics.median(f["first_token_s"] for _, f in later)},
        "total_reply_s": {"kept": round(sum(k["reply_s"] for k, _ in later), 2),
                          "afresh": round(sum(f["reply_s"] for _, f in later), 2)},
    }
    print(json.dumps(report["later_turns"]))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
