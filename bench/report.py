"""What `omnidraft-bench` reports: per-method summaries, divergences, the machine, the table."""

from __future__ import annotations

import argparse
import os
import platform
import shlex
from dataclasses import fields

import torch
from omnidraft.bench.runners import Method, Output, prompt_ids
from omnidraft.core.engine_api import EngineAPI
from omnidraft.core.events import TurnStats
from omnidraft.core.kernels.build import kernel_isa
from omnidraft.core.models.loader import LoadedModel
from omnidraft.core.models.quantize import streamed_bytes


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


def drafting_figures(engine: dict | None, turns: int) -> dict | None:
    """What learning should move, from an omnidraft method's
    engine totals: acceptance overall and per source (the drafter's own
    proposals, prompt lookup's, and the drafter's n-gram-merged ones among
    them), target-space tokens proposed per verification step, and the stop
    rule's calibration: its mean predicted chance against the observed rate
    over the drafter proposals it was judged on."""
    if not engine or engine["method"] != "omnidraft":
        return None

    def ratio(a: float, b: float) -> float | None:
        return a / b if b else None

    e = engine
    verify_steps = e["steps"] - turns  # each turn's first target forward reads the prompt
    return {
        "acceptance": ratio(e["accepted"], e["proposed"]),
        "acceptance_drafter": ratio(e["accepted"] - e["lookup_accepted"], e["proposed"] - e["lookup_proposed"]),
        "acceptance_lookup": ratio(e["lookup_accepted"], e["lookup_proposed"]),
        "acceptance_ngram": ratio(e["ngram_accepted"], e["ngram_proposed"]),
        "drafted_tokens_per_step": ratio(e["proposed"], verify_steps),
        "calibration_predicted": ratio(e["chance_sum"], e["chance_checked"]),
        # ... the head's (or the drafter's confidence) before the online correction
        "calibration_raw_predicted": ratio(e["chance_raw_sum"], e["chance_checked"]),
        "calibration_observed": ratio(e["chance_accepted"], e["chance_checked"]),
        "calibration_proposals": e["chance_checked"],
    }


def identical_share(a: list[Output], b: list[Output]) -> float:
    return sum(x.token_ids == y.token_ids for x, y in zip(a, b)) / len(a)


def ms_per_step(seconds: float, forwards: int, engine: dict | None) -> dict:
    """Wall ms per target forward and, for speculative decoding, its drafting and
    verification parts: set beside the floor (target_streamed_bytes / bandwidth).
    draft_prompt_read: the part of draft that is the drafter's one read of each
    reply's prompt, spread over the steps."""
    out = {"wall": 1000 * seconds / forwards if forwards else None}
    if engine and engine.get("proposed"):
        steps = max(engine["steps"], 1)
        out |= {"draft": 1000 * engine["draft_seconds"] / steps,
                "draft_prompt_read": 1000 * engine["drafter_prompt_seconds"] / steps,
                "verify": 1000 * engine["verify_seconds"] / steps}
    return out


def decoding(outputs: list[Output]) -> dict | None:
    """The engine's decoding proper, past each reply's first token (the prompt's
    read, which drafting does not touch and which dilutes the wall-clock ratio):
    tokens after the first per second after it, and the mean time to the first
    token. None for a method that is not the engine."""
    stats = [o.stats for o in outputs if o.stats is not None and o.stats.new_tokens]
    if not stats:
        return None
    seconds = sum(s.seconds - s.first_token_seconds for s in stats)
    tokens = sum(s.new_tokens - 1 for s in stats)
    return {"tokens_per_s": tokens / seconds if seconds > 0 else None,
            "speedup": None,  # filled in once target's rate is known
            "first_token_s": sum(s.first_token_seconds for s in stats) / len(stats)}


def peer_totals(outputs: list[Output]) -> dict | None:
    """A peer's own accounting summed over the prompts (llama.cpp's server timings:
    prompt_n/_ms, predicted_n/_ms, draft_n, draft_n_accepted), with its acceptance."""
    timings = [o.peer for o in outputs if o.peer is not None]
    if not timings:
        return None
    total: dict = {}
    for t in timings:
        for key, value in t.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
    if total.get("draft_n"):
        total["acceptance_rate"] = total.get("draft_n_accepted", 0) / total["draft_n"]
    return total


