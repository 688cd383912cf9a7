"""What serving over HTTP costs: the local server's tokens/s (`omnidraft serve`, its
own worker, greedy, drafted) against the same engine in-process on the same prompts
(Engine.chat, as the bench runs it), and against llama.cpp's llama-server (`make
peers`; the same GGUF through its own OpenAI endpoint, in its prompt-lookup mode
with a slot per client), for 1 and for 4 concurrent clients.

Each dev prompt is one user message; with C clients the prompts are shared out
among C threads, each sending its next one when its reply is done, so C requests
are in flight at once and queue on the one engine. A level's tokens/s is all its
replies' tokens over its wall time (throughput); per_request_tokens_per_s is each
reply's tokens over its own time, queueing included. Served turns teach the
drafter nothing (learning from API traffic off), as in-process turns (evaluating).

    .venv/bin/python -m omnidraft.tools.serve_speed --llamacpp --json serve-speed.json

--prompts defaults to eval/dev.jsonl (the checkout's, else the current directory's).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .common import (
    check_file,
    eval_file,
    int_list,
    output_file,
    positive_int,
    tool_parser,
    write_json,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = tool_parser(__file__, __doc__)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct", help="catalog id or model path")
    parser.add_argument("--prompts", type=Path, default=eval_file("dev.jsonl"), help="JSON lines with a 'prompt'")
    parser.add_argument("--limit", type=positive_int, default=16, help="how many prompts (default 16)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--clients", type=int_list, default=(1, 4), help="concurrent clients, as 1,4")
    parser.add_argument("--llamacpp", action="store_true", help="also llama-server (built by `make peers`)")
    parser.add_argument("--threads", type=positive_int, default=None, help="llama-server's threads "
                        "(default: the engine's, the physical cores)")
    parser.add_argument("--json", type=output_file, default=None, help="write the report here")
    args = parser.parse_args(argv)
    check_file(parser, "--prompts", args.prompts)
    return args


def load_prompts(path: Path, limit: int) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["prompt"] for line in f if line.strip()][:limit]


def in_process(target: str, prompts: list[str], max_new_tokens: int) -> tuple[dict, str]:
    """The engine itself, one prompt after another; and the GGUF it read, if any."""
    from omnidraft.core.decoding.sampling import GenerationConfig
    from omnidraft.core.engine import Engine
    from omnidraft.core.events import TurnFinished
    from omnidraft.core.models.loader import source_path

    engine = Engine()
    entry = engine.load_target(target)
    engine.evaluating = True
    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    tokens, seconds, texts = 0, 0.0, []
    for prompt in prompts:
        start = time.perf_counter()
        done = [e for e in engine.chat([{"role": "user", "content": prompt}], cfg) if isinstance(e, TurnFinished)][-1]
        seconds += time.perf_counter() - start
        tokens += done.stats.new_tokens
        texts.append(done.text)
    source = str(source_path(entry))  # a bundled target's assembled file too
    gguf = source if source.endswith(".gguf") else ""
    return {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 2),
            "texts": texts}, gguf


def post(url: str, body: dict, key: str | None = None) -> dict:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=3600) as response:
        return json.loads(response.read())


def clients(url: str, model: str, prompts: list[str], max_new_tokens: int, count: int) -> dict:
    """`count` clients sharing out the prompts; tokens/s over the level's wall time."""
    replies: list[tuple[int, float, str]] = [(0, 0.0, "")] * len(prompts)

    def one(i: int) -> None:
        start = time.perf_counter()
        reply = post(f"{url}/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": prompts[i]}],
            "max_tokens": max_new_tokens, "temperature": 0.0})
        replies[i] = (reply["usage"]["completion_tokens"], time.perf_counter() - start,
                      reply["choices"][0]["message"]["content"])

    def client(number: int) -> None:
        for i in range(number, len(prompts), count):
            one(i)

    start = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        list(pool.map(client, range(count)))
    wall = time.perf_counter() - start
    tokens = sum(n for n, _, _ in replies)
    return {"clients": count, "tokens": tokens, "seconds": round(wall, 3), "tokens_per_s": round(tokens / wall, 2),
            "per_request_tokens_per_s": round(sum(n / s for n, s, _ in replies if s) / len(replies), 2),
            "texts": [t for _, _, t in replies]}


def served(target: str, prompts: list[str], max_new_tokens: int, levels: tuple[int, ...]) -> dict:
    from omnidraft.server.runner import serve

    started: dict = {}
    stop = threading.Event()
    thread = threading.Thread(target=lambda: started.setdefault("rc", serve(
        "127.0.0.1", 0, model=target, learn=False, stop=stop,
        ready=lambda url, service: started.update(url=url, model=service.current.model_id))), daemon=True)
    thread.start()
    while "url" not in started and "rc" not in started:
        time.sleep(0.2)
    if "url" not in started:
        raise SystemExit("The server did not start (see above).")
    try:
        return {str(c): clients(started["url"], started["model"], prompts, max_new_tokens, c) for c in levels}
    finally:
        stop.set()
        thread.join(60)


def llamacpp(gguf: str, prompts: list[str], max_new_tokens: int, levels: tuple[int, ...], threads: int) -> dict:
    """llama-server at its best for each level: its prompt-lookup speculation (its
    fastest mode in the bench's chat runs) and a slot per client, so concurrent
    requests are batched rather than queued."""
    from omnidraft.bench.llamacpp import MODES, Server

    out: dict = {"mode": "llamacpp-ngram"}
    for c in levels:
        server = Server(Path(gguf), MODES["llamacpp-ngram"], threads, slots=c)
        server.start()
        try:
            out[str(c)] = {**clients(server.url("/v1"), "target", prompts, max_new_tokens, c),
                           "settings": server.settings()}
        finally:
            server.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from omnidraft.core.worker.process import default_threads

    prompts = load_prompts(args.prompts, args.limit)
    report: dict = {"target": args.target, "prompts": str(args.prompts), "count": len(prompts),
                    "max_new_tokens": args.max_new_tokens, "machine": platform.processor() or platform.machine()}
    report["in_process"], gguf = in_process(args.target, prompts, args.max_new_tokens)
    print(f"in-process: {report['in_process']['tokens_per_s']} tokens/s", file=sys.stderr)
    report["served"] = served(args.target, prompts, args.max_new_tokens, args.clients)
    for level, figures in report["served"].items():
        same = figures["texts"] == report["in_process"]["texts"]
        figures["same_texts_as_in_process"] = same
        print(f"served, {level} client(s): {figures['tokens_per_s']} tokens/s"
              f" ({figures['tokens_per_s'] / report['in_process']['tokens_per_s']:.2f}x in-process)",
              file=sys.stderr)
    if args.llamacpp:
        if not gguf:
            print("--llamacpp needs a GGUF target; skipped.", file=sys.stderr)
        else:
            report["llamacpp"] = llamacpp(gguf, prompts, args.max_new_tokens, args.clients,
                                          args.threads or default_threads())
            for level, figures in report["llamacpp"].items():
                if level != "mode":
                    ours = report["served"][level]["tokens_per_s"]
                    print(f"llama-server, {level} client(s): {figures['tokens_per_s']} tokens/s "
                          f"(served omnidraft {ours / figures['tokens_per_s']:.2f}x)", file=sys.stderr)
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
