"""A long conversation's speed, turn by turn: plain decoding against omnidraft as
the conversation (and with it every step's attention) grows, through Engine.chat
with the caches kept between turns, as the app keeps them.

One conversation of --turns dev prompts as user messages. Each turn is answered
by both methods, the order swapped from turn to turn so a drifting machine slows
both alike; before each run the target's cache is cut back to the conversation
before this turn's message (what the app holds after the last reply), so neither
method reuses the other's read of the new message. The drafter's cache is the
one omnidraft left after its previous turn. The history takes plain decoding's
reply (omnidraft's is the same text, checked turn by turn). With --llamacpp,
llama.cpp (`make peers`) decodes the same ids of the same GGUF as a third method,
keeping its own cache between turns as its Python binding does (the longest
prefix it already holds).

    .venv/bin/python -m omnidraft.tools.conversation_speed --turns 12 --llamacpp \
        --json conversation-speed.json

--prompts defaults to eval/dev.jsonl (the checkout's, else the current directory's).
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine
from omnidraft.core.events import TurnFinished
from omnidraft.core.models.catalog import ModelCatalog
from omnidraft.core.models.chat_format import stop_token_ids
from omnidraft.core.models.lean_llama import common_prefix
from omnidraft.core.models.loader import source_path

from .common import (
    check_file,
    eval_file,
    non_negative_int,
    output_file,
    positive_int,
    tool_parser,
    write_json,
)


def answer(engine: Engine, messages: list[dict], cfg: GenerationConfig, speculative: bool, history: int) -> dict:
    """One method's reply to the conversation, the target's cache first cut back to
    its first `history` ids (the conversation before the new message)."""
    ids = engine.encode(messages).ids
    engine.target.runner.cache.reuse(ids, compute=len(ids) - history)
    start = time.perf_counter()
    done = [e for e in engine.chat(messages, cfg, speculative=speculative) if isinstance(e, TurnFinished)][-1]
    seconds = time.perf_counter() - start
    s = done.stats
    decoding = seconds - s.first_token_seconds
    out = {"text": done.text, "new_tokens": s.new_tokens, "seconds": round(seconds, 3),
           "first_token_s": round(s.first_token_seconds, 3),
           "tokens_per_s": round(s.new_tokens / seconds, 2),
           "decoding_tokens_per_s": round((s.new_tokens - 1) / decoding, 2) if decoding > 0 else None}
    if speculative:
        out.update(steps=s.steps, drafter_prompt_s=round(s.drafter_prompt_seconds, 3), tokens_per_step=round(s.new_tokens / max(s.steps, 1), 2),
                   draft_ms_per_step=round(1000 * (s.draft_seconds - s.drafter_prompt_seconds) / max(s.steps, 1), 2),
                   verify_ms_per_step=round(1000 * s.verify_seconds / max(s.steps, 1), 2))
    return out


def llamacpp_answer(engine: Engine, threads: int):
    """llama.cpp's plain greedy reply to the conversation's ids, its cache kept."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(source_path(engine.target.entry)), n_ctx=4096, n_threads=threads,
                          n_threads_batch=threads, verbose=False)
    atexit.register(llm.close)  # before interpreter teardown, which it does not survive
    stops = stop_token_ids(engine.target.tokenizer, engine.target.model)

    def answer(messages: list[dict], cfg: GenerationConfig) -> dict:
        out: list[int] = []
        start = time.perf_counter()
        for token in llm.generate(engine.encode(messages).ids, top_k=1, temp=0.0, reset=True):
            if token in stops:
                break
            out.append(int(token))
            if len(out) == cfg.max_new_tokens:
                break
        seconds = time.perf_counter() - start
        return {"text": engine.target.tokenizer.decode(out, skip_special_tokens=True), "new_tokens": len(out),
                "seconds": round(seconds, 3), "tokens_per_s": round(len(out) / seconds, 2)}

    return llm, answer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = tool_parser(__file__, __doc__)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct", help="catalog id or model path")
    parser.add_argument("--prompts", type=Path, default=eval_file("dev.jsonl"),
                        help="a JSONL file of {\"prompt\": ...} rows, the conversation's user messages in turn")
    parser.add_argument("--turns", type=positive_int, default=16)
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--llamacpp", action="store_true", help="llama.cpp on the same GGUF as a third method")
    parser.add_argument("--window", type=non_negative_int, default=None,
                        help="the drafter's attention window (DraftSettings.window; 0: every position; "
                        "default: the engine's)")
    parser.add_argument("--json", type=output_file, help="write the report here")
    args = parser.parse_args(argv)
    check_file(parser, "--prompts", args.prompts)
    if args.llamacpp and importlib.util.find_spec("llama_cpp") is None:
        parser.error("--llamacpp runs llama.cpp through its Python binding: pip install llama-cpp-python")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = [json.loads(line)["prompt"] for line in args.prompts.read_text().splitlines() if line.strip()]
    engine = Engine(ModelCatalog())
    engine.load_target(args.target)
    engine.evaluating = True  # nothing learned while the two methods take turns
    if args.window is not None:
        engine.drafter.net.window = args.window
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens)
    for speculative in (False, True):  # warm-up
        list(engine.chat([{"role": "user", "content": rows[0]}], GenerationConfig(max_new_tokens=4),
                         speculative=speculative))
    llama = llamacpp_answer(engine, torch.get_num_threads()) if args.llamacpp else None
    if llama:
        # warm-up on another prompt, so llama.cpp does not hold the first turn's read
        llama[1]([{"role": "user", "content": rows[-1]}], GenerationConfig(max_new_tokens=4))
    engine.forget_context()
    messages: list[dict] = []
    turns = []
    for t, prompt in enumerate(rows[: args.turns]):
        before = engine.encode(messages).ids if messages else []
        messages.append({"role": "user", "content": prompt})
        now = engine.encode(messages).ids
        history = common_prefix(before, now, len(now))
        runs = {}
        for speculative in ((False, True) if t % 2 == 0 else (True, False)):
            runs["omnidraft" if speculative else "plain"] = answer(engine, messages, cfg, speculative, history)
        if llama:
            runs["llamacpp"] = llama[1](messages, cfg)
        plain, omni = runs["plain"], runs["omnidraft"]
        turn = {"turn": t + 1, "context_tokens": len(now), "history_tokens": history,
                "same_reply": plain["text"] == omni["text"],
                "speedup": round(omni["tokens_per_s"] / plain["tokens_per_s"], 3),
                "decoding_speedup": round(omni["decoding_tokens_per_s"] / plain["decoding_tokens_per_s"], 3),
                "plain": plain, "omnidraft": omni}
        if llama:
            turn["vs_llamacpp"] = round(omni["tokens_per_s"] / runs["llamacpp"]["tokens_per_s"], 3)
            turn["llamacpp"] = runs["llamacpp"]
        turns.append(turn)
        print(f"turn {t + 1}: {turn['context_tokens']} tokens of context; plain {plain['tokens_per_s']:.2f} tok/s, "
              f"omnidraft {omni['tokens_per_s']:.2f} ({turn['speedup']:.2f}x; decoding {turn['decoding_speedup']:.2f}x"
              f"), drafting {omni['draft_ms_per_step']:.1f} + verifying {omni['verify_ms_per_step']:.1f} ms a step, "
              f"{omni['tokens_per_step']:.2f} tokens a step; same reply {turn['same_reply']}"
              + (f"; llama.cpp {runs['llamacpp']['tokens_per_s']:.2f} tok/s ({turn['vs_llamacpp']:.2f}x)" if llama else ""),
              flush=True)
        messages.append({"role": "assistant", "content": plain["text"]})
        for run in runs.values():
            run.pop("text")
    report = {"target": args.target, "threads": torch.get_num_threads(), "max_new_tokens": args.max_new_tokens,
              "drafter_window": engine.drafter.net.window, "turns": turns}
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