def failed_summary(m: Method) -> dict:
    """A method that raised: its error, how many prompts it finished, no figures
    (a rate over the prompts before the failure would not compare)."""
    return {
        "failed": True,
        "error": m.error,
        "settings": m.settings,
        "completed_prompts": len(m.outputs),
        "tokens_per_s": None,
        "speedup": None,
        "acceptance_rate": None,
        "tokens_per_step": None,
        "new_tokens": sum(len(o.token_ids) for o in m.outputs),
        "identical_to_target": None,
        "drafting": None,
        "decoding": None,
        "engine": None,
    }


def summarize(m: Method, base: Method | None, greedy: bool) -> dict:
    if m.error is not None:
        return failed_summary(m)
    new_tokens = sum(len(o.token_ids) for o in m.outputs)
    seconds = sum(o.seconds for o in m.outputs)
    forwards = sum(o.forwards for o in m.outputs)
    engine = engine_totals(m.outputs)
    peer = peer_totals(m.outputs)
    proposed = engine["proposed"] if engine else 0
    acceptance = engine["accepted"] / proposed if proposed else (peer or {}).get("acceptance_rate")
    return {
        "failed": False,
        "settings": m.settings,
        "tokens_per_s": new_tokens / seconds if seconds > 0 else 0.0,
        "speedup": None,  # filled in once target's rate is known
        "acceptance_rate": acceptance,
        "tokens_per_step": new_tokens / forwards if forwards and m.forwards_reliable else None,
        "new_tokens": new_tokens,
        "seconds": seconds,
        "target_forwards": forwards if m.forwards_reliable else None,
        "identical_to_target": (
            identical_share(m.outputs, base.outputs) if greedy and base and m is not base else None
        ),
        "per_prompt_seconds": [o.seconds for o in m.outputs],
        "drafting": drafting_figures(engine, len(m.outputs)),
        "decoding": decoding(m.outputs),
        "engine": engine,
        "peer": peer,
        "ms_per_step": ms_per_step(seconds, forwards if m.forwards_reliable else 0, engine),
    }


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def top2_gap(target: LoadedModel, ids: list[int]) -> float:
    """Target's logit margin between its two best next tokens after ids: one fresh
    forward through the runtime the engine decodes with (scripts/divergence_gaps.py
    replays plain decoding token by token instead)."""
    return margin(target.runner.session().forward(ids, last=1)[-1])


