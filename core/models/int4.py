"""4-bit target weights: a GGUF model's 4-bit tensors kept at 4 bits, through a
kernel whose cost stays near one token's for the k+1 rows a verification feeds it.

Why a kernel of our own (int4_gemm.c): the bytes a forward streams decide the
speed of decoding here, and the int8 target streams 1.5 GB per forward for
Qwen2.5-Coder-1.5B against ~1 GB in llama.cpp's Q4_K_M. torch 2.13's int4 kernel
(`_weight_int4pack_mm_for_cpu`) triples from 1 to 5 rows, and torchao's PyPI
wheel ships no x86 CPU kernels (0.18: CUDA ones only), so no library gives a 4-bit
product flat in the rows on this CPU (docs/speed.md has the figures).

The kernel is plain C (no torch headers: it builds in about a second), compiled
on first use with the system's C compiler into the cache folder and loaded with
ctypes (which releases the GIL during the call). It links the OpenMP runtime
torch already loaded, so its threads are torch's. It is written for AVX-512
with VNNI and for AVX2 (with FMA and F16C, as most desktop CPUs have; ISAS),
built for the best the CPU runs; without either or a compiler, targets keep int8
weights (core/models/quantize.py) and model info says why.

Which tensors: a target's layers its GGUF file stores as Q4_K, read from the
file and checked against the loaded weight (read_q4_k, matches); anything else
(Q6_K and Q8 tensors, float models) stays int8, so 4 bits never costs a target
accuracy the file did not already have. The drafter's projections are rounded
to 4 bits (fit), where only acceptance depends on the rounding.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from ..storage.paths import cache_dir

GROUP = 32  # inputs per (scale, offset)
CHANNELS = 16  # output channels per block
BLOCK_BYTES = 320  # 16 x 32 nibbles + 16 fp16 scales + 16 fp16 offsets
# The 4-bit product, and the drafter's whole decoder stack built on it.
_SOURCES = [Path(__file__).with_name(name) for name in ("int4_gemm.c", "decoder_stack.c")]
_FLAGS = ["-O3", "-fopenmp", "-shared", "-fPIC"]
# The instruction sets the kernels are written for, best first (the C sources
# branch on them): AVX-512 with VNNI (one VPDPBUSD per 64 products), or AVX2 with
# FMA and F16C, which most desktop CPUs have (VPMADDUBSW; same results, more
# instructions). Name -> (the CPU flags it needs, compiler flags).
ISAS = {
    "avx512vnni": (("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "fma", "f16c"),
                   ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma"]),
    "avx2": (("avx2", "fma", "f16c"), ["-mavx2", "-mfma", "-mf16c"]),
}


class KernelUnavailable(RuntimeError):
    """Why 4-bit weights cannot be used on this machine (a sentence for model info)."""


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def runnable_isas() -> list[str]:
    """The kernels' instruction sets this CPU runs, best first."""
    return [name for name, (needs, _) in ISAS.items() if _cpu_flags().issuperset(needs)]


def _best_isa() -> str | None:
    return next(iter(runnable_isas()), None)


@functools.cache
def _library(isa: str | None = None) -> ctypes.CDLL | KernelUnavailable:
    """The kernels built for `isa` (default: the best this CPU runs)."""
    if not sys.platform.startswith("linux"):
        return KernelUnavailable("the 4-bit kernel is built for Linux only")
    isa = isa or _best_isa()
    if isa is None:
        return KernelUnavailable("this CPU has neither AVX2 (with FMA and F16C) nor AVX-512 VNNI")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return KernelUnavailable("no C compiler to build the 4-bit kernel (install gcc)")
    flags = [*_FLAGS, *ISAS[isa][1]]
    source = b"".join(path.read_bytes() for path in _SOURCES)
    tag = hashlib.sha256(source + " ".join(flags).encode()).hexdigest()[:16]
    built = cache_dir() / "kernels" / f"int4_gemm-{isa}-{tag}.so"
    if not built.exists():
        built.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=built.parent) as tmp:
            out = Path(tmp) / built.name
            done = subprocess.run([compiler, *flags, *map(str, _SOURCES), "-o", str(out), "-lm"],
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                return KernelUnavailable(f"the 4-bit kernel did not build: {done.stderr.strip()[-300:]}")
            out.replace(built)  # atomic: a second process never loads half a file
    lib = ctypes.CDLL(str(built))
    lib.q4_gemm.restype = ctypes.c_int
    lib.q4_gemm.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                            ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    lib.decoder_stack.restype = ctypes.c_int
    lib.decoder_stack.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                  ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                  ctypes.c_void_p, *[ctypes.c_int64] * 5, ctypes.c_float, ctypes.c_int]
    return lib


def kernel_isa() -> str | None:
    """The instruction set the kernels run with here (None: they cannot run)."""
    return _best_isa() if unavailable() is None else None


def unavailable() -> str | None:
    """Why the 4-bit kernel cannot run here (None: it can)."""
    lib = _library()
    return str(lib) if isinstance(lib, KernelUnavailable) else None


