"""Choose the learner's settings offline: how fast does the drafter learn a target?

Serves the training prompts once with plain target decoding (greedy, the same
replies the app would record), then for each learning rate trains a fresh LoRA
adapter over them in the learner's batches, pass after pass, and after every
pass measures on the held-out dev prompts what the learner reports itself:
greedy_match (the share of directly mapped reply positions where the drafter's
top token is the target's top token, i.e. greedy acceptance of one drafted
token, teacher-forced) and the hybrid loss. No timing is involved, so a loaded
machine does not change the figures. The served replies are cached in --cache.

    .venv/bin/python -m omnidraft.tools.learning_sweep --lrs 1e-4,3e-4,1e-3 --passes 2

--train and --dev default to eval/train.jsonl (144 prompts) and eval/dev.jsonl
(40), the checkout's, else the current directory's.

--online trains as the app does instead of in epochs: the turns arrive --arrive
at a time (default: a batch) and after each arrival the learner trains until it
rests, by its own schedule: its round over the new turns replays --reviews
times as many learned ones (core/learning/learner.py); one evaluation at the end.

--variants N adds N replies per training prompt sampled at --variant-temperature
(each after the prompt's greedy reply): does more of the target's text on the
same prompts teach more than repeats? (docs/learning.md: it does not.)

--oracle trains on the dev replies themselves: a drafter that has seen the
answers, the ceiling for any learning (docs/learning.md); --state-dir keeps
its adapter for `omnidraft-bench --state-dir`. --replies takes the dev replies
from an omnidraft-bench report (its `target` outputs: the same greedy replies)
instead of decoding them again.

--learned: no training; the dev match of the adapter a --state-dir holds for the
target (what an adapt run or the app left there).

--chat: each prompt is a user message through both models' chat templates, as
the app sends it and `omnidraft-bench --chat` decodes it (then --replies needs a
--chat report).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from omnidraft.bench.cli import bench_home, read_prompts
from omnidraft.bench.runners import as_chat, prompt_ids
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine, LearnSettings
from omnidraft.core.events import TurnFinished, TurnStats
from omnidraft.core.learning.learner import Learner
from omnidraft.core.learning.replay_buffer import ReplayBuffer, Sample
from omnidraft.core.models.chat_format import encode_chat

from .common import (
    check_file,
    eval_file,
    existing_file,
    float_list,
    non_negative_int,
    output_file,
    positive_float,
    positive_int,
    repo_root,
    tool_parser,
)


def prompt_pair(engine: Engine, prompt: str, chat: bool) -> tuple[list[int], list[int]]:
    """The prompt's ids in the target's and the drafter's vocabularies, as the engine reads them."""
    if chat:  # Engine.chat's reading
        encoded = engine.encode(as_chat(prompt))
        return encoded.ids, encode_chat(engine.drafter_model.tokenizer, encoded.messages, "template")
    return prompt_ids(engine.target.tokenizer, prompt), prompt_ids(engine.drafter_model.tokenizer, prompt)


def serve(
    engine: Engine, prompts: list[dict], max_new: int, cache: Path | None, replies: list[list[int]] | None = None,
    temperature: float = 0.0, seed: int = 0, chat: bool = False,
) -> list[Sample]:
    """Target replies as replay samples, as the engine records them: greedy, or
    sampled at `temperature` (prompt n seeded with seed + n); with `chat` each
    prompt a user message. cache: where served replies are kept (None: given ones,
    not kept)."""
    if cache is not None and cache.exists():
        return [Sample(**raw) for raw in json.loads(cache.read_text())]
    samples = []
    for n, row in enumerate(prompts):
        done = None
        if replies is not None:  # decoded already (an omnidraft-bench report)
            done = TurnFinished("", "length", TurnStats(method="target"), list(replies[n]))
        else:
            cfg = GenerationConfig(max_new_tokens=max_new, temperature=temperature, seed=seed + n)
            events = (engine.chat(as_chat(row["prompt"]), cfg, speculative=False) if chat
                      else engine.complete(row["prompt"], cfg))
            for event in events:
                if isinstance(event, TurnFinished):
                    done = event
        ids, prefix = prompt_pair(engine, row["prompt"], chat)
        samples.append(replace(engine.sample_of(ids, prefix, done), seq=n))
        print(f"served {n + 1}/{len(prompts)}", file=sys.stderr, flush=True)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps([s.__dict__ for s in samples]))
    return samples


