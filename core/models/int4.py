"""4-bit (and 6-bit and 8-bit) target weights: a GGUF model's K-quant tensors kept as
the file holds them, through kernels whose cost stays near one token's for the
k+1 rows a verification feeds them.

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
built for the best the CPU runs and the compiler builds; without either or a
compiler, targets keep int8 weights (core/models/quantize.py) and model info
says why. Where the CPU has AMX (Xeons since Sapphire Rapids, Xeon W
workstations), a product of amx_rows() rows or more (a prompt's prefill) runs
on its bf16 tiles, ~2-3x the integer kernel's rate there (docs/speed.md).
Where it has AVX512-BF16 (Zen 4 and later, Cooper Lake, AMX Xeons), attention's
multiply-adds run in bf16 (avx512bf16, amx; docs/speed.md, "Attention in bf16").
OMNIDRAFT_KERNEL_ISA=avx512vnni (or avx2) picks a build by name.

Which tensors: a target's layers its GGUF file stores as Q4_K or Q6_K, read
from the file and checked against the loaded weight (read_q4_k, read_q6_k,
matches), and for a Llama or Qwen2 model its Q5_0 and Q8_0 ones too (read_q5_0:
5 bits sit exactly on the 6-bit grid; read_q8_0), so a Q5_0 file's layers run
as one call (Qwen2.5-Coder-0.5B: docs/speed.md); anything else (float models,
other formats) stays int8, so these formats never cost a target accuracy the
file did not already have. Q6_K
tensors (half the layers' v and down projections and the LM head of a Q4_K_M
file) take the 6-bit kernel, so a Q4_K_M target's decoder stack runs as one
kernel call as the drafter's does (DecoderStack) instead of torch ops between
products (~21 ms a token on an AVX2 CPU, docs/speed.md). The drafter's projections are rounded
to 4 bits (fit), where only acceptance depends on the rounding.

Each form (Q4: Q4_1's scale and offset per 32, fit's; Q4K; Q6; Q8) packs itself into
its kernel layout and names it by its GGML type (kind). Q4_K keeps the file's
superblocks (fp16 d and dmin per 256 inputs, 6-bit sc and m per 32) rather than
an fp16 scale per group: exact, 7.5% fewer bytes, one float step per 256 inputs
instead of per 32 in the kernel (docs/speed.md).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch

from ..storage.paths import cache_dir

GROUP = 32  # inputs per 4-bit sub-scale and min
SUPER = 256  # inputs per superblock: one fp16 d and dmin (a Q4_K block)
CHANNELS = 16  # output channels per block
Q6_PART = 16  # inputs per 6-bit scale
# The 4-bit product, and the drafter's whole decoder stack built on it; the header
# they share counts toward the build's tag.
_SOURCES = [Path(__file__).with_name(name) for name in ("int4_gemm.c", "decoder_stack.c")]
_STACK_ARGS = 19  # decoder_stack's, the attention window last
_HEADERS = [Path(__file__).with_name("int4_gemm.h")]
_FLAGS = ["-O3", "-fopenmp", "-shared", "-fPIC"]
# The instruction sets the kernels are written for, best first (the C sources
# branch on them): AVX-512 with VNNI (one VPDPBUSD per 64 products), or AVX2 with
# FMA and F16C, which most desktop CPUs have (VPMADDUBSW; same results, more
# instructions). Name -> (the CPU flags it needs, compiler flags).
ISAS = {
    # AVX-512 VNNI plus AMX's bf16 tiles for products of many rows (a prompt's
    # prefill): the few-row products are the same integer code as avx512vnni's.
    "amx": (("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "fma", "f16c", "avx512_bf16", "amx_tile",
             "amx_bf16"),
            ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma", "-mavx512bf16",
             "-mamx-tile", "-mamx-bf16"]),
    # avx512vnni's products with attention's multiply-adds in bf16 (decoder_stack.c,
    # ATT_BF16): AMD's Zen 4 and later, Intel's Cooper Lake (AMX CPUs have it too).
    "avx512bf16": (("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "fma", "f16c", "avx512_bf16"),
                   ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma", "-mavx512bf16"]),
    "avx512vnni": (("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "fma", "f16c"),
                   ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma"]),
    # AVX2's code with AVX-VNNI's 256-bit VPDPBUSD for its products (Intel's desktop
    # CPUs since Alder Lake, AMD's since Zen 5): a third of AVX2's multiply
    # instructions, where several rows or a prompt make the products compute-bound.
    "avxvnni": (("avx2", "fma", "f16c", "avx_vnni"), ["-mavx2", "-mfma", "-mf16c", "-mavxvnni"]),
    # The same code in AVX-512 VL's encodings (OMNI_YMM, int4_gemm.h): where AVX-512
    # VNNI runs, to test avxvnni's products and time them (never the default there).
    # Vectors of 256 bits, and 16 registers as an AVX-VNNI CPU has: given AVX-512's
    # 32 the compiler spilled half as often as the avxvnni build does.
    "avxvnni-evex": (("avx2", "fma", "f16c", "avx512_vnni", "avx512vl"),
                     ["-mavx2", "-mfma", "-mf16c", "-mavx512vl", "-mavx512vnni", "-DOMNI_YMM",
                      "-mprefer-vector-width=256", "-mmove-max=256", "-mstore-max=256",
                      *[f"-ffixed-xmm{i}" for i in range(16, 32)]]),
    "avx2": (("avx2", "fma", "f16c"), ["-mavx2", "-mfma", "-mf16c"]),
}


class KernelUnavailable(RuntimeError):
    """Why 4-bit weights cannot be used on this machine (a sentence for model info)."""


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def runnable_isas() -> list[str]:
    """The kernels' instruction sets this CPU runs, best first."""
    return [name for name, (needs, _) in ISAS.items() if cpu_flags().issuperset(needs)]


