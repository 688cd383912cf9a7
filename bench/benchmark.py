"""`omnidraft-bench`: this engine's decoding against the peers, on raw completion prompts.

Methods (all on the same loaded target model, same prompt token ids):
  target     this engine's plain decoding (Engine.complete)
  hf         transformers model.generate() alone
  uag        transformers assisted generation with the drafter as assistant_model
             (Universal Assisted Generation when the vocabularies differ)
  omnidraft  this engine's speculative decoding (Engine.complete(..., speculative=True))

With --chat each prompt is sent as one user message through the target's chat
template (Engine.chat: the app's own path, as a user meets it); without it the
prompt is a raw completion.

Every method is timed with the same wall clock around one whole call, prompt text
in, token ids out; methods run interleaved prompt by prompt so machine drift hits
all alike. tokens_per_step is new tokens per target forward call (prompt forward
included), counted by a hook on the target's input embeddings: one definition for
the engine and for transformers, so the peers compare. Plain decoding gives 1.0.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine, InputError
from omnidraft.core.engine_api import EngineAPI
from omnidraft.core.events import TurnFinished, TurnStats
from omnidraft.core.models.catalog import SMOLLM2_ID, ModelCatalog, ModelError
from omnidraft.core.models.chat_format import encode_chat, stop_token_ids
from omnidraft.core.models.loader import LoadedModel, load
from omnidraft.core.storage import paths

METHODS = ("target", "hf", "uag", "omnidraft")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# A neutral warm-up text: the engine may learn from what it decodes, and the
# warm-up must not hand it a benchmark prompt's continuation in advance.
WARMUP_PROMPT = "The quick brown fox"
WARMUP_TOKENS = 4


class BenchError(Exception):
    """A problem with the command line or the inputs; printed without a traceback."""


@dataclass
class Output:
    """One method's result on one prompt."""

    token_ids: list[int]
    seconds: float  # wall clock around the whole call
    forwards: int  # target forward calls, prompt forward included
    stats: TurnStats | None = None  # the engine's own accounting (engine methods only)


Runner = Callable[[str, GenerationConfig], tuple[list[int], TurnStats | None]]


@dataclass
class Method:
    name: str
    run: Runner
    forwards_reliable: bool = True
    outputs: list[Output] = field(default_factory=list)


# --------------------------------------------------------------------------- inputs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="omnidraft-bench",
        description="Tokens/s of this engine's plain and speculative decoding against "
        "transformers generate() and Universal Assisted Generation.",
    )
    p.add_argument("--target", required=True, help="catalog id or model path (GGUF or HF folder)")
    p.add_argument("--prompts", required=True, type=Path, help='JSONL file, lines {"prompt": ...}')
    p.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument(
        "--seed", type=int, default=0, help="sampling seed of prompt 0 (+i for prompt i)"
    )
    p.add_argument(
        "--methods", default=",".join(METHODS), help="comma list of " + ",".join(METHODS)
    )
    p.add_argument(
        "--drafter",
        default=None,
        help="drafter catalog id or Llama model path (default: the engine's; "
        f"OMNIDRAFT_DRAFTER or {SMOLLM2_ID})",
    )
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
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
    args = p.parse_args(argv)
    args.methods = _method_list(args.methods)
    if args.limit is not None and args.limit < 1:
        raise BenchError("--limit must be at least 1")
    if args.max_new_tokens < 1:
        raise BenchError("--max-new-tokens must be at least 1")
    if args.temperature < 0:
        raise BenchError("--temperature must be 0 (greedy) or positive")
    return args


def _method_list(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in names if m not in METHODS]
    if unknown or not names:
        raise BenchError(f"unknown method(s) {unknown or text!r}; choose from {', '.join(METHODS)}")
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


# --------------------------------------------------------------------------- environment


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


def machine_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use
    except AttributeError:
        return os.cpu_count() or 1


# --------------------------------------------------------------------------- methods