Q4_K = 12  # gguf.GGMLQuantizationType.Q4_K
_Q4_K_BLOCK = 144  # bytes per 256 weights: d, dmin (fp16), 12 bytes of 6-bit scales/mins, 128 of nibbles
# Module names of a Llama-family decoder layer and their GGUF tensor names.
GGUF_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
              "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def gguf_name(module_name: str) -> str | None:
    """model.layers.3.mlp.down_proj -> blk.3.ffn_down.weight (None: not a layer projection)."""
    parts = module_name.split(".")
    if len(parts) < 4 or parts[-4] != "layers" or parts[-1] not in GGUF_NAMES:
        return None
    return f"blk.{parts[-3]}.{GGUF_NAMES[parts[-1]]}.weight"


def read_q4_k(buffer, offset: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_K tensor [n, k] from a GGUF file's bytes as (q uint8 0..15, scale fp16,
    offset fp16) per group of 32, w = scale * q + offset. Q4_K holds per 256 weights
    d and dmin and, per 32, 6-bit sc and m: w = d*sc*q - dmin*m (llama.cpp's
    ggml-quants.c; gguf.quants.Q4_K reads it the same way). The group scales are
    rounded to fp16 (2^-11 relative), finer than the bf16 copy transformers loads."""
    import numpy as np
    from gguf.quants import Q4_K as GGUF_Q4_K

    blocks = np.frombuffer(buffer, dtype=np.uint8, count=n * k // 256 * _Q4_K_BLOCK, offset=offset)
    blocks = blocks.reshape(-1, _Q4_K_BLOCK)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, m = GGUF_Q4_K.get_scale_min(blocks[:, 4:16].copy())
    scale = d * sc.astype(np.float32)  # [blocks, 8]
    shift = -dmin * m.astype(np.float32)
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (qs & np.uint8(0x0F)).reshape(n, k)
    return (torch.from_numpy(q.copy()), torch.from_numpy(scale.reshape(n, -1)).half(),
            torch.from_numpy(shift.reshape(n, -1)).half())


def fit(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Any weight rounded onto a 4-bit grid per group of 32 inputs (from its least to
    its largest value): the drafter's form, where only acceptance depends on the
    rounding. None when the shape does not fit the kernel."""
    n, k = weight.shape
    if n % CHANNELS or k % GROUP:
        return None
    w = weight.detach().float().view(n, k // GROUP, GROUP)
    lo, hi = w.amin(-1), w.amax(-1)
    scale, offset = ((hi - lo) / 15).half(), lo.half()
    q = ((w - offset.float()[..., None]) / scale.float().clamp(min=1e-8)[..., None]).round().clamp(0, 15)
    return q.to(torch.uint8).view(n, k), scale, offset


def matches(weight: torch.Tensor, quantized: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> bool:
    """Whether the 4-bit tensor is the loaded weight (up to the bf16 rounding of the
    loaded copy): a reader that finds a tensor stored in another order (a loader
    that permutes it, another architecture's layout) falls back to int8."""
    if tuple(weight.shape) != tuple(quantized[0].shape):
        return False
    rows = slice(0, 64)  # enough to tell a permuted tensor; the whole one costs seconds
    w = weight[rows].detach().float()
    error = (dequantize(*(t[rows] for t in quantized)) - w).abs()
    return bool((error <= w.abs() * 2.0**-7 + quantized[1][rows].float().repeat_interleave(GROUP, 1) * 0.02).all())


def pack(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """The kernel's block layout (see int4_gemm.c) as one uint8 tensor."""
    n, k = q.shape
    cols, groups = n // CHANNELS, k // GROUP
    # [col, j, g, (h, t, b)] -> [col, g, t, j, b, h]: input 16h + 4t + b of channel j
    nib = q.view(cols, CHANNELS, groups, 2, 4, 4).permute(0, 2, 4, 1, 5, 3)
    nib = (nib[..., 0] | (nib[..., 1] << 4)).reshape(cols, groups, 256)

    def per_block(t: torch.Tensor) -> torch.Tensor:
        return t.view(cols, CHANNELS, groups).transpose(1, 2).contiguous().view(torch.uint8)

    return torch.cat([nib, per_block(scale), per_block(offset)], dim=-1).contiguous()


def dequantize(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """The float weight the 4-bit one stands for (tests and the reference path)."""
    n, k = q.shape
    w = q.float().view(n, k // GROUP, GROUP) * scale.float()[..., None] + offset.float()[..., None]
    return w.view(n, k)


def q4_mm(rows: torch.Tensor, packed: torch.Tensor, out_features: int, isa: str | None = None) -> torch.Tensor:
    """rows [m, k] @ W^T in float32, each row quantized to int8 on its own scale
    (isa: the kernel build to use, default the best this CPU runs)."""
    lib = _library(isa)
    if isinstance(lib, KernelUnavailable):
        raise lib
    x = rows.float().contiguous()
    m, k = x.shape
    y = torch.empty(m, out_features, dtype=torch.float32)
    if lib.q4_gemm(x.data_ptr(), m, k, packed.data_ptr(), out_features, y.data_ptr(), torch.get_num_threads()):
        raise MemoryError("out of memory in the 4-bit kernel")
    return y


class Int4Linear(torch.nn.Module):
    """y = x W^T + b with W stored in 4 bits (see the module docstring)."""

    def __init__(self, linear: torch.nn.Linear, quantized: tuple[torch.Tensor, torch.Tensor, torch.Tensor]):
        super().__init__()
        self._packed = pack(*quantized)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_count = linear.weight.numel()
        self.streamed = self._packed.numel()  # bytes one product reads
        bias = linear.bias
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = q4_mm(x.reshape(-1, self.in_features), self._packed, self.out_features)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4"


def join(layers: list[Int4Linear]):
    """One product for several 4-bit layers of the same input (a target's q/k/v,
    its gate/up): their packed weights laid end to end, each layer keeping a view
    of its part, so no second copy exists. Output channels are computed
    independently from the same int8 rows, so each part of the result is, bit for
    bit, what its layer computes alone; one call instead of several saves the
    activations' quantization and a kernel launch per layer."""
    packed = torch.cat([layer._packed for layer in layers])
    start = 0
    for layer in layers:
        rows = layer._packed.shape[0]
        layer._packed = packed[start : start + rows]
        start += rows
    width, out = layers[0].in_features, sum(layer.out_features for layer in layers)
    biases = [layer.bias for layer in layers]
    bias = None if all(b is None for b in biases) else torch.cat(
        [b.detach() if b is not None else torch.zeros(layer.out_features) for b, layer in zip(biases, layers)])

    def project(x: torch.Tensor) -> torch.Tensor:
        y = q4_mm(x.reshape(-1, width), packed, out)
        return y if bias is None else y + bias

    return project


class _Projection(ctypes.Structure):
    _fields_ = [("packed", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("out", ctypes.c_int64),
                ("lora_a", ctypes.c_void_p), ("lora_b", ctypes.c_void_p), ("part_end", ctypes.c_void_p),
                ("parts", ctypes.c_int64), ("rank", ctypes.c_int64)]


class _Layer(ctypes.Structure):
    _fields_ = [("norm1", ctypes.c_void_p), ("norm2", ctypes.c_void_p), ("qkv", _Projection),
                ("o", _Projection), ("gate_up", _Projection), ("down", _Projection)]


class DecoderStack:
    """A Llama-family decoder stack whose projections are all 4-bit, run as one
    kernel call (decoder_stack.c): the drafter's forward without torch's per-op
    overhead. layers: per layer (norm1, qkv, o, norm2, gate_up, down), each
    projection with .packed4 (pack's layout), .bias (or None), .out_features and
    .low_rank (None, or a learned adapter beside the weight: a [parts*r, in],
    b^T [r, out], both fp16, each part's end among the outputs)."""

    def __init__(self, layers: list[tuple], n_heads: int, n_kv: int, head_dim: int, eps: float):
        self.n_heads, self.n_kv, self.head_dim, self.eps = n_heads, n_kv, head_dim, eps
        self._keep = []  # the tensors the structs point into

        def ptr(t: torch.Tensor | None) -> int | None:
            if t is None:
                return None
            t = t.detach().contiguous()
            self._keep.append(t)
            return t.data_ptr()

        def projection(p) -> _Projection:
            bias = None if p.bias is None else p.bias.float()
            if p.low_rank is None:
                return _Projection(ptr(p.packed4), ptr(bias), p.out_features)
            a, b, ends = p.low_rank
            return _Projection(ptr(p.packed4), ptr(bias), p.out_features, ptr(a), ptr(b),
                               ptr(ends.to(torch.int64)), len(ends), b.shape[0])

        self._layers = (_Layer * len(layers))(*[
            _Layer(ptr(n1.float()), ptr(n2.float()), projection(qkv), projection(o), projection(gu), projection(down))
            for n1, qkv, o, n2, gu, down in layers])
        self.hidden = layers[0][0].numel()
        self.inter = layers[0][4].out_features // 2

    def __call__(self, x: torch.Tensor, start: int, kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """x [n, hidden] float32 (the embeddings of positions start..) becomes, in
        place, the last layer's residual stream; the new keys and values go into
        kv [layers, 2, kv heads, capacity, head_dim] (float32, contiguous)."""
        lib = _library()
        if isinstance(lib, KernelUnavailable):
            raise lib
        # The kernel reads raw float32 memory: anything else would be read as garbage.
        if not all(t.dtype == torch.float32 and t.is_contiguous() for t in (x, kv, cos, sin)):
            raise TypeError("the decoder stack takes contiguous float32 tensors")
        if cos.shape[0] < kv.shape[3] or x.shape[1] != self.hidden:
            raise ValueError("the decoder stack got tensors of the wrong shape")
        if lib.decoder_stack(x.data_ptr(), x.shape[0], start, self._layers, len(self._layers), kv.data_ptr(),
                             kv.shape[3], cos.data_ptr(), sin.data_ptr(), self.hidden, self.n_heads, self.n_kv,
                             self.head_dim, self.inter, self.eps, torch.get_num_threads()):
            raise MemoryError("out of memory in the 4-bit decoder stack")