@functools.cache
def _library(isa: str | None = None) -> ctypes.CDLL | KernelUnavailable:
    """The kernels built for `isa` (default: the best this CPU runs that this
    compiler builds: an older gcc has no AMX intrinsics)."""
    if not sys.platform.startswith("linux"):
        return KernelUnavailable("the 4-bit kernel is built for Linux only")
    if isa is None:
        chosen = os.environ.get("OMNIDRAFT_KERNEL_ISA")  # to compare builds, or to step around one
        failed = None  # the best build's reason, if none builds; builds past the first that works are not compiled
        for name in runnable_isas():
            if chosen in (None, name):
                lib = _library(name)
                if not isinstance(lib, KernelUnavailable):
                    return lib
                failed = failed or lib
        if failed:
            return failed
        if chosen and runnable_isas():
            return KernelUnavailable(f"OMNIDRAFT_KERNEL_ISA={chosen} is not a build this CPU runs "
                                     f"({', '.join(runnable_isas())})")
        return KernelUnavailable("this CPU has neither AVX2 (with FMA and F16C) nor AVX-512 VNNI")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return KernelUnavailable("no C compiler to build the 4-bit kernel (install gcc)")
    flags = [*_FLAGS, *ISAS[isa][1]]
    source = b"".join(path.read_bytes() for path in _SOURCES + _HEADERS)
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
    lib = bind(ctypes.CDLL(str(built)))
    lib.isa = isa
    return lib


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """The kernels' entry points typed for ctypes (a build loaded from anywhere:
    tests load an emulated one)."""
    lib.q4_gemm.restype = ctypes.c_int
    lib.q4_gemm.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                            ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    lib.amx_rows.restype = ctypes.c_int
    lib.amx_rows.argtypes = []
    lib.decoder_stack.restype = ctypes.c_int  # _STACK_ARGS arguments
    lib.decoder_stack.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                  ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                  ctypes.c_void_p, *[ctypes.c_int64] * 5, ctypes.c_float, ctypes.c_void_p, ctypes.c_int,
                                  ctypes.c_int64]
    return lib


def kernel_isa() -> str | None:
    """The instruction set the kernels run with here (None: they cannot run)."""
    lib = _library()
    if isinstance(lib, KernelUnavailable):
        return None
    isa = getattr(lib, "isa", None)  # a build loaded from elsewhere (tests) says none
    return "avx512bf16" if isa == "amx" and not lib.amx_rows() else isa  # its build without the tiles


def amx_rows(isa: str | None = None) -> int:
    """Rows from which a product runs on AMX tiles (bf16) here; 0: never."""
    lib = _library(isa)
    return 0 if isinstance(lib, KernelUnavailable) else lib.amx_rows()


def unavailable() -> str | None:
    """Why the 4-bit kernel cannot run here (None: it can)."""
    lib = _library()
    return str(lib) if isinstance(lib, KernelUnavailable) else None


