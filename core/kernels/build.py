"""Building and loading the kernels' shared library: which instruction sets they are
written for, which of them this CPU runs, which compiler builds them, and where a
build is cached.

The kernels are plain C (csrc/: no torch headers, so a build takes about a second),
compiled on first use with the system's C compiler into the cache folder and loaded
with ctypes (which releases the GIL during a call). They link the OpenMP runtime
torch already loaded, so their threads are torch's. They are written for AVX-512
with VNNI and for AVX2 (with FMA and F16C, as most desktop CPUs have; ISAS), built
for the best the CPU runs and the compiler builds; without either or a compiler,
targets keep int8 weights (core/models/quantize.py) and model info says why
(unavailable()). Where the CPU has AMX (Xeons since Sapphire Rapids, Xeon W
workstations), a product of amx_rows() rows or more (a prompt's prefill) runs on
its bf16 tiles; where it has AVX512-BF16 (Zen 4 and later, Cooper Lake, AMX Xeons),
attention's multiply-adds run in bf16 (the avx512bf16 and amx builds). What each
build gains: docs/performance.md.

Choosing a build: OMNIDRAFT_KERNEL_ISA=avx512vnni (or avx2, ...) names the default
for a process; use_build() swaps it within a block (tests and tools that compare
builds), either for a build of ISAS or for a library loaded from elsewhere (bind()).

The library's interface carries a version (KERNEL_ABI, csrc/quant_gemm.h): bind()
refuses a library that reports another, so Python never calls C code whose
arguments or structs it lays out differently.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..storage.paths import cache_dir

# The version of the library's interface this code calls (csrc/quant_gemm.h's
# KERNEL_ABI): quant_gemm's arguments, the layouts' numbers, decoder_stack's structs.
KERNEL_ABI = 1

_CSRC = Path(__file__).with_name("csrc")
# The products (quant_gemm.c) and the whole decoder stack built on them
# (decoder_stack.c); the header they share counts toward a build's tag.
SOURCES = [_CSRC / "quant_gemm.c", _CSRC / "decoder_stack.c"]
HEADERS = [_CSRC / "quant_gemm.h"]
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
    # The same code in AVX-512 VL's encodings (OMNI_YMM, quant_gemm.h): where AVX-512
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
    """Why the quantized kernels cannot be used on this machine (a sentence for model info)."""


class KernelABIMismatch(KernelUnavailable):
    """A library whose interface is another version than this code calls."""


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
def _load(isa: str | None) -> ctypes.CDLL | KernelUnavailable:
    """The kernels built for `isa` (None: the best this CPU runs that this compiler
    builds, or OMNIDRAFT_KERNEL_ISA's; an older gcc has no AMX intrinsics)."""
    if not sys.platform.startswith("linux"):
        return KernelUnavailable("the 4-bit kernel is built for Linux only")
    if isa is None:
        chosen = os.environ.get("OMNIDRAFT_KERNEL_ISA")  # to compare builds, or to step around one
        failed = None  # the best build's reason, if none builds; builds past the first that works are not compiled
        for name in runnable_isas():
            if chosen in (None, name):
                lib = _load(name)
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
    source = b"".join(path.read_bytes() for path in SOURCES + HEADERS)
    tag = hashlib.sha256(source + " ".join(flags).encode()).hexdigest()[:16]
    built = cache_dir() / "kernels" / f"quant_gemm-{isa}-{tag}.so"
    if not built.exists():
        built.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=built.parent) as tmp:
            out = Path(tmp) / built.name
            done = subprocess.run([compiler, *flags, *map(str, SOURCES), "-o", str(out), "-lm"],
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                return KernelUnavailable(f"the 4-bit kernel did not build: {done.stderr.strip()[-300:]}")
            out.replace(built)  # atomic: a second process never loads half a file
    try:
        lib = bind(ctypes.CDLL(str(built)))
    except KernelABIMismatch as mismatch:  # the sources and this code disagree: model info says so
        return mismatch
    lib.isa = isa
    return lib


# use_build's library (or reason), or None: the default's.
_chosen: ctypes.CDLL | KernelUnavailable | None = None


def library(isa: str | None = None) -> ctypes.CDLL | KernelUnavailable:
    """The kernels built for `isa` (a name in ISAS), or, with none named, the build
    in use: use_build's where a block chose one, else the best this CPU runs that
    this compiler builds (OMNIDRAFT_KERNEL_ISA's where set). Why not, where it
    cannot load."""
    if isa is None and _chosen is not None:
        return _chosen
    return _load(isa)


@contextlib.contextmanager
def use_build(build: str | ctypes.CDLL) -> Iterator[ctypes.CDLL | KernelUnavailable]:
    """Within the block, the kernels that name no build run on `build`: a name in
    ISAS (what OMNIDRAFT_KERNEL_ISA names for a whole process), or a library that
    bind() typed (one built elsewhere: another revision's sources, an emulated
    build). Products that name a build keep it. Blocks nest; the choice is the
    process's, every thread's, while the block runs. Yields the library (or why
    it cannot load, which the kernels then raise)."""
    global _chosen
    if isinstance(build, str):
        if build not in ISAS:
            raise ValueError(f"{build!r} is none of the kernels' builds ({', '.join(ISAS)})")
        lib = _load(build)
    else:
        lib = build
    before, _chosen = _chosen, lib
    try:
        yield lib
    finally:
        _chosen = before


def forget_builds() -> None:
    """Load the builds again when next asked, and choose the default again (after
    OMNIDRAFT_KERNEL_ISA or cpu_flags changed: tests)."""
    _load.cache_clear()


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """The kernels' entry points typed for ctypes (a build loaded from anywhere:
    tests load an emulated one). Raises KernelABIMismatch where the library's
    interface is not the version this code calls (KERNEL_ABI)."""
    try:
        reported = lib.kernel_abi
    except AttributeError:
        raise KernelABIMismatch(f"{lib._name}: a kernel library from before its interface had a version "
                                f"(this code calls version {KERNEL_ABI})") from None
    reported.restype = ctypes.c_int
    reported.argtypes = []
    if reported() != KERNEL_ABI:
        raise KernelABIMismatch(f"{lib._name}: a kernel library of interface version {reported()}; "
                                f"this code calls version {KERNEL_ABI}")
    lib.quant_gemm.restype = ctypes.c_int
    lib.quant_gemm.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                               ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    lib.amx_rows.restype = ctypes.c_int
    lib.amx_rows.argtypes = []
    lib.decoder_stack.restype = ctypes.c_int
    lib.decoder_stack.argtypes = [ctypes.c_void_p]  # a StackParams (stack.py)
    return lib


def kernel_isa() -> str | None:
    """The instruction set the kernels run with here (None: they cannot run)."""
    lib = library()
    if isinstance(lib, KernelUnavailable):
        return None
    isa = getattr(lib, "isa", None)  # a build loaded from elsewhere (tests) says none
    return "avx512bf16" if isa == "amx" and not lib.amx_rows() else isa  # its build without the tiles


def amx_rows(isa: str | None = None) -> int:
    """Rows from which a product runs on AMX tiles (bf16) here; 0: never."""
    lib = library(isa)
    return 0 if isinstance(lib, KernelUnavailable) else lib.amx_rows()


def unavailable() -> str | None:
    """Why the quantized kernels cannot run here (None: they can)."""
    lib = library()
    return str(lib) if isinstance(lib, KernelUnavailable) else None