def as_chat(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def prompt_ids(tokenizer, prompt: str, chat: bool = False) -> list[int]:
    # Exactly how Engine.chat / Engine.complete tokenize, so every method decodes the same ids.
    if chat:
        return encode_chat(tokenizer, as_chat(prompt))
    return tokenizer(prompt, split_special_tokens=True)["input_ids"]


def trim(ids: list[int], stops: set[int], max_new_tokens: int) -> list[int]:
    """The engine's reply semantics: cut before the first stop id, at most max_new_tokens.

    generate() keeps the eos it stopped on, and assisted generation can accept
    tokens past it within one verified block.
    """
    for i, tok in enumerate(ids):
        if tok in stops:
            ids = ids[:i]
            break
    return ids[:max_new_tokens]


def engine_runner(engine: EngineAPI, speculative: bool, chat: bool = False) -> Runner:
    def run(prompt: str, cfg: GenerationConfig) -> tuple[list[int], TurnStats | None]:
        if chat:
            events = engine.chat(as_chat(prompt), cfg, speculative=speculative)
        else:
            events = engine.complete(prompt, cfg, speculative=speculative)
        done = [e for e in events if isinstance(e, TurnFinished)]
        if not done:
            raise RuntimeError("the engine finished without a TurnFinished event")
        stats = done[-1].stats
        if speculative and stats.method != "omnidraft":
            # The engine falls back to plain decoding when its drafter is off; timing
            # that as "omnidraft" would be a false figure.
            why = "; ".join(engine.warnings) or "no drafter loaded"
            raise BenchError(f"method 'omnidraft': the engine decoded plainly ({why})")
        return list(done[-1].token_ids), stats

    return run


def hf_runner(target: LoadedModel, assistant: LoadedModel | None = None, chat: bool = False) -> Runner:
    """transformers generate() on the target, optionally assisted by a drafter."""
    model, tok = target.model, target.tokenizer
    stops = stop_token_ids(tok, model)  # the stop ids the engine uses
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(stops, default=0)
    extra: dict = {}
    if assistant is not None:
        extra["assistant_model"] = assistant.model
        # transformers decides "different tokenizers" by vocabulary size; follow it.
        if model.config.get_text_config().vocab_size != (
            assistant.model.config.get_text_config().vocab_size
        ):
            extra.update(tokenizer=tok, assistant_tokenizer=assistant.tokenizer)

    @torch.inference_mode()
    def run(prompt: str, cfg: GenerationConfig) -> tuple[list[int], TurnStats | None]:
        ids = prompt_ids(tok, prompt, chat)
        x = torch.tensor([ids], dtype=torch.long)
        sampling: dict = {"do_sample": False}
        if not cfg.greedy:
            # The engine samples from the full distribution (top-p only): no top-k.
            sampling = {
                "do_sample": True,
                "temperature": cfg.temperature,
                "top_p": cfg.top_p,
                "top_k": 0,
            }
            torch.manual_seed(cfg.seed if cfg.seed is not None else 0)
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=cfg.max_new_tokens,
            eos_token_id=sorted(stops) or None,
            pad_token_id=pad,
            **sampling,
            **extra,
        )
        return trim(out[0, len(ids) :].tolist(), stops, cfg.max_new_tokens), None

    return run


def uag_drafter(
    engine: EngineAPI, dtype: torch.dtype, catalog: ModelCatalog, drafter_id: str | None = None
) -> LoadedModel:
    """The engine's drafter when it has one, else the bundled SmolLM2; always a private copy.

    transformers prunes the assistant's LM head in place when sampling and keeps
    its draft-length heuristic on the assistant between calls: the engine's own
    drafter must not be touched by that. (engine.drafter is the transformers model
    as loaded; the engine drafts with its own lean copy of the weights.)
    """
    own = engine.drafter
    if own is None:
        return load(catalog.get(drafter_id or SMOLLM2_ID), dtype)
    return LoadedModel(own.entry, copy.deepcopy(own.model), own.tokenizer, 0.0)


def shares_embeddings(engine: EngineAPI) -> bool:
    """True when the engine's drafter calls the target's embedding module (self-drafting).

    Then the forward counter would count drafter calls as target forwards.
    """
    if engine.drafter is None:
        return False
    return engine.drafter.model.get_input_embeddings() is engine.target.model.get_input_embeddings()


# --------------------------------------------------------------------------- running


@contextmanager
def count_forwards(model) -> Iterator[list[int]]:
    """Counts target forward calls: every forward embeds its input ids exactly once."""
    calls = [0]

    def hook(*_args) -> None:
        calls[0] += 1

    handle = model.get_input_embeddings().register_forward_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()


