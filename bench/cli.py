"""`omnidraft-bench`'s command line: this engine's decoding against its peers.

The methods (all on the same loaded target model, same prompt token ids) are in
bench/runners.py, the report and its table in bench/report.py. With --chat each
prompt is sent as one user message through the target's chat template
(Engine.chat: the app's own path, as a user meets it); without it the prompt is
a raw completion. --adapt measures, serves training prompts as the app would
(recording and learning between them), then measures again. --stream decodes
one person's stream of chats prequentially, the learner against a frozen twin
(bench/stream.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from omnidraft.bench.report import (
    build_report,
    format_adapt,
    format_table,
    load_average,
    machine_cores,
)
from omnidraft.bench.runners import (
    DTYPES,
    METHODS,
    BenchError,
    adapt_on,
    build_methods,
    close_methods,
    draft_variant_arg,
    run_interleaved,
)
from omnidraft.bench.stream import (
    format_stream,
    measure_stream,
    read_stream,
    segment_arg,
    turns_arg,
    write_chart,
)
from omnidraft.core.engine import Engine, InputError
from omnidraft.core.models.catalog import SMOLLM2_ID, ModelCatalog, ModelError
from omnidraft.core.storage import paths

# Without --methods: every method that needs nothing beyond `make setup`.
DEFAULT_METHODS = ("target", "hf", "uag", "omnidraft")

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="omnidraft-bench",
        description="Tokens/s of this engine's plain and speculative decoding against "
        "transformers generate(), Universal Assisted Generation and llama.cpp's server.",
    )
    p.add_argument("--target", required=True, help="catalog id or model path (GGUF or HF folder)")
    p.add_argument("--prompts", type=Path, help='JSONL file, lines {"prompt": ...} (or --stream)')
    p.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument(
        "--seed", type=int, default=0, help="sampling seed of prompt 0 (+i for prompt i)"
    )
    p.add_argument(
        "--methods", default=",".join(DEFAULT_METHODS),
        help="comma list of " + ",".join(METHODS) + f" (default: {','.join(DEFAULT_METHODS)}; "
        "the llamacpp ones need `make peers`)",
    )
    p.add_argument(
        "--draft", action="append", default=[], type=draft_variant_arg, metavar="KEY=VALUE[,KEY=VALUE...]",
        help="adds the method omnidraft[KEY=VALUE,...]: omnidraft with these settings (repeatable). Keys: "
        "k (drafting exactly k tokens a step, 1-16), max_k (at most, 1-16), priced (0: without priced stops), "
        "drawn (1: under sampling, drafts drawn from the drafter's distribution), "
        "read (the drafter reads at most N prompt tokens: the first and the last, 1-4096), "
        "head_bits (the drafter's LM head in 4 bits or int8: 4 or 8), "
        "head_tokens (its LM head over its first N token ids, 256-65536), "
        "layers (drafting with its first N layers, 1-99), q4k (1: its 4-bit weights on Q4_K's grid), "
        "untrained (1: without what was learned for the target)",
    )
    p.add_argument(
        "--drafter",
        default=None,
        help="drafter catalog id or Llama model path (default: the engine's; "
        f"OMNIDRAFT_DRAFTER or {SMOLLM2_ID})",
    )
    p.add_argument("--dtype", choices=sorted(DTYPES), default="int4",
                   help="int4: a GGUF's Q4_K layers in 4 bits, the rest int8 (the app's default); int8: all int8")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="OMNIDRAFT_HOME for the run, where the engine keeps learned state "
        "(default: a fresh temporary one, deleted afterwards)",
    )
    p.add_argument(
        "--chat",
        action="store_true",
        help="send each prompt as a user message through the chat template (the app's path)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the report here")
    p.add_argument(
        "--adapt",
        type=Path,
        default=None,
        metavar="TRAIN.jsonl",
        help="measure, then serve every TRAIN prompt with omnidraft as the app would "
        "(record, learn between prompts), then measure again",
    )
    p.add_argument(
        "--learn-every",
        type=int,
        default=None,
        metavar="N",
        help="with --adapt: the learner runs once N new turns have gathered (default: its batch size, 8; "
        "1: a user who leaves the learner time after every reply)",
    )
    p.add_argument(
        "--stream", type=segment_arg, default=None, metavar="FILE",
        help="decode a stream of chat turns (eval/streams/) prequentially: plain decoding, omnidraft "
        "learning in the idle time after each reply, and a frozen twin of it, interleaved turn by turn",
    )
    p.add_argument("--then", type=segment_arg, action="append", default=[], metavar="FILE[:N]",
                   help="with --stream: go on with this stream's first N turns (all without :N); repeatable")
    p.add_argument("--turns", type=turns_arg, default=None, metavar="N|A-B",
                   help="with --stream: its first N turns, or turns A to B (counted from 1)")
    p.add_argument("--idle-s", type=float, default=20.0,
                   help="with --stream: seconds the learner gets after each reply (default 20)")
    p.add_argument("--oracle", type=int, default=None, metavar="PASSES",
                   help="with --stream: the ceiling of learning; the learner first trains PASSES passes over the "
                        "turns' own replies, then is scored frozen against the untrained twin (bench/stream.py)")
    p.add_argument("--chart", type=Path, default=None, metavar="FILE.png",
                   help="with --stream: the curves, learner against twin, as a PNG")
    args = p.parse_args(argv)
    if (args.prompts is None) == (args.stream is None):
        p.error("give --prompts, or --stream for a stream of chat turns")
    if args.stream is None and (args.then or args.turns is not None or args.chart or args.oracle is not None):
        p.error("--then, --turns, --oracle and --chart go with --stream")
    if args.stream is not None:
        if args.adapt:
            p.error("--adapt and --stream exclude each other: a stream learns as it goes")
        if args.oracle is not None and args.oracle < 1:
            raise BenchError("--oracle needs at least 1 pass")
        if not args.idle_s >= 0:
            raise BenchError("--idle-s must be 0 or more seconds")
        if args.turns is not None:
            args.stream.first, args.stream.turns = args.turns
        args.stream_segment = args.stream
        for segment in (args.stream, *args.then):  # a bad file is named before any model loads
            read_stream(segment)
    try:
        args.methods = _method_list(args.methods, bool(args.draft))
    except ValueError as exc:
        p.error(str(exc))  # exit 2, with the usage line
    args.draft = list({v.label: v for v in args.draft}.values())  # drop repeats, keep order
    if args.limit is not None and args.limit < 1:
        raise BenchError("--limit must be at least 1")
    if args.max_new_tokens < 1:
        raise BenchError("--max-new-tokens must be at least 1")
    if args.learn_every is not None and args.learn_every < 1:
        raise BenchError("--learn-every must be at least 1")
    if args.temperature < 0:
        raise BenchError("--temperature must be 0 (greedy) or positive")
    return args


def _method_list(text: str, variants: bool) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        hint = ("; variants of omnidraft are settings: --draft KEY=VALUE[,KEY=VALUE...] (see --help)"
                if any(m.startswith("omnidraft") for m in unknown) else "")
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}{hint}")
    if not names and not variants:
        raise ValueError("no method to run: --methods is empty and no --draft was given")
    return list(dict.fromkeys(names))  # keep order, drop repeats


def read_prompts(path: Path, limit: int | None) -> list[dict]:
    if not path.is_file():
        raise BenchError(f"{path} does not exist")
    rows: list[dict] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BenchError(f"{path}:{n}: not valid JSON ({exc})") from exc
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise BenchError(f'{path}:{n}: each line needs a "prompt" string')
        rows.append(row)
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise BenchError(f"{path} holds no prompts")
    return rows


@contextmanager
def bench_home(state_dir: Path | None) -> Iterator[Path | None]:
    """Point OMNIDRAFT_HOME at the run's state dir; its cache/ links to the user's cache.

    The real cache dir is resolved before switching home, so converted model
    copies are reused rather than rebuilt for every run.
    """
    real_cache = paths.cache_dir()
    home = state_dir or Path(tempfile.mkdtemp(prefix="omnidraft-bench-"))
    home.mkdir(parents=True, exist_ok=True)
    cache = home / "cache"
    if not cache.exists() and not cache.is_symlink():
        cache.symlink_to(real_cache, target_is_directory=True)
    before = os.environ.get(paths.HOME_ENV)
    os.environ[paths.HOME_ENV] = str(home)
    try:
        yield state_dir
    finally:
        if before is None:
            os.environ.pop(paths.HOME_ENV, None)
        else:
            os.environ[paths.HOME_ENV] = before
        if state_dir is None:
            cache.unlink(missing_ok=True)  # never follow the link into the user's cache
            shutil.rmtree(home, ignore_errors=True)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def bench(args: argparse.Namespace, catalog: ModelCatalog) -> dict:
    prompts = read_prompts(args.prompts, args.limit) if args.stream is None else []
    engine = Engine(catalog, DTYPES[args.dtype], int8=args.dtype in ("int4", "int8"),
                    int4=args.dtype == "int4", drafter_id=args.drafter)
    print(f"loading {args.target} ...", file=sys.stderr, flush=True)
    engine.load_target(args.target)
    if args.stream is not None:
        return measure_stream(args, engine)
    engine.evaluating = True  # evaluation (warm-ups included) never teaches the engine
    methods, drafter = build_methods(args, engine, catalog)
    try:
        return measure(args, engine, drafter, methods, prompts)
    finally:
        close_methods(methods)


def measure(args: argparse.Namespace, engine: Engine, drafter: str | None, methods: list, prompts: list[dict]) -> dict:
    train = read_prompts(args.adapt, None) if args.adapt else []
    load_before = load_average()
    start = time.perf_counter()
    run_interleaved(methods, engine.target.model, prompts, args)
    if not train:
        wall = time.perf_counter() - start
        return build_report(args, engine, drafter, methods, prompts, wall, load_before)
    before = build_report(args, engine, drafter, methods, prompts, time.perf_counter() - start, load_before)
    engine.evaluating = False
    adapt = adapt_on(engine, train, args)
    engine.evaluating = True
    for m in methods:
        m.outputs = []  # a method that failed before stays failed: it runs no more
    run_interleaved(methods, engine.target.model, prompts, args)
    report = build_report(args, engine, drafter, methods, prompts, time.perf_counter() - start, load_before)
    report["adapt"] = {
        **adapt,
        "before": before["methods"],
        "after": report["methods"],
        "greedy_identical_before": before["greedy_identical"],
        "greedy_identical_after": report["greedy_identical"],
    }
    return report


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # argparse's usage errors (2) and --help (0)
        return exc.code if isinstance(exc.code, int) else 2
    except BenchError as exc:
        print(f"omnidraft-bench: error: {exc}", file=sys.stderr)
        return 2
    args.argv = argv
    try:
        # The user's catalog, resolved before the run's home replaces it, so
        # models they added are found by id.
        catalog = ModelCatalog(paths.data_dir() / "catalog.json")
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # keep generate()'s advice out of the table
        with bench_home(args.state_dir), torch_threads(args.threads or machine_cores()):
            report = bench(args, catalog)
    except (BenchError, ModelError, InputError) as exc:
        print(f"omnidraft-bench: error: {exc}", file=sys.stderr)
        return 2
    if "stream" in report:
        print(format_stream(report["stream"]))
    else:
        print(format_table(report))
    if "adapt" in report:
        print(format_adapt(report["adapt"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    if args.chart and "stream" in report:
        write_chart(report["stream"], args.chart)
        print(f"wrote {args.chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
