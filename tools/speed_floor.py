"""How fast can a target decode here? Memory bandwidth, the floor it sets, and
what each CPU matmul kernel costs for the row counts speculative decoding uses.

Decoding streams every weight once per forward, so bytes per forward over the
bandwidth is a floor no kernel beats. Verification of k drafted tokens is a
forward over k+1 rows: speculation pays only where that costs about one row.

    .venv/bin/python -m omnidraft.tools.speed_floor --target qwen2.5-coder-1.5b-instruct \
        --json speed-floor.json

Prints and writes: bandwidth (GB/s, a bf16 GEMV and a plain sum), the target's
weight bytes in its file and in bf16 and the floor each gives (ms per forward),
and per kernel the ms per 1/2/3/5/8 rows on one 220 MB-of-bf16 weight
(71680 x 1536, Qwen2.5-1.5B's width).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from .common import output_file, positive_int, tool_parser, write_json

ROWS = (1, 2, 3, 5, 8)
N, K = 71_680, 1_536  # 110 M weights: 220 MB in bf16


def best_ms(fn, repeat: int = 12) -> float:
    fn()  # first call: allocations, packing caches
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3  # the least disturbed run: the machine is shared


def bandwidth() -> dict:
    big = torch.ones(2**30 // 4, dtype=torch.float32)  # 1 GiB
    sum_ms = best_ms(lambda: big.sum(), repeat=5)
    w = torch.randn(N, K, dtype=torch.bfloat16)
    x = torch.randn(1, K, dtype=torch.bfloat16)
    gemv_ms = best_ms(lambda: F.linear(x, w))
    return {
        "sum_1GiB_GBps": 2**30 / (sum_ms / 1e3) / 1e9,
        "bf16_gemv_220MB_GBps": w.numel() * 2 / (gemv_ms / 1e3) / 1e9,
    }


def int4_pack(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit per group of `group` inputs, in the layout aten's CPU int4 kernel takes."""
    g = w.float().reshape(w.shape[0], -1, group)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp(min=1e-6)
    zero = lo + 8 * scale  # the kernel computes (q - 8) * scale + zero
    q = ((g - lo) / scale).round().clamp(0, 15).to(torch.int32).reshape(w.shape)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    sz = torch.stack([scale.squeeze(-1), zero.squeeze(-1)], -1).transpose(0, 1).contiguous()
    return packed, sz.to(torch.bfloat16)


def kernels() -> dict:
    torch.manual_seed(0)
    w = torch.randn(N, K, dtype=torch.bfloat16) * 0.02
    out: dict[str, dict[int, float]] = {}
    xs = {m: torch.randn(m, K, dtype=torch.bfloat16) for m in ROWS}
    out["bf16 F.linear"] = {m: best_ms(lambda m=m: F.linear(xs[m], w)) for m in ROWS}
    w8 = (w.float() / (w.float().abs().amax(1, keepdim=True) / 127)).round().to(torch.int8)
    s8 = (w.float().abs().amax(1) / 127).to(torch.bfloat16)
    out["int8 weight-only (_weight_int8pack_mm)"] = {
        m: best_ms(lambda m=m: torch.ops.aten._weight_int8pack_mm(xs[m], w8, s8)) for m in ROWS
    }
    for group in (32, 64):
        packed, sz = int4_pack(w, group)
        # The layout is easy to get wrong silently: check against a plain dequantized matmul.
        got = torch.ops.aten._weight_int4pack_mm_for_cpu(xs[2], packed, group, sz).float()
        g = w.float().reshape(N, -1, group)
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        step = ((hi - lo) / 15).clamp(min=1e-6)
        ref = F.linear(xs[2].float(), (((g - lo) / step).round().clamp(0, 15) * step + lo).reshape(N, K))
        err = float((got - ref).abs().max() / ref.abs().max())
        if err > 0.02:
            raise SystemExit(f"int4 group {group}: kernel disagrees with its reference (rel. error {err:.3f})")
        out[f"int4 weight-only, group {group} (_weight_int4pack_mm_for_cpu)"] = {
            m: best_ms(lambda m=m, p=packed, g=group, z=sz: torch.ops.aten._weight_int4pack_mm_for_cpu(xs[m], p, g, z))
            for m in ROWS
        }
    lin = torch.nn.Linear(K, N, bias=False)
    lin.weight.data = w.float()
    dyn = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, torch.qint8)
    xf = {m: x.float() for m, x in xs.items()}
    out["dynamic int8 (quantize_dynamic)"] = {m: best_ms(lambda m=m: dyn(xf[m])) for m in ROWS}
    return out


def target_bytes(target: str) -> dict:
    from omnidraft.core.models.catalog import ModelCatalog
    from omnidraft.core.models.loader import source_path

    entry = ModelCatalog().get(target)
    path = source_path(entry)
    from gguf import GGUFReader

    reader = GGUFReader(str(path), "r")
    params = sum(int(t.n_elements) for t in reader.tensors)
    return {"file": str(path), "file_bytes": path.stat().st_size, "params": params, "bf16_bytes": params * 2}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = tool_parser(__file__, __doc__)
    ap.add_argument("--target", help="a catalog id or GGUF path: print its floor")
    ap.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--json", type=output_file, help="write the report here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    report: dict = {"torch_threads": torch.get_num_threads(), "bandwidth": bandwidth()}
    gbps = report["bandwidth"]["bf16_gemv_220MB_GBps"]
    print(f"bandwidth: {gbps:.1f} GB/s (bf16 GEMV), {report['bandwidth']['sum_1GiB_GBps']:.1f} GB/s (sum)")
    if args.target:
        t = target_bytes(args.target)
        t["floor_ms_file_format"] = t["file_bytes"] / gbps / 1e6
        t["floor_ms_bf16"] = t["bf16_bytes"] / gbps / 1e6
        report["target"] = t
        print(f"{args.target}: {t['file_bytes'] / 1e9:.2f} GB as stored -> floor "
              f"{t['floor_ms_file_format']:.0f} ms per forward; {t['bf16_bytes'] / 1e9:.2f} GB "
              f"in bf16 -> {t['floor_ms_bf16']:.0f} ms")
    report["kernels_ms"] = kernels()
    print(f"{'kernel (220 MB of bf16 weight)':<60} " + " ".join(f"{m:>6} rows" for m in ROWS))
    for name, by_rows in report["kernels_ms"].items():
        print(f"{name:<60} " + " ".join(f"{by_rows[m]:>8.1f} ms"[-11:] for m in ROWS))
    write_json(args.json, report, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
