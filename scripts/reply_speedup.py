"""How well the app's per-reply speedup tells the real one.

The app cannot decode each reply twice. It estimates what plain decoding would
have taken for a reply (TurnStats.plain_seconds): the same prompt read, then the
target's plain step a token, timed when the target loads
(Engine.measure_baseline) and again after each drafted reply
(Engine.refresh_plain_step). Here every reply is decoded both ways through the
app's path (Engine.chat, each prompt a chat turn; with --turns N, N prompts make
one conversation, whose later turns read only what is new), and the real speedup
(plain seconds / omnidraft seconds) is set beside the figure the app shows and
the one it showed before the estimate (the reply's tokens/s over a short plain
reply's, prompt read included).

    .venv/bin/python scripts/reply_speedup.py --limit 12 --max-new-tokens 64,256 \
        --json docs/results/reply-speedup-qwen15-epyc.json
    .venv/bin/python scripts/reply_speedup.py --limit 12 --turns 4 --max-new-tokens 128 \
        --json docs/results/reply-speedup-qwen15-epyc-turns.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import BASELINE_PROMPT, BASELINE_TOKENS, Engine
from omnidraft.core.events import TurnFinished
from omnidraft.core.models.catalog import ModelCatalog


def decode(engine: Engine, messages: list[dict], tokens: int, speculative: bool) -> TurnFinished:
    """A reply as the app decodes it; a drafted one is followed by the plain step's
    timing the worker does in idle time, a plain one (the real speedup's
    reference) leaves the app's reference be, since people rarely ask for one."""
    kept = engine.plain_step_seconds
    done = [e for e in engine.chat(messages, GenerationConfig(max_new_tokens=tokens), speculative=speculative)
            if isinstance(e, TurnFinished)][-1]
    if speculative:
        engine.refresh_plain_step()
    else:
        engine.plain_step_seconds = kept
    return done


def conversation(engine: Engine, prompts: list[str], tokens: int, first: int) -> list[dict[bool, TurnFinished]]:
    """The prompts as one conversation's turns, each decoded both ways back to back
    (which way first alternates from `first`), so the machine's speed drifts little
    between the two. Each way reads only what is new: the target's cache is put
    back to where the turn found it before the other way decodes it."""
    engine.forget_context()  # the first turn reads its whole prompt
    messages: list[dict] = []
    turns = []
    for t, prompt in enumerate(prompts):
        messages.append({"role": "user", "content": prompt})
        cache = engine.target.runner.cache
        held = cache.length
        done = {}
        for spec in ((True, False) if (first + t) % 2 == 0 else (False, True)):
            cache.rollback(held)
            done[spec] = decode(engine, messages, tokens, spec)
        turns.append(done)
        messages.append({"role": "assistant", "content": done[True].text})
    return turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--prompts", type=Path, default=Path("eval/dev.jsonl"))
    parser.add_argument("--limit", type=int, default=12)
    parser.add_argument("--max-new-tokens", default="64,256", help="reply lengths, comma-separated")
    parser.add_argument("--turns", type=int, default=1, help="prompts a conversation; --limit prompts in all")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    prompts = [json.loads(line)["prompt"] for line in args.prompts.read_text().splitlines() if line.strip()]
    engine = Engine(ModelCatalog())
    engine.load_target(args.target)  # measures the plain reference, as the app does
    engine.evaluating = True  # nothing learned between the two decodes of a reply
    # What the app showed before the estimate: a reply's tokens/s over those of one
    # 24-token plain reply to a short prompt (its read included), measured at load.
    engine.forget_context()
    old = [e for e in engine.complete(BASELINE_PROMPT, GenerationConfig(max_new_tokens=BASELINE_TOKENS))
           if isinstance(e, TurnFinished)][-1].stats.tokens_per_s
    print(f"plain step {1000 * engine.plain_step_seconds:.1f} ms; the former baseline {old:.2f} tokens/s")
    rows = []
    for tokens in [int(t) for t in args.max_new_tokens.split(",")]:
        for c in range(args.limit // args.turns):
            turns = prompts[c * args.turns:(c + 1) * args.turns]
            for t, done in enumerate(conversation(engine, turns, tokens, c)):
                o, p = done[True], done[False]
                omni, plain = o.stats, p.stats
                row = {
                    "prompt": c * args.turns + t, "turn": t + 1, "max_new_tokens": tokens,
                    "new_tokens": omni.new_tokens, "prompt_tokens": omni.prompt_tokens, "same_reply": o.text == p.text,
                    "omnidraft_s": omni.seconds, "plain_s": plain.seconds,
                    "first_token_s": omni.first_token_seconds, "plain_first_token_s": plain.first_token_seconds,
                    "real": plain.seconds / omni.seconds, "shown": omni.speedup, "former": omni.tokens_per_s / old,
                }
                rows.append(row)
                print(f"{tokens:4d} tokens, prompt {row['prompt']:2d}, turn {t + 1} ({row['prompt_tokens']} prompt, "
                      f"{row['new_tokens']} new): real {row['real']:.2f}x, shown {row['shown']:.2f}x "
                      f"(formerly {row['former']:.2f}x)", flush=True)
    summary = {}
    for tokens in sorted({r["max_new_tokens"] for r in rows}):
        mine = [r for r in rows if r["max_new_tokens"] == tokens]
        summary[tokens] = {"real_total": sum(r["plain_s"] for r in mine) / sum(r["omnidraft_s"] for r in mine)}
        for way in ("shown", "former"):
            errors = [r[way] / r["real"] - 1 for r in mine]
            summary[tokens][way] = {"median_error": statistics.median(errors),
                                    "median_abs_error": statistics.median(abs(e) for e in errors),
                                    "worst_error": max(errors, key=abs)}
            print(f"{tokens} tokens, {way}: {way}/real - 1 median {statistics.median(errors):+.1%}, "
                  f"median |.| {summary[tokens][way]['median_abs_error']:.1%}, "
                  f"worst {summary[tokens][way]['worst_error']:+.1%}")
        print(f"{tokens} tokens: real speedup over the {len(mine)} replies {summary[tokens]['real_total']:.2f}x")
    if args.json:
        report = {"target": args.target, "plain_step_seconds": engine.plain_step_seconds, "former_baseline": old,
                  "summary": summary, "rows": rows}
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