def margin(logits: torch.Tensor) -> float:
    """The logit margin between the two best tokens: how close a greedy call was."""
    top = logits.float().topk(2).values
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
        found.append({"prompt_index": i, "position": pos, "top2_gap": top2_gap(target, ids)})
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
        # which build of the 4-bit kernels ran (avx512vnni, avx2; None: int8 only)
        "kernel": kernel_isa(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def llamacpp_report(methods: list[Method]) -> dict | None:
    """The llama.cpp build that ran (release, build, flags, version); None when no
    llamacpp method was asked for."""
    if not any(m.name.startswith("llamacpp") for m in methods):
        return None
    from . import llamacpp

    return llamacpp.build_info()


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
    if base is not None and base.error is not None:
        base = None  # nothing to compare with
    ran = [m for m in methods if m.error is None]
    summary = {m.name: summarize(m, base, greedy) for m in methods}
    base_rate = summary["target"]["tokens_per_s"] if base else 0.0
    base_decoding = (summary["target"]["decoding"] or {}).get("tokens_per_s") if base else None
    for s in summary.values():
        if s["failed"]:
            continue
        s["speedup"] = s["tokens_per_s"] / base_rate if base_rate > 0 else None
        if s["decoding"] and base_decoding and s["decoding"]["tokens_per_s"]:
            s["decoding"]["speedup"] = s["decoding"]["tokens_per_s"] / base_decoding
    diverged = {}
    if greedy and base:
        diverged = {
            m.name: divergences(m, base, engine.target, prompts, args.chat)
            for m in ran
            if m is not base
        }
    spec = summary.get("omnidraft")
    return {
        "target": engine.target.entry.name,
        "target_id": engine.target.entry.id,
        "drafter": drafter,
        "drafter_runtime": (
            engine.drafter_description if any(m.name.startswith("omnidraft") for m in ran) else None
        ),
        "dtype": args.dtype,
        "target_int8": engine.target.int8,
        # Bytes one target forward streams; floor_ms = these / the bandwidth that
        # scripts/speed_floor.py measures on the same machine.
        "target_streamed_bytes": streamed_bytes(engine.target.model),
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
        "greedy_identical": spec["identical_to_target"] if spec else None,
        "methods": summary,
        "divergences": diverged.get("omnidraft", []),
        "divergences_by_method": diverged,
        "chat": args.chat,
        "llamacpp": llamacpp_report(methods),
        # Each method's settings (a --draft variant's keys, a peer's flags) and, for
        # one that raised, its error: {type, message, prompt_index, where}.
        "errors": {m.name: m.error for m in methods if m.error is not None},
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
        (f"adapt: {adapt['train_prompts']} training prompts served, learning once "
        f"{adapt['learn_every']} new turn(s) gathered: {adapt['learn_steps']} learner steps, "
        f"{adapt['ngram_cache_entries']} n-gram entries"),
        (f"{'method':<10} {'before tok/s':>13} {'after tok/s':>12} {'before x':>9} {'after x':>8} "
        f"{'accept before':>14} {'accept after':>13} {'decoding x before':>18} {'after':>6}"),
    ]
    for name, after in adapt["after"].items():
        b = adapt["before"][name]
        lines.append(
            f"{name:<10} {_cell(b['tokens_per_s'], '.2f'):>13} {_cell(after['tokens_per_s'], '.2f'):>12} "
            f"{_cell(b['speedup'], '.2f'):>9} {_cell(after['speedup'], '.2f'):>8} "
            f"{_cell(b['acceptance_rate'], '.3f'):>14} {_cell(after['acceptance_rate'], '.3f'):>13} "
            f"{_cell((b.get('decoding') or {}).get('speedup'), '.2f'):>18} "
            f"{_cell((after.get('decoding') or {}).get('speedup'), '.2f'):>6}"
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
        f"{'new tok':>8} {'seconds':>8} {'same as target':>15} {'decoding x':>11}"
    )
    lines = [head, cols]
    n = report["prompts"]
    width = max([10, *(len(name) for name in report["methods"])])
    lines[1] = f"{'method':<{width}}" + cols[len("method".ljust(10)):]
    for name, s in report["methods"].items():
        if s["failed"]:
            e = s["error"]
            where = "warm-up" if e["prompt_index"] is None else f"prompt {e['prompt_index'] + 1}"
            lines.append(f"{name:<{width}} FAILED at {where}: {e['type']}: {e['message']}"[:300])
            continue
        same = s["identical_to_target"]
        lines.append(
            f"{name:<{width}} {s['tokens_per_s']:>9.2f} {_cell(s['speedup'], '.2f') + 'x':>8} "
            f"{_cell(s['acceptance_rate'], '.3f'):>7} {_cell(s['tokens_per_step'], '.2f'):>9} "
            f"{s['new_tokens']:>8} {s['seconds']:>8.2f} "
            f"{'-' if same is None else f'{round(same * n)}/{n}':>15} "
            f"{_cell((s.get('decoding') or {}).get('speedup'), '.2f') + 'x':>11}"
        )
    for name, found in report["divergences_by_method"].items():
        for d in found:
            lines.append(
                f"{name} differs from target on prompt {d['prompt_index']} at token "
                f"{d['position']} (target top-2 logit gap {d['top2_gap']:.3f})"
            )
    return "\n".join(lines)


def machine_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use
    except AttributeError:
        return os.cpu_count() or 1