def timed(method: Method, target_model, prompt: str, cfg: GenerationConfig) -> Output:
    with count_forwards(target_model) as calls:
        start = time.perf_counter()
        ids, stats = method.run(prompt, cfg)
        seconds = time.perf_counter() - start
    return Output(ids, seconds, calls[0], stats)


def prompt_config(args: argparse.Namespace, index: int) -> GenerationConfig:
    return GenerationConfig(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed + index
    )


def warm_up(method: Method) -> None:
    """One short untimed generation: first-call overheads (allocations, lazy init) stay out.

    It is also where a method that cannot run here fails, before any timing.
    """
    try:
        method.run(WARMUP_PROMPT, GenerationConfig(max_new_tokens=WARMUP_TOKENS))
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise BenchError(f"method '{method.name}' cannot run: {type(exc).__name__}: {exc}") from exc


def run_interleaved(
    methods: list[Method], target_model, prompts: list[dict], args: argparse.Namespace
) -> None:
    """For each prompt, each method in turn, so drift of the machine hits all alike."""
    for i, row in enumerate(prompts):
        cfg = prompt_config(args, i)
        line = []
        for m in methods:
            out = timed(m, target_model, row["prompt"], cfg)
            m.outputs.append(out)
            line.append(f"{m.name} {len(out.token_ids)} tok {out.seconds:.2f} s")
        print(f"prompt {i + 1}/{len(prompts)}: " + ", ".join(line), file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- report


def engine_totals(outputs: list[Output]) -> dict | None:
    stats = [o.stats for o in outputs if o.stats is not None]
    if not stats:
        return None
    total = TurnStats(method=stats[0].method)
    counters = [  # the additive ones: counts and seconds
        f.name
        for f in fields(TurnStats)
        if isinstance(getattr(total, f.name), int | float)
        and not isinstance(getattr(total, f.name), bool)
    ]
    for s in stats:
        for key in counters:
            setattr(total, key, getattr(total, key) + getattr(s, key))
    return total.as_dict()


def identical_share(a: list[Output], b: list[Output]) -> float:
    return sum(x.token_ids == y.token_ids for x, y in zip(a, b)) / len(a)


def summarize(m: Method, base: Method | None, greedy: bool) -> dict:
    new_tokens = sum(len(o.token_ids) for o in m.outputs)
    seconds = sum(o.seconds for o in m.outputs)
    forwards = sum(o.forwards for o in m.outputs)
    engine = engine_totals(m.outputs)
    proposed = engine["proposed"] if engine else 0
    return {
        "tokens_per_s": new_tokens / seconds if seconds > 0 else 0.0,
        "speedup": None,  # filled in once target's rate is known
        "acceptance_rate": engine["accepted"] / proposed if proposed else None,
        "tokens_per_step": new_tokens / forwards if forwards and m.forwards_reliable else None,
        "new_tokens": new_tokens,
        "seconds": seconds,
        "target_forwards": forwards if m.forwards_reliable else None,
        "identical_to_target": (
            identical_share(m.outputs, base.outputs) if greedy and base and m is not base else None
        ),
        "per_prompt_seconds": [o.seconds for o in m.outputs],
        "engine": engine,
    }


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def top2_gap(model, ids: list[int]) -> float:
    """Target's logit margin between its two best next tokens after ids (fresh forward)."""
    logits = model(input_ids=torch.tensor([ids], dtype=torch.long)).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def divergences(
    m: Method, base: Method, target: LoadedModel, prompts: list[dict], chat: bool = False
) -> list[dict]:
    """Where a method's greedy output first leaves the target's, and how close the call was."""
    found = []
    for i, (mine, ref) in enumerate(zip(m.outputs, base.outputs)):
        pos = first_difference(mine.token_ids, ref.token_ids)
        if pos is None:
            continue
        ids = prompt_ids(target.tokenizer, prompts[i]["prompt"], chat) + ref.token_ids[:pos]
        found.append({"prompt_index": i, "position": pos, "top2_gap": top2_gap(target.model, ids)})
    return found


def load_average() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def machine_info(load_before: float | None) -> dict:
    import transformers

    return {
        "torch_threads": torch.get_num_threads(),
        # Other work on the cores skews every figure: record how busy the machine was.
        "load_average_1min_before": load_before,
        "load_average_1min_after": load_average(),
        "cores": machine_cores(),
        "cpu": platform.processor() or platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def build_report(
    args: argparse.Namespace,
    engine: EngineAPI,
    drafter: str | None,
    methods: list[Method],
    prompts: list[dict],
    wall: float,
    load_before: float | None,
) -> dict:
    greedy = args.temperature <= 0
    by_name = {m.name: m for m in methods}
    base = by_name.get("target")
    summary = {m.name: summarize(m, base, greedy) for m in methods}
    base_rate = summary["target"]["tokens_per_s"] if base else 0.0
    for s in summary.values():
        s["speedup"] = s["tokens_per_s"] / base_rate if base_rate > 0 else None
    diverged = {}
    if greedy and base:
        diverged = {
            m.name: divergences(m, base, engine.target, prompts, args.chat)
            for m in methods
            if m is not base
        }
    spec = summary.get("omnidraft")
    return {
        "target": engine.target.entry.name,
        "target_id": engine.target.entry.id,
        "drafter": drafter,
        "drafter_runtime": (
            engine.drafter_description if "omnidraft" in by_name else None
        ),
        "dtype": args.dtype,
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
        "greedy_identical": spec["identical_to_target"] if spec else None,
        "methods": summary,
        "divergences": diverged.get("omnidraft", []),
        "divergences_by_method": diverged,
        "chat": args.chat,
        "outputs": {m.name: [o.token_ids for o in m.outputs] for m in methods},
        # What was generated, readable: anyone can check the replies, not only time them.
        "texts": {
            m.name: [engine.target.tokenizer.decode(o.token_ids, skip_special_tokens=True)
                     for o in m.outputs]
            for m in methods
        },
        "prompt_ids": [row.get("id", i) for i, row in enumerate(prompts)],
        "state_dir": str(args.state_dir) if args.state_dir else None,
        "wall_seconds": wall,
        "command": shlex.join(["omnidraft-bench", *args.argv]),
        "machine": machine_info(load_before),
    }


def format_adapt(adapt: dict) -> str:
    lines = [
        (f"adapt: {adapt['train_prompts']} training prompts served, {adapt['learn_steps']} learner "
        f"steps, {adapt['ngram_cache_entries']} n-gram entries"),
        (f"{'method':<10} {'before tok/s':>13} {'after tok/s':>12} {'before x':>9} {'after x':>8} "
        f"{'accept before':>14} {'accept after':>13}"),
    ]
    for name, after in adapt["after"].items():
        b = adapt["before"][name]
        lines.append(
            f"{name:<10} {b['tokens_per_s']:>13.2f} {after['tokens_per_s']:>12.2f} "
            f"{_cell(b['speedup'], '.2f'):>9} {_cell(after['speedup'], '.2f'):>8} "
            f"{_cell(b['acceptance_rate'], '.3f'):>14} {_cell(after['acceptance_rate'], '.3f'):>13}"
        )
    return "\n".join(lines)


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_table(report: dict) -> str:
    head = (
        f"target: {report['target']}   drafter: {report['drafter'] or '-'}   "
        f"dtype: {report['dtype']}   prompts: {report['prompts']}   "
        f"max new tokens: {report['max_new_tokens']}   temperature: {report['temperature']}   "
        f"prompts as: {'chat' if report.get('chat') else 'raw completion'}   "
        f"threads: {report['machine']['torch_threads']}"
    )
    cols = (
        f"{'method':<10} {'tokens/s':>9} {'speedup':>8} {'accept':>7} {'tok/step':>9} "
        f"{'new tok':>8} {'seconds':>8} {'same as target':>15}"
    )
    lines = [head, cols]
    n = report["prompts"]
    for name, s in report["methods"].items():
        same = s["identical_to_target"]
        lines.append(
            f"{name:<10} {s['tokens_per_s']:>9.2f} {_cell(s['speedup'], '.2f') + 'x':>8} "
            f"{_cell(s['acceptance_rate'], '.3f'):>7} {_cell(s['tokens_per_step'], '.2f'):>9} "
            f"{s['new_tokens']:>8} {s['seconds']:>8.2f} "
            f"{'-' if same is None else f'{round(same * n)}/{n}':>15}"
        )
    for name, found in report["divergences_by_method"].items():
        for d in found:
            lines.append(
                f"{name} differs from target on prompt {d['prompt_index']} at token "
                f"{d['position']} (target top-2 logit gap {d['top2_gap']:.3f})"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def build_methods(
    args: argparse.Namespace, engine: EngineAPI, catalog: ModelCatalog
) -> tuple[list[Method], str | None]:
    """Runners in the order asked, warmed up; uag last so a lazily loaded drafter exists."""
    made: dict[str, Method] = {}
    if "target" in args.methods:
        made["target"] = Method("target", engine_runner(engine, False, args.chat))
    if "hf" in args.methods:
        made["hf"] = Method("hf", hf_runner(engine.target, chat=args.chat))
    if "omnidraft" in args.methods:
        made["omnidraft"] = Method("omnidraft", engine_runner(engine, True, args.chat))
    for m in made.values():
        warm_up(m)
    if "omnidraft" in made:
        made["omnidraft"].forwards_reliable = not shares_embeddings(engine)
    # The drafter is named only when a method used it (the engine may load one anyway).
    drafter = engine.drafter.entry if engine.drafter is not None else None
    name = drafter.name if drafter and "omnidraft" in made else None
    if "uag" in args.methods:
        assistant = uag_drafter(engine, DTYPES[args.dtype], catalog, args.drafter)
        made["uag"] = Method("uag", hf_runner(engine.target, assistant, args.chat))
        warm_up(made["uag"])
        name = name or assistant.entry.name
    return [made[m] for m in args.methods], name


def bench(args: argparse.Namespace, catalog: ModelCatalog) -> dict:
    prompts = read_prompts(args.prompts, args.limit)
    engine = Engine(catalog, DTYPES[args.dtype], drafter_id=args.drafter)
    print(f"loading {args.target} ...", file=sys.stderr, flush=True)
    engine.load_target(args.target)
    methods, drafter = build_methods(args, engine, catalog)
    train = read_prompts(args.adapt, None) if args.adapt else []
    load_before = load_average()
    start = time.perf_counter()
    engine.evaluating = True  # evaluation never teaches the engine
    run_interleaved(methods, engine.target.model, prompts, args)
    if not train:
        wall = time.perf_counter() - start
        return build_report(args, engine, drafter, methods, prompts, wall, load_before)
    before = build_report(args, engine, drafter, methods, prompts, time.perf_counter() - start, load_before)
    engine.evaluating = False
    adapt = adapt_on(engine, train, args)
    engine.evaluating = True
    for m in methods:
        m.outputs = []
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


def adapt_on(engine: Engine, train: list[dict], args: argparse.Namespace) -> dict:
    """Serve every training prompt with omnidraft as the app does: each finished
    turn is recorded, and the learner runs its pass over the buffer in the gap
    before the next prompt once a batch has gathered (the paper's schedule: every
    I prompts one pass over the buffer, then clear it)."""
    batch = engine.learn_settings.batch_size
    serve_s = learn_s = 0.0
    steps_before = None
    last = None
    for i, row in enumerate(train):
        t0 = time.perf_counter()
        for _ in engine.complete(row["prompt"], prompt_config(args, i), speculative=True):
            pass
        t1 = time.perf_counter()
        if len(engine.buffer) >= batch or i == len(train) - 1:
            while (progress := engine.idle_step()) is not None and progress.state == "running":
                steps_before = progress.steps if steps_before is None else steps_before
                last = progress
                if progress.buffered == 0:
                    break
        serve_s, learn_s = serve_s + t1 - t0, learn_s + time.perf_counter() - t1
        loss = f", loss {last.loss:.3f}" if last and last.loss is not None else ""
        print(f"adapt {i + 1}/{len(train)}: served {t1 - t0:.1f} s, learned "
              f"{time.perf_counter() - t1:.1f} s{loss}", file=sys.stderr, flush=True)
    return {
        "train_prompts": len(train),
        "learn_steps": last.steps if last else 0,
        "serve_seconds": serve_s,
        "learn_seconds": learn_s,
        "final_loss": last.loss if last else None,
        "ngram_cache_entries": len(engine.bridge.cache),
        # What adaptive drafting measured per draft source while serving (tokens/s).
        "draft_sources": engine.draft_policy.summary(),
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv)
        args.argv = argv
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
    print(format_table(report))
    if "adapt" in report:
        print(format_adapt(report["adapt"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