# The kernels' layouts, numbered as gguf.GGMLQuantizationType numbers the
# quantization each holds (int4_gemm.h): Q4_1's form (4 bits in groups of 32 with
# an fp16 scale and offset: fit's, and so the drafter's), Q4_K's, Q6_K's and
# Q8_0's; Q5_0 is a file's type only, read into Q6_K's layout (read_q5_0).
Q4_1 = 3
Q5_0 = 6
Q8_0 = 8
Q4_K = 12
Q6_K = 14
_Q5_0_BLOCK = 22  # bytes per 32 weights: d (fp16), 32 high bits, 16 bytes of low nibbles
_Q8_0_BLOCK = 34  # bytes per 32 weights: d (fp16), 32 int8
_Q4_K_BLOCK = 144  # bytes per 256 weights: d, dmin (fp16), 12 bytes of 6-bit scales/mins, 128 of nibbles
_Q6_K_BLOCK = 210  # bytes per 256 weights: 128 of low nibbles, 64 of high bit pairs, 16 int8 scales, d (fp16)
# Module names of a Llama-family decoder layer and their GGUF tensor names.
GGUF_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
              "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def gguf_name(module_name: str) -> str | None:
    """model.layers.3.mlp.down_proj -> blk.3.ffn_down.weight, lm_head -> output.weight
    (None: neither)."""
    if module_name == "lm_head":
        return "output.weight"
    parts = module_name.split(".")
    if len(parts) < 4 or parts[-4] != "layers" or parts[-1] not in GGUF_NAMES:
        return None
    return f"blk.{parts[-3]}.{GGUF_NAMES[parts[-1]]}.weight"