def evaluate(learner: Learner, samples: list[Sample]) -> dict:
    model = learner.adapters.activate(learner.target_id)
    match = loss = 0.0
    n = 0
    with torch.no_grad():
        for s in samples:
            value, stats = learner.sample_loss(model, s)
            if stats["greedy_match"] is None:
                continue
            match, loss, n = match + stats["greedy_match"], loss + float(value), n + 1
    return {"greedy_match": match / n, "loss": loss / n}


def _parser() -> argparse.ArgumentParser:
    ap = tool_parser(__file__, __doc__)
    ap.add_argument("--target", default="gemma-3-270m", help="catalog id or model path")
    ap.add_argument("--train", type=Path, default=eval_file("train.jsonl"), help="the training prompts (JSONL)")
    ap.add_argument("--dev", type=Path, default=eval_file("dev.jsonl"), help="the held-out dev prompts (JSONL)")
    ap.add_argument("--max-new-tokens", type=positive_int, default=64)
    ap.add_argument("--chat", action="store_true", help="prompts as user messages through the chat templates")
    ap.add_argument("--learned", action="store_true", help="only the dev match of the --state-dir's own adapter")
    ap.add_argument("--lrs", type=float_list, default=(1e-4, 3e-4, 1e-3),
                    help="learning rates, comma-separated (default 1e-4,3e-4,1e-3)")
    ap.add_argument("--passes", type=positive_int, default=2, help="epochs (without --online)")
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--batch-size", type=positive_int, default=8,
                    help="samples per optimizer step (the app's LearnSettings.batch_size is 8)")
    ap.add_argument("--online", action="store_true",
                    help="turns arrive a few at a time, each learned at once (the app's schedule)")
    ap.add_argument("--arrive", type=positive_int,
                    help="with --online: turns arriving between the learner's rests (default: --batch-size; "
                         "the app learns after each turn its user leaves time for: 1)")
    ap.add_argument("--reviews", type=non_negative_int, default=LearnSettings.reviews,
                    help="with --online: learned turns replayed per new turn (the learner's setting)")
    ap.add_argument("--lora-targets",
                    help="comma-separated module names the adapter adapts (default: AdapterStore's)")
    ap.add_argument("--cache", type=Path, default=repo_root() / ".test-cache/learning-sweep",
                    help="where served replies are kept between runs")
    ap.add_argument("--json", type=output_file, help="write the report here too")
    ap.add_argument("--state-dir", type=Path,
                    help="keep the last learning rate's adapter here (omnidraft-bench --state-dir runs with it)")
    ap.add_argument("--oracle", action="store_true",
                    help="train on the dev replies themselves: a ceiling on what learning can reach")
    ap.add_argument("--replies", type=existing_file,
                    help="an omnidraft-bench --json report on the dev prompts: its target replies "
                         "(the same --chat mode and --max-new-tokens)")
    ap.add_argument("--variants", type=non_negative_int, default=0,
                    help="also train on this many sampled replies per training prompt (each after its greedy one)")
    ap.add_argument("--variant-temperature", type=positive_float, default=0.7)
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.learned and not args.state_dir:
        ap.error("--learned needs a --state-dir that holds an adapter for the target")
    if args.arrive is not None and not args.online:
        ap.error("--arrive only with --online")
    check_file(ap, "--dev", args.dev)
    if not (args.learned or args.oracle):
        check_file(ap, "--train", args.train)
    args.reply_ids = None  # --replies' target replies, token ids per dev prompt
    if args.replies:
        try:
            report = json.loads(args.replies.read_text())
            args.reply_ids = report["outputs"]["target"]
        except (ValueError, KeyError, TypeError):
            ap.error(f"--replies: {args.replies} is not an omnidraft-bench report with target outputs")
        if bool(report.get("chat")) != args.chat or report.get("max_new_tokens") != args.max_new_tokens:
            ap.error("--replies needs a report of the same mode (--chat or not) and --max-new-tokens")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    with bench_home(args.state_dir):  # adapters and buffers of the sweep only; the model cache shared
        home = os.environ["OMNIDRAFT_HOME"]
        engine = Engine()
        engine.load_target(args.target, measure_baseline=False)
        # Before the dev prompts are served (minutes), not after.
        if args.learned and not engine.adapters.has_saved(args.target):
            _parser().error(f"--learned needs a --state-dir that holds an adapter for {args.target}")
        tag = f"{args.target}-{args.max_new_tokens}{'-chat' * args.chat}"
        replies = args.reply_ids
        dev = serve(engine, read_prompts(args.dev, None), args.max_new_tokens,
                    None if replies else args.cache / f"dev-{tag}.json", replies, chat=args.chat)
        if args.learned:  # nothing to train: the training prompts are not served
            learner = Learner(engine.drafter_model.model, engine.target.model, engine.bridge, ReplayBuffer(
                Path(home) / "learned-dev.bin", max_samples=1), engine.adapters, args.target, threads=args.threads)
            emit({"target": args.target, "chat": args.chat, "learned": str(args.state_dir),
                  **evaluate(learner, dev)}, args.json)
            return 0
        if args.oracle:  # the evaluation's own replies: no learning from other traffic does better
            train = dev
        else:
            train_prompts = read_prompts(args.train, None)
            train = serve(engine, train_prompts, args.max_new_tokens, args.cache / f"train-{tag}.json",
                          chat=args.chat)
            if args.variants:  # other replies the target might give: more of its text, same prompts
                t = args.variant_temperature
                sets = [serve(engine, train_prompts, args.max_new_tokens,
                              args.cache / f"train-{tag}-t{t:g}-seed{v}.json", temperature=t, seed=1000 * (v + 1),
                              chat=args.chat)
                        for v in range(args.variants)]
                train = [s for group in zip(train, *sets) for s in group]
        if args.lora_targets:  # before the first adapter creates the peft model
            engine.adapters.targets = tuple(args.lora_targets.split(","))
        results = []
        for lr in args.lrs:
            engine.adapters.reset(args.target)
            buffer = ReplayBuffer(Path(home) / f"sweep-{lr}.bin", max_samples=len(train))
            learner = Learner(engine.drafter_model.model, engine.target.model, engine.bridge, buffer,
                              engine.adapters, args.target, lr=lr, threads=args.threads,
                              batch_size=args.batch_size, reviews=args.reviews if args.online else 0)
            row = {"lr": lr, "passes": [evaluate(learner, dev)]}
            print(f"lr {lr:g} pass 0: {row['passes'][-1]}", file=sys.stderr, flush=True)
            if args.online:
                t0 = time.perf_counter()
                learn_online(learner, buffer, train, args.arrive or args.batch_size)
                row["passes"].append({**evaluate(learner, dev), "steps": learner.steps,
                                      "seconds": time.perf_counter() - t0})
                print(f"lr {lr:g} online: {row['passes'][-1]}", file=sys.stderr, flush=True)
                results.append(row)
                continue
            for p in range(args.passes):
                for s in train:
                    buffer.add(Sample(**{**s.__dict__, "seq": -1}))
                t0 = time.perf_counter()
                while (out := learner.step()) is not None and not out["pass_done"]:
                    pass
                row["passes"].append({**evaluate(learner, dev), "steps": learner.steps,
                                      "seconds": time.perf_counter() - t0})
                print(f"lr {lr:g} pass {p + 1}: {row['passes'][-1]}", file=sys.stderr, flush=True)
            results.append(row)
        emit({"target": args.target, "chat": args.chat, "oracle": args.oracle, "lora_targets": list(engine.adapters.targets),
              "batch_size": args.batch_size,
              "schedule": {"online": args.online, "reviews": args.reviews if args.online else 0,
                           "arrive": (args.arrive or args.batch_size) if args.online else None},
              "variants": args.variants, "variant_temperature": args.variant_temperature if args.variants else None,
              "train": len(train), "dev": len(dev), "results": results}, args.json)
    return 0


def learn_online(learner: Learner, buffer: ReplayBuffer, train: list[Sample], arrive: int) -> None:
    """The turns arrive `arrive` at a time; after each arrival the learner trains
    until it rests (as omnidraft-bench --adapt does between prompts)."""
    for start in range(0, len(train), arrive):
        for s in train[start:start + arrive]:
            buffer.add(Sample(**{**s.__dict__, "seq": -1}))
        while (out := learner.step()) is not None and out["buffered"]:
            pass


def emit(report: dict, path: Path | None) -> None:
    """Print the report, and write it to path if given."""
    print(json.dumps(report, indent=2))
    if path:
        path.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
