"""Time and memory of the chat search index for a large history.

Makes CHATS synthetic conversations of MESSAGES messages each (user messages of
about --user-chars characters, replies of about --reply-chars with a fenced code
block, words drawn from a seeded vocabulary), builds the in-memory search index
over them as the app does at start, and reports the build time, the memory the
index holds (traced by tracemalloc, the conversations themselves not counted),
and how long a few queries take. Nothing is written to disk.

    .venv/bin/python -m omnidraft.tools.search_index_size --chats 1000 --messages 20
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
import tracemalloc
from types import SimpleNamespace

from .common import positive_int, tool_parser

QUERIES = ("function", "return value", "zzqx", "parse the file")


def parse_args(argv: list[str] | None = None):
    p = tool_parser(__file__, __doc__)
    p.add_argument("--chats", type=positive_int, default=1000)
    p.add_argument("--messages", type=positive_int, default=20, help="messages per chat")
    p.add_argument("--user-chars", type=positive_int, default=300, help="about this long, each user message")
    p.add_argument("--reply-chars", type=positive_int, default=1500, help="about this long, each reply")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def vocabulary(rng: random.Random, size: int = 4000) -> list[str]:
    syllables = ["ka", "lo", "mi", "ten", "ra", "sun", "ve", "dor", "pi", "qu", "el", "an", "ost", "ri", "ba"]
    words = ["function", "return", "value", "file", "parse", "the", "a", "of", "to", "and", "string", "list"]
    while len(words) < size:
        words.append("".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))))
    return words


def text_of(rng: random.Random, words: list[str], chars: int, code: bool) -> str:
    parts, n = [], 0
    while n < chars:
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(5, 14))).capitalize() + "."
        parts.append(sentence)
        n += len(sentence) + 1
    text = " ".join(parts)
    if code:
        body = "\n".join(f"    {rng.choice(words)} = {rng.choice(words)}({rng.choice(words)})" for _ in range(8))
        text += f"\n\n```python\ndef {rng.choice(words)}(x):\n{body}\n    return x\n```\n"
    return text


def make_chats(args) -> list[SimpleNamespace]:
    """What the index reads of a conversation: its id, update time and messages."""
    rng = random.Random(args.seed)
    words = vocabulary(rng)
    chats = []
    for c in range(args.chats):
        messages = [{"role": "user", "content": text_of(rng, words, args.user_chars, False)} if i % 2 == 0
                    else {"role": "assistant", "content": text_of(rng, words, args.reply_chars, True)}
                    for i in range(args.messages)]
        chats.append(SimpleNamespace(id=f"{c:032x}", updated=float(c), messages=messages))
    return chats


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from omnidraft.core.storage.search_index import SearchIndex

    chats = make_chats(args)
    text_mb = sum(len(m["content"]) for c in chats for m in c.messages) / 1e6

    builds = []
    for _ in range(3):
        index = SearchIndex()
        start = time.perf_counter()
        index.sync(chats)
        builds.append(time.perf_counter() - start)

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    traced = SearchIndex()
    traced.sync(chats)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()

    by_id = {c.id: c for c in chats}

    def contents(conv_id: str, i: int) -> str:
        return by_id[conv_id].messages[i]["content"]

    queries = {}
    for query in QUERIES:
        times, hits = [], 0
        for _ in range(5):
            start = time.perf_counter()
            hits = len(index.search(query, contents))
            times.append(time.perf_counter() - start)
        queries[query] = {"ms": round(statistics.median(times) * 1000, 1), "hits": hits}

    print(json.dumps({
        "chats": args.chats, "messages_per_chat": args.messages, "text_mb": round(text_mb, 1),
        "build_seconds_median": round(statistics.median(builds), 3),
        "index_mib": round(held / 2**20, 1), "queries": queries,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
