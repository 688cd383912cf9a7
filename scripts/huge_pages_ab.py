"""The packed weights and KV caches where they were made (4 KB pages, as before
huge_pages) against gathered onto 2 MB pages, in one process, alternating.

Builds the bundled drafter and the Qwen2.5-Coder-1.5B target twice (once with
huge_pages.gather and huge_pages.zeros made plain), reads a 200-token context
into each, then times, --reps times each way in turn: the target's one-token
step and 4-token verification, the drafter's forward right after a target step
and the next one, and 200-token prompt reads. Prints medians in ms, and how much
of each net's weights the kernel holds on huge pages (/proc/self/smaps).

    PYTHONPATH=. .venv/bin/python scripts/huge_pages_ab.py --reps 80
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from kernel_ab import prompt_nets
from omnidraft.core.models import huge_pages

CONTEXT = list(range(1000, 1200))


def huge_share(net) -> float:
    """The share of the net's packed weights on mappings backed by huge pages."""
    spans, span = [], None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(x, 16) for x in head.split("-"))
            span = [low, high, 0, 0]
            spans.append(span)
        elif head == "Rss:":
            span[2] = int(line.split()[1])
        elif head == "AnonHugePages:":
            span[3] = int(line.split()[1])
    held = {}
    for p in net._placeable(net.layers, net.head):
        address = p.kernel_weights[0].data_ptr()
        held.update({(s[0], s[1]): s for s in spans if s[0] <= address < s[1]})
    rss = sum(s[2] for s in held.values())
    return sum(s[3] for s in held.values()) / rss if rss else 0.0


def build(gathered: bool) -> dict:
    real = huge_pages.gather, huge_pages.zeros
    if not gathered:
        huge_pages.gather = lambda layers: None
        huge_pages.zeros = lambda shape, dtype: torch.zeros(shape, dtype=dtype)
    try:
        nets = prompt_nets()
        with torch.no_grad():
            for net in nets.values():  # the KV cache grows here, on its pages
                net.reset()
                net.forward(CONTEXT, last=1)
    finally:
        huge_pages.gather, huge_pages.zeros = real
    return nets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=80)
    args = ap.parse_args()
    torch.set_num_threads(2)
    ways = {"4 KB pages": build(False), "2 MB pages": build(True)}
    for way, nets in ways.items():
        print(f"{way}: on huge pages " + ", ".join(f"{n} {huge_share(net):.0%}" for n, net in nets.items()))
    times: dict[str, list] = {way: [] for way in ways}
    end = len(CONTEXT)
    with torch.no_grad():
        for _ in range(args.reps):
            for way, nets in ways.items():
                drafter, target = nets["drafter"], nets["target"]
                a = time.perf_counter()
                target.forward([5])
                b = time.perf_counter()
                target.rollback(end)
                target.forward([5, 6, 7, 8])
                c = time.perf_counter()
                target.rollback(end)
                drafter.forward([5])
                d = time.perf_counter()
                drafter.forward([6])
                e = time.perf_counter()
                drafter.rollback(end)
                times[way].append((b - a, c - b, d - c, e - d))
        reads: dict[tuple, list] = {}
        for _ in range(8):
            for way, nets in ways.items():
                for name, net in nets.items():
                    net.reset()
                    a = time.perf_counter()
                    net.forward(CONTEXT, last=1)
                    reads.setdefault((way, name), []).append(time.perf_counter() - a)
    print(f"ms, median of {args.reps}, the ways alternating, after {end} tokens of context")
    print(f"{'':<12} {'target 1 row':>13} {'4 rows':>8} {'drafter after target':>21} {'drafter again':>14}"
          f" {'prompt ms/token: target':>24} {'drafter':>8}")
    for way, rows in times.items():
        ms = [1000 * statistics.median(r[i] for r in rows) for i in range(4)]
        read = [1000 * statistics.median(reads[way, n]) / end for n in ("target", "drafter")]
        print(f"{way:<12} {ms[0]:>13.2f} {ms[1]:>8.2f} {ms[2]:>21.3f} {ms[3]:>14.3f} {read[0]:>24.3f} {read[1]:>8.3f}")


if __name__ == "__main__":
    main()