def read_q4_k(buffer, offset: int, n: int, k: int) -> Q4K:
    """A Q4_K tensor [n, k] from a GGUF file's bytes, exactly (llama.cpp's
    ggml-quants.c; gguf.quants.Q4_K reads it the same way): per 256 weights d and
    dmin, per 32 a 6-bit sc and m, w = d * sc * q - dmin * m."""
    import numpy as np
    from gguf.quants import Q4_K as GGUF_Q4_K

    blocks = np.frombuffer(buffer, dtype=np.uint8, count=n * k // 256 * _Q4_K_BLOCK, offset=offset)
    blocks = blocks.reshape(-1, _Q4_K_BLOCK)
    d = blocks[:, 0:2].copy().view(np.float16)
    dmin = blocks[:, 2:4].copy().view(np.float16)
    sc, m = GGUF_Q4_K.get_scale_min(blocks[:, 4:16].copy())
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (qs & np.uint8(0x0F)).reshape(n, k)
    return Q4K(torch.from_numpy(q.copy()), torch.from_numpy(d.reshape(n, -1).copy()),
              torch.from_numpy(dmin.reshape(n, -1).copy()), torch.from_numpy(sc.reshape(n, -1).astype(np.uint8)),
              torch.from_numpy(m.reshape(n, -1).astype(np.uint8)))


def read_q6_k(buffer, offset: int, n: int, k: int) -> Q6:
    """A Q6_K tensor [n, k] from a GGUF file's bytes (gguf.quants.Q6_K reads it the
    same way): per 256 weights d and, per 16, an int8 sc; w = d * sc * (q - 32).
    d * sc is rounded to fp16 (2^-11 relative, finer than the bf16 copy loaded)."""
    import numpy as np

    blocks = np.frombuffer(buffer, dtype=np.uint8, count=n * k // 256 * _Q6_K_BLOCK, offset=offset)
    blocks = blocks.reshape(-1, _Q6_K_BLOCK)
    low = blocks[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    high = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    q = (low & np.uint8(0x0F)).reshape(-1, 256) | ((high & np.uint8(0x03)).reshape(-1, 256) << np.uint8(4))
    d = blocks[:, 208:210].copy().view(np.float16).astype(np.float32)
    scale = d * blocks[:, 192:208].copy().view(np.int8).astype(np.float32)
    return Q6(torch.from_numpy(q.reshape(n, k).copy()), torch.from_numpy(scale.reshape(n, -1)).half())


def read_q5_0(buffer, offset: int, n: int, k: int) -> Q6:
    """A Q5_0 tensor [n, k] (w = d * (q - 16), q 0..31, d fp16 per 32 inputs) in the
    6-bit form, exactly: q + 16 on Q6_K's grid, d as both of its 16-input scales.
    (A 5-bit layout of its own would stream 21% fewer bytes; this one needs no
    kernel of its own and lets a Q5_0 model's layers run as one call.)"""
    import numpy as np

    blocks = np.frombuffer(buffer, dtype=np.uint8, count=n * k // 32 * _Q5_0_BLOCK, offset=offset)
    blocks = blocks.reshape(-1, _Q5_0_BLOCK)
    d = blocks[:, 0:2].copy().view(np.float16)
    high = blocks[:, 2:6].copy().view(np.uint32) >> np.arange(32, dtype=np.uint32)
    low = blocks[:, 6:].reshape(-1, 1, 16) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)
    q = (low & np.uint8(0x0F)).reshape(-1, 32) | ((high & np.uint32(1)).astype(np.uint8) << np.uint8(4))
    scale = np.repeat(d, 2, axis=1)  # [blocks, 2]: one per 16 inputs
    return Q6(torch.from_numpy((q + np.uint8(16)).reshape(n, k)), torch.from_numpy(scale.reshape(n, -1).copy()))


def read_q8_0(buffer, offset: int, n: int, k: int) -> Q8:
    """A Q8_0 tensor [n, k]: w = d * q, q int8, d fp16 per 32 inputs."""
    import numpy as np

    blocks = np.frombuffer(buffer, dtype=np.uint8, count=n * k // 32 * _Q8_0_BLOCK, offset=offset)
    blocks = blocks.reshape(-1, _Q8_0_BLOCK)
    d = blocks[:, 0:2].copy().view(np.float16)
    q = blocks[:, 2:].copy().view(np.int8)
    return Q8(torch.from_numpy(q.reshape(n, k)), torch.from_numpy(d.reshape(n, -1)))


def fit6(weight: torch.Tensor) -> Q6 | None:
    """Any weight rounded onto the 6-bit grid per 16 inputs (symmetric, as Q6_K):
    tests build 6-bit layers from it. None when the shape does not fit the kernel."""
    n, k = weight.shape
    if n % CHANNELS or k % GROUP:
        return None
    w = weight.detach().float().view(n, k // Q6_PART, Q6_PART)
    scale = (w.abs().amax(-1) / 31).half()
    q = (w / scale.float().clamp(min=1e-8)[..., None]).round().clamp(-32, 31) + 32
    return Q6(q.to(torch.uint8).view(n, k), scale)


def _per_superblock(t: torch.Tensor) -> torch.Tensor:
    """[n, groups] -> [n, superblocks, 8], the last superblock padded with zeros."""
    n, groups = t.shape
    per = SUPER // GROUP
    return torch.nn.functional.pad(t, (0, -groups % per)).view(n, -1, per)


def fit(weight: torch.Tensor) -> Q4 | None:
    """Any weight rounded onto a 4-bit grid per group of 32 inputs (from its least to
    its largest value): the drafter's form, where only acceptance depends on the
    rounding (SmolLM2's file stores its layers so, as Q4_1: read back exactly). None
    when the shape does not fit the kernel."""
    n, k = weight.shape
    if n % CHANNELS or k % GROUP:
        return None
    w = weight.detach().float().view(n, k // GROUP, GROUP)
    lo, hi = w.amin(-1), w.amax(-1)
    scale, offset = ((hi - lo) / 15).half(), lo.half()
    q = ((w - offset.float()[..., None]) / scale.float().clamp(min=1e-8)[..., None]).round().clamp(0, 15)
    return Q4(q.to(torch.uint8).view(n, k), scale, offset)


def fit_q4_k(weight: torch.Tensor) -> Q4K | None:
    """Any weight rounded onto Q4_K's grid, more coarsely than llama.cpp's quantizer
    (tests build Q4_K_M-like targets from it): per group of 32 inputs the range
    from min(least, 0) to the largest value in 15 steps, the steps and the mins
    then rounded up onto their superblock's 6-bit grids (up, so the group's range
    stays covered). None when the shape does not fit the kernel."""
    n, k = weight.shape
    if n % CHANNELS or k % GROUP:
        return None
    groups = k // GROUP
    w = weight.detach().float().view(n, groups, GROUP)
    lo, hi = w.amin(-1).clamp(max=0), w.amax(-1)

    def six_bit(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """values [n, groups] >= 0 as (unit fp16 [n, superblocks], 0..63 [n, groups])."""
        per = _per_superblock(values)
        unit = (per.amax(-1) / 63).half()
        steps = (per / unit.float().clamp(min=1e-30)[..., None]).ceil().clamp(0, 63)
        return unit, steps.view(n, -1)[:, :groups].to(torch.uint8)

    dmin, m = six_bit(-lo)
    offset = -_per_group(dmin, groups) * m
    d, sc = six_bit((hi - offset) / 15)
    scale = _per_group(d, groups) * sc
    q = ((w - offset[..., None]) / scale.clamp(min=1e-30)[..., None]).round().clamp(0, 15)
    return Q4K(q.to(torch.uint8).view(n, k), d, dmin, sc, m)


def matches(weight: torch.Tensor, quantized: Q4 | Q4K | Q6 | Q8) -> bool:
    """Whether the 4-, 6- or 8-bit tensor is the loaded weight (up to the bf16
    rounding of the loaded copy): a reader that finds a tensor stored in another
    order (a loader that permutes it, another architecture's layout) falls back to
    int8."""
    if tuple(weight.shape) != tuple(quantized.q.shape):
        return False
    rows = slice(0, 64)  # enough to tell a permuted tensor; the whole one costs seconds
    w = weight[rows].detach().float()
    part = type(quantized)(*(t[rows] for t in quantized))
    error = (part.weight() - w).abs()
    return bool((error <= w.abs() * 2.0**-7 + part.steps() * 0.02).all())


def _nibbles(q: torch.Tensor) -> torch.Tensor:
    """The low nibbles of q [n, k] in the kernels' layout: [n/16, k/32, 256]."""
    n, k = q.shape
    cols, groups = n // CHANNELS, k // GROUP
    # [col, j, g, (h, t, b)] -> [col, g, t, j, b, h]: input 16h + 4t + b of channel j
    nib = (q & 0x0F).view(cols, CHANNELS, groups, 2, 4, 4).permute(0, 2, 4, 1, 5, 3)
    return (nib[..., 0] | (nib[..., 1] << 4)).reshape(cols, groups, 256)


def _per_block(t: torch.Tensor) -> torch.Tensor:
    """[n, x] values -> [n/16, x, the 16 channels' bytes]: a block's values side by side."""
    return t.view(t.shape[0] // CHANNELS, CHANNELS, -1).transpose(1, 2).contiguous().view(torch.uint8)


def _per_group(values: torch.Tensor, groups: int) -> torch.Tensor:
    """Per-superblock values [n, superblocks] as float32 per group [n, groups]."""
    return values.float().repeat_interleave(SUPER // GROUP, 1)[:, :groups]


class Q4(NamedTuple):
    """4 bits a weight in groups of 32 inputs, w = scale * q + offset, q uint8 0..15,
    scale and offset fp16 [n, k/32] (Q4_1's form: fit's)."""

    q: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    kind = Q4_1
    bits = 4

    def packed(self) -> torch.Tensor:
        """The kernel's layout (int4_gemm.c): blocks of 16 channels x 32 inputs."""
        return torch.cat([_nibbles(self.q), _per_block(self.scale), _per_block(self.offset)], dim=-1).contiguous()

    def weight(self) -> torch.Tensor:
        """The float weight it stands for (tests and the reference path)."""
        n, k = self.q.shape
        w = self.q.float().view(n, k // GROUP, GROUP) * self.scale.float()[..., None] + self.offset.float()[..., None]
        return w.view(n, k)

    def steps(self) -> torch.Tensor:
        """The grid's step at each weight [n, k]."""
        return self.scale.float().abs().repeat_interleave(GROUP, 1)


class Q4K(NamedTuple):
    """A 4-bit tensor as a Q4_K tensor holds it: per group of 32 inputs
    w = d * sc * q - dmin * m, q uint8 0..15, sc and m uint8 0..63 [n, k/32], d and
    dmin fp16 per superblock of 256 inputs [n, ceil(k/256)] (a row's last
    superblock is shorter where k is not a multiple of 256)."""

    q: torch.Tensor
    d: torch.Tensor
    dmin: torch.Tensor
    sc: torch.Tensor
    m: torch.Tensor
    kind = Q4_K
    bits = 4

    def packed(self) -> torch.Tensor:
        """The kernel's layout (int4_gemm.c): per 16 channels, superblock after
        superblock, its d and dmin, then per group the nibbles, sc and m."""
        cols, per = self.q.shape[0] // CHANNELS, SUPER // GROUP
        heads = torch.cat([_per_block(self.d), _per_block(self.dmin)], dim=-1)  # [cols, superblocks, 64]
        body = torch.cat([_nibbles(self.q), _per_block(self.sc), _per_block(self.m)], dim=-1)  # [cols, groups, 288]
        parts = []
        for s in range(heads.shape[1]):
            parts += [heads[:, s], body[:, s * per : (s + 1) * per].reshape(cols, -1)]
        return torch.cat(parts, dim=-1).contiguous()

    def group_scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each group's (scale, offset) [n, k/32] in float32: w = scale * q + offset."""
        groups = self.sc.shape[1]
        return _per_group(self.d, groups) * self.sc.float(), -_per_group(self.dmin, groups) * self.m.float()

    def weight(self) -> torch.Tensor:
        n, k = self.q.shape
        scale, offset = self.group_scales()
        return (self.q.float().view(n, k // GROUP, GROUP) * scale[..., None] + offset[..., None]).view(n, k)

    def steps(self) -> torch.Tensor:
        return self.group_scales()[0].abs().repeat_interleave(GROUP, 1)


class Q6(NamedTuple):
    """A 6-bit tensor [n, k] as a Q6_K tensor holds it: w = scale * (q - 32), q uint8
    0..63, scale fp16 per 16 inputs."""

    q: torch.Tensor
    scale: torch.Tensor
    kind = Q6_K
    bits = 6

    def packed(self) -> torch.Tensor:
        """The kernel's layout (int4_gemm.c): blocks of 16 channels x 32 inputs."""
        n, k = self.q.shape
        cols, groups = n // CHANNELS, k // GROUP
        # high bit pairs: [col, (h, jj), g, (s, f, b)] -> [col, g, s, h, jj, b, f]
        high = (self.q >> 4).view(cols, 2, 8, groups, 2, 4, 4).permute(0, 3, 4, 1, 2, 6, 5)
        high = (high[..., 0] | (high[..., 1] << 2) | (high[..., 2] << 4) | (high[..., 3] << 6)).reshape(
            cols, groups, 128)
        scales = self.scale.view(cols, CHANNELS, groups, 2).permute(0, 2, 3, 1).contiguous().view(torch.uint8)
        return torch.cat([_nibbles(self.q), high, scales.reshape(cols, groups, 64)], dim=-1).contiguous()

    def weight(self) -> torch.Tensor:
        n, k = self.q.shape
        return ((self.q.float() - 32).view(n, k // Q6_PART, Q6_PART) * self.scale.float()[..., None]).view(n, k)

    def steps(self) -> torch.Tensor:
        return self.scale.float().abs().repeat_interleave(Q6_PART, 1)


class Q8(NamedTuple):
    """An 8-bit tensor as a Q8_0 tensor holds it: w = scale * q, q int8, scale fp16
    per 32 inputs."""

    q: torch.Tensor
    scale: torch.Tensor
    kind = Q8_0
    bits = 8

    def packed(self) -> torch.Tensor:
        """The kernel's layout (int4_gemm.c): per 16 channels and 32 inputs, q + 128
        as unsigned bytes in the nibbles' order, then the 16 scales."""
        n, k = self.q.shape
        cols, groups = n // CHANNELS, k // GROUP
        # [col, j, g, (t, b)] -> [col, g, t, j, b]: input 4t + b of channel j
        u = (self.q.to(torch.int16) + 128).to(torch.uint8).view(cols, CHANNELS, groups, 8, 4)
        return torch.cat([u.permute(0, 2, 3, 1, 4).reshape(cols, groups, 512), _per_block(self.scale)],
                         dim=-1).contiguous()

    def weight(self) -> torch.Tensor:
        n, k = self.q.shape
        return (self.q.float().view(n, k // GROUP, GROUP) * self.scale.float()[..., None]).view(n, k)

    def steps(self) -> torch.Tensor:
        return self.scale.float().abs().repeat_interleave(GROUP, 1)


def q4_mm(rows: torch.Tensor, packed: torch.Tensor, out_features: int, kind: int,
          isa: str | None = None) -> torch.Tensor:
    """rows [m, k] @ W^T in float32, each row quantized to int8 on its own scale;
    W packed in layout `kind` (Q4_1, Q4_K, Q6_K or Q8_0: the form's .kind). isa: the
    kernel build to use, default the best this CPU runs."""
    lib = _library(isa)
    if isinstance(lib, KernelUnavailable):
        raise lib
    x = rows.float().contiguous()
    m, k = x.shape
    y = torch.empty(m, out_features, dtype=torch.float32)
    if lib.q4_gemm(kind, x.data_ptr(), m, k, packed.data_ptr(), out_features, y.data_ptr(), out_features,
                   torch.get_num_threads()):
        raise MemoryError("out of memory in the 4-bit kernel")
    return y


class Int4Linear(torch.nn.Module):
    """y = x W^T + b with W stored in 4 bits (see the module docstring)."""

    bits = 4

    def __init__(self, linear: torch.nn.Linear, quantized: Q4 | Q4K | Q6 | Q8):
        super().__init__()
        self._packed, self.kind = quantized.packed(), quantized.kind
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_count = linear.weight.numel()
        self.streamed = self._packed.numel()  # bytes one product reads
        bias = linear.bias
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().float(), requires_grad=False)

    @property
    def kernel_weights(self) -> tuple[torch.Tensor, int]:
        """(packed weights, layout): what DecoderStack runs."""
        return self._packed, self.kind

    def place(self, packed: torch.Tensor) -> None:
        """Run from packed, a copy of the weights (huge_pages.gather)."""
        self._packed = packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = q4_mm(x.reshape(-1, self.in_features), self._packed, self.out_features, self.kind)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int{self.bits}"


class Int6Linear(Int4Linear):
    """y = x W^T + b with W stored in 6 bits, as a Q6_K tensor holds it (Q6)."""

    bits = 6


class Q8Linear(Int4Linear):
    """y = x W^T + b with W stored in 8 bits per group of 32, as a Q8_0 tensor
    holds it (Q8): unlike quantize.Int8Linear's per-channel int8, the file's own
    weights, and a layer the decoder stack runs."""

    bits = 8


def low_bit(linear: torch.nn.Linear, quantized: Q4 | Q4K | Q6 | Q8) -> Int4Linear:
    """The linear layer with the weights read from its file or rounded (fit)."""
    kind = {Q6: Int6Linear, Q8: Q8Linear}.get(type(quantized), Int4Linear)
    return kind(linear, quantized)


def join(layers: list[Int4Linear]):
    """One product for several 4-, 6- or 8-bit layers of the same input and layout (a
    target's q/k/v, its gate/up): their packed weights laid end to end, each layer keeping a view
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
    biases = [layer.bias for layer in layers]
    bias = None if all(b is None for b in biases) else torch.cat(
        [b.detach() if b is not None else torch.zeros(layer.out_features) for b, layer in zip(biases, layers)])
    if len({layer.kind for layer in layers}) > 1:
        raise ValueError("join takes layers of one layout")
    return Joined(packed, layers[0].kind, layers[0].in_features, sum(layer.out_features for layer in layers), bias,
                  layers)


class Joined:
    """Several 4-bit layers of one input as one product (join); members: the layers,
    each viewing its part of packed."""

    def __init__(self, packed: torch.Tensor, kind: int, in_features: int, out_features: int,
                 bias: torch.Tensor | None, members: list[Int4Linear] = ()):
        self.kernel_weights = packed, kind
        self.in_features, self.out_features, self.bias = in_features, out_features, bias
        self.members = list(members)

    def place(self, packed: torch.Tensor) -> None:
        """Run from packed, a copy of the weights (huge_pages.gather); the members
        view their parts of it."""
        self.kernel_weights = packed, self.kernel_weights[1]
        start = 0
        for layer in self.members:
            rows = layer._packed.shape[0]
            layer.place(packed[start : start + rows])
            start += rows

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        packed, kind = self.kernel_weights
        y = q4_mm(x.reshape(-1, self.in_features), packed, self.out_features, kind)
        return y if self.bias is None else y + self.bias


class _Projection(ctypes.Structure):
    _fields_ = [("packed", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("out", ctypes.c_int64),
                ("kind", ctypes.c_int64), ("lora_a", ctypes.c_void_p), ("lora_b", ctypes.c_void_p),
                ("part_end", ctypes.c_void_p), ("parts", ctypes.c_int64), ("rank", ctypes.c_int64)]


class _Layer(ctypes.Structure):
    _fields_ = [("norm1", ctypes.c_void_p), ("norm2", ctypes.c_void_p), ("qkv", _Projection * 3),
                ("o", _Projection), ("gate_up", _Projection * 2), ("down", _Projection)]


def runs_in_stack(projection) -> bool:
    """Whether DecoderStack can run this projection (a list: parts side by side)."""
    parts = projection if isinstance(projection, list | tuple) else [projection]
    return all(getattr(p, "kernel_weights", None) is not None for p in parts)


class DecoderStack:
    """A Llama-family decoder stack whose projections are all 4-bit or 6-bit, run
    as one kernel call (decoder_stack.c): the drafter's forward, and a GGUF
    target's, without torch's per-op overhead. layers: per layer (norm1, qkv,
    o, norm2, gate_up, down); qkv may be a list of up to 3 parts side by side,
    gate_up of up to 2. Each part has .kernel_weights ((packed, layout), see
    Int4Linear: packed weights, layout), .bias (or None), .out_features and optionally .low_rank (a
    learned adapter beside the weight: a [parts*r, in], b^T [r, out], both fp16,
    each part's end among the outputs); final_norm: the model's, applied to the
    rows read. The tensors are used in place, not copied."""

    kv_dtype = torch.float16  # the cache's (decoder_stack.c)

    def __init__(self, layers: list[tuple], n_heads: int, n_kv: int, head_dim: int, eps: float,
                 final_norm: torch.Tensor | None = None):
        self.n_heads, self.n_kv, self.head_dim, self.eps = n_heads, n_kv, head_dim, eps
        self._keep = []  # the tensors the structs point into

        def ptr(t: torch.Tensor | None) -> int | None:
            if t is None:
                return None
            t = t.detach().contiguous()
            self._keep.append(t)
            return t.data_ptr()

        def projection(p) -> _Projection:
            packed, kind = p.kernel_weights
            bias = None if p.bias is None else p.bias.float()
            low_rank = getattr(p, "low_rank", None)
            if low_rank is None:
                return _Projection(ptr(packed), ptr(bias), p.out_features, kind)
            a, b, ends = low_rank
            return _Projection(ptr(packed), ptr(bias), p.out_features, kind, ptr(a), ptr(b),
                               ptr(ends.to(torch.int64)), len(ends), b.shape[0])

        def parts(p, most: int):
            p = list(p) if isinstance(p, list | tuple) else [p]
            if len(p) > most:
                raise ValueError(f"a projection in more than {most} parts")
            return (_Projection * most)(*map(projection, p))

        self._final_norm = ptr(None if final_norm is None else final_norm.float())
        self._layers = (_Layer * len(layers))(*[
            _Layer(ptr(n1.float()), ptr(n2.float()), parts(qkv, 3), projection(o), parts(gu, 2), projection(down))
            for n1, qkv, o, n2, gu, down in layers])
        self.hidden = layers[0][0].numel()
        gate_up = layers[0][4] if isinstance(layers[0][4], list | tuple) else [layers[0][4]]
        self.inter = sum(p.out_features for p in gate_up) // 2

    def __call__(self, x: torch.Tensor, start: int, kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 needed: int | None = None, window: int = 0) -> None:
        """x [n, hidden] float32 (the embeddings of positions start..) becomes, in
        place, the last layer's residual stream in its last `needed` rows (None: all;
        the other rows are left partway), through the final norm where the stack was
        given one; the new keys and values of every row go into kv [layers, 2, kv
        heads, capacity, head_dim] (fp16, contiguous). window: 0, or a query reads
        only the first 256 positions and the 256-position parts holding its last
        `window` (LeanLlama.window)."""
        lib = _library()
        if isinstance(lib, KernelUnavailable):
            raise lib
        # The kernel reads raw memory: any other dtype would be read as garbage.
        if not all(t.dtype == torch.float32 and t.is_contiguous() for t in (x, cos, sin)) or \
                kv.dtype != self.kv_dtype or not kv.is_contiguous():
            raise TypeError("the decoder stack takes contiguous float32 tensors and an fp16 cache")
        if cos.shape[0] < kv.shape[3] or x.shape[1] != self.hidden:
            raise ValueError("the decoder stack got tensors of the wrong shape")
        n = x.shape[0]
        needed = n if needed is None else min(max(needed, 0), n)
        # A build from before windows (the A/B scripts' older revisions) takes one argument less.
        extra = (window,) if len(lib.decoder_stack.argtypes) == _STACK_ARGS else ()
        if window and not extra:
            raise TypeError("this build of the decoder stack has no attention window")
        if lib.decoder_stack(x.data_ptr(), n, needed, start, self._layers, len(self._layers), kv.data_ptr(),
                             kv.shape[3], cos.data_ptr(), sin.data_ptr(), self.hidden, self.n_heads, self.n_kv,
                             self.head_dim, self.inter, self.eps, self._final_norm, torch.get_num_threads(), *extra):
            raise MemoryError("out of memory in the 4-bit decoder stack")
