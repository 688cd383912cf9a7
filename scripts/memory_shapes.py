"""Memory the learner keeps per training shape: the drafter's forward + backward
over replies of many lengths, with and without the learner's shape padding.

oneDNN, which runs bf16 matmuls on CPU, keeps what it builds for every shape it
meets. The learner pads the drafter's rows to multiples of SHAPE_STEP
(core/learning/learner.py) so it meets few shapes; this script measures the
memory malloc holds in use (glibc mallinfo2, after a heap trim) before and after
--lengths new reply lengths, with padding off (SHAPE_STEP = 1) and on.

    .venv/bin/python scripts/memory_shapes.py --lengths 12
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import gc
import json
import os
import sys
import tempfile
import time

import torch


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def in_use_mib(libc) -> float:
    """Bytes malloc has handed out and not had back (heap and mmapped), in MiB,
    after the heap trim the worker does after each learner step."""
    from omnidraft.core.heap import trim_heap

    gc.collect()
    trim_heap()
    info = libc.mallinfo2()
    return (info.uordblks + info.hblkhd) / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--lengths", type=int, default=12, help="new reply lengths per setting")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=str, default=None)
    args = parser.parse_args(argv)
    if not sys.platform.startswith("linux"):
        raise SystemExit("this measures glibc's heap (Linux only)")
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    os.environ["OMNIDRAFT_HOME"] = tempfile.mkdtemp(prefix="omnidraft-shapes-")
    torch.set_num_threads(args.threads)
    from omnidraft.core.decoding.sampling import GenerationConfig
    from omnidraft.core.engine import Engine
    from omnidraft.core.learning import learner as learner_module

    engine = Engine()
    engine.load_target(args.target)
    for _ in engine.chat([{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
                         GenerationConfig(max_new_tokens=160)):
        pass
    learner = engine.learner()
    model = engine.adapters.activate(engine.target.entry.id)
    sample = engine.buffer.samples()[0]
    reply = len(sample.drafter_ids) - sample.drafter_prompt_len
    params = list(engine.adapters.parameters(engine.target.entry.id))

    def train_on(cut: int) -> None:
        s = dataclasses.replace(sample, drafter_ids=sample.drafter_ids[:sample.drafter_prompt_len + cut])
        loss, _ = learner.sample_loss(model, s)
        loss.backward()
        for p in params:
            p.grad = None

    results = {}
    # Lengths neither setting has met: padding off first, then on (its shapes are
    # padded, so the same cuts are new to it too only as far as their steps are).
    cuts = iter(range(8, reply + 1, max(1, (reply - 8) // (2 * args.lengths + 1))))
    for name, step in (("unpadded", 1), ("padded", learner_module.SHAPE_STEP)):
        learner_module.SHAPE_STEP = step
        chosen = [next(cuts) for _ in range(args.lengths)]
        train_on(chosen[0])
        before, start = in_use_mib(libc), time.perf_counter()
        for cut in chosen[1:]:
            train_on(cut)
        seconds = (time.perf_counter() - start) / (len(chosen) - 1)
        after = in_use_mib(libc)
        results[name] = {"shape_step": step, "reply_lengths": chosen, "in_use_mib_before": round(before, 1),
                         "in_use_mib_after": round(after, 1),
                         "mib_per_new_length": round((after - before) / (len(chosen) - 1), 2),
                         "seconds_per_sample": round(seconds, 2)}
        print(f"{name}: malloc in use {before:.0f} -> {after:.0f} MiB over {len(chosen) - 1} new reply "
              f"lengths ({results[name]['mib_per_new_length']} MiB each), {seconds:.2f} s per sample", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
