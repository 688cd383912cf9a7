"""Building and loading the kernels' shared library: which instruction sets they are
written for, which of them this CPU runs, and where each build comes from.

The kernels are plain C (csrc/: no torch headers), loaded with ctypes (which releases
the GIL during a call). They are written for AVX-512 with VNNI and for AVX2 (with FMA
and F16C, as most desktop CPUs have; ISAS), and as plain C (the generic build:
ggml's *_generic loops, no intrinsics), the reference the others are tested against
and the fallback wherever none of them runs (old x86, ARM, macOS). Where the CPU has
AMX (Xeons since Sapphire Rapids, Xeon W workstations), a product of amx_rows() rows
or more (a prompt's prefill) runs on its bf16 tiles; where it has AVX512-BF16 (Zen 4
and later, Cooper Lake, AMX Xeons), attention's multiply-adds run in bf16 (the
avx512bf16 and amx builds). What each build gains: docs/performance.md.

Where the builds come from: the package's build (setup.py) compiles every build of
ISAS into lib/ beside this file, one shared library each (build_all), each
reporting the tag of the sources it was built from (kernel_source_tag); lib/builds.json
records why a build was skipped (an older compiler has no AMX intrinsics). At run
time the best build this CPU runs (its flags: cpu_flags) is loaded from there, with
no compiler. Only where the sources
differ from the ones the package was built from (a developer's edit, or a tool that
points SOURCES at another revision's: tools/kernel_ab.py), or where the package was
never built (a bare source tree), is a build compiled on first use with the system's
C compiler into the cache folder.

Choosing a build: OMNIDRAFT_KERNEL_ISA=avx512vnni (or avx2, generic, ...) names the
default for a process; use_build() swaps it within a block (tests and tools that
compare builds), either for a build of ISAS or for a library loaded from elsewhere
(bind()).

The library's interface carries a version (KERNEL_ABI, csrc/quant_gemm.h): bind()
refuses a library that reports another, so Python never calls C code whose
arguments or structs it lays out differently.

This module imports nothing of the package at its top, so setup.py loads it by path
to build the libraries with the same flags as the run-time path.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# The version of the library's interface this code calls (csrc/quant_gemm.h's
# KERNEL_ABI): quant_gemm's arguments, the layouts' numbers, decoder_stack's structs.
KERNEL_ABI = 1

_CSRC = Path(__file__).with_name("csrc")
# The products (quant_gemm.c) and the whole decoder stack built on them
# (decoder_stack.c); the header they share counts toward a build's tag.
SOURCES = [_CSRC / "quant_gemm.c", _CSRC / "decoder_stack.c"]
HEADERS = [_CSRC / "quant_gemm.h"]
# The package's prebuilt libraries (build_all) and what they were built from.
PREBUILT = Path(__file__).with_name("lib")
MANIFEST = "builds.json"
_FLAGS = ["-O3", "-fopenmp", "-shared", "-fPIC"]
# The instruction sets the kernels are written for, best first (the C sources
# branch on them): AVX-512 with VNNI (one VPDPBUSD per 64 products), or AVX2 with
# FMA and F16C, which most desktop CPUs have (VPMADDUBSW; same results, more
# instructions); last the generic build, plain C that any CPU runs.
# Name -> (the CPU flags it needs, compiler flags).
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
    # Plain C for any CPU (OMNI_GENERIC: no intrinsics even where the compiler's
    # defaults would allow some). Its products give the SIMD builds' bits; its
    # decoder stack sums in another order (tests/test_kernels.py).
    "generic": ((), ["-DOMNI_GENERIC"]),
}


class KernelUnavailable(RuntimeError):
    """Why the quantized kernels cannot be used on this machine (a sentence for model info)."""


class KernelABIMismatch(KernelUnavailable):
    """A library whose interface is another version than this code calls."""


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's flags as Linux names them (/proc/cpuinfo). Elsewhere none are read,
    so only the generic build runs there (no SIMD build is tested off Linux)."""
    if not sys.platform.startswith("linux"):
        return frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def runnable_isas() -> list[str]:
    """The kernels' builds this CPU runs, best first (generic last: every CPU runs it)."""
    return [name for name, (needs, _) in ISAS.items() if cpu_flags().issuperset(needs)]


def library_file(isa: str) -> str:
    """The file name of a build's shared library."""
    return f"omnidraft_kernels_{isa}" + (".dll" if sys.platform == "win32" else ".so")


def source_tag(isa: str) -> str | None:
    """What a build of `isa` is compiled from: its sources, header and flags, hashed
    (None: the sources are not here, as in a bundle that ships the libraries only)."""
    try:
        source = b"".join(path.read_bytes() for path in SOURCES + HEADERS)
    except OSError:
        return None
    return hashlib.sha256(source + " ".join([*_FLAGS, *ISAS[isa][1]]).encode()).hexdigest()[:16]


def find_compiler() -> str | None:
    """The C compiler: $CC where set, else cc, gcc or clang on PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        found = name and shutil.which(name)
        if found:
            return found
    return None


def compile_build(isa: str, out: Path, compiler: str) -> str | None:
    """Compile the build of `isa` into `out` (atomically: a second process never loads
    half a file). Returns None, or why it did not build (the compiler's last words).
    The generic build is compiled without OpenMP where the compiler has none (Apple's
    clang): it then runs on one thread."""
    tries = [[*_FLAGS, *ISAS[isa][1], f'-DOMNI_SOURCE_TAG="{source_tag(isa)}"']]
    if isa == "generic":
        tries.append([flag for flag in tries[0] if flag != "-fopenmp"])
    out.parent.mkdir(parents=True, exist_ok=True)
    error = ""
    for flags in tries:
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            built = Path(tmp) / out.name
            done = subprocess.run([compiler, *flags, *map(str, SOURCES), "-o", str(built), "-lm"],
                                  capture_output=True, text=True, check=False)
            if done.returncode == 0:
                built.replace(out)
                return None
            error = error or done.stderr.strip()
    lines = [line for line in error.splitlines() if "error" in line] or error.splitlines() or ["no output"]
    return lines[0][-300:]


def build_all(folder: Path, compiler: str | None = None, jobs: int | None = None) -> dict:
    """Compile every build of ISAS into `folder` (the package's build: setup.py) and
    write its manifest: per build, the file and the sources' tag, or why it was
    skipped. A build the compiler cannot make is skipped, never an error: the others
    and the generic build still serve. Returns the manifest."""
    compiler = compiler or find_compiler()
    folder.mkdir(parents=True, exist_ok=True)

    def one(isa: str) -> dict:
        tag = source_tag(isa)
        if compiler is None:
            return {"tag": tag, "skipped": "no C compiler (set CC, or install gcc or clang)"}
        why = compile_build(isa, folder / library_file(isa), compiler)
        return {"tag": tag, "skipped": why} if why else {"tag": tag, "file": library_file(isa)}

    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        builds = dict(zip(ISAS, pool.map(one, ISAS)))
    kept = {entry["file"] for entry in builds.values() if "file" in entry}
    for old in folder.glob("omnidraft_kernels_*"):  # a previous build's, of a build skipped now or no longer listed
        if old.name not in kept:
            old.unlink()
    manifest = {"abi": KERNEL_ABI, "builds": builds}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


@functools.cache
def _manifest() -> dict:
    try:
        return json.loads((PREBUILT / MANIFEST).read_text()).get("builds", {})
    except (OSError, ValueError):
        return {}


def _open(path: Path, isa: str) -> ctypes.CDLL | KernelUnavailable:
    # torch first: its OpenMP runtime (torch/lib/libgomp.so.1) is the one the library
    # links, so a machine without the system's libgomp still loads it.
    import torch  # noqa: F401

    try:
        lib = bind(ctypes.CDLL(str(path)))
    except KernelABIMismatch as mismatch:  # the sources and this code disagree: model info says so
        return mismatch
    except OSError as error:
        return KernelUnavailable(f"the {isa} kernel library did not load ({error})")
    lib.isa = isa
    try:
        lib.kernel_source_tag.restype = ctypes.c_char_p
        lib.source_tag = lib.kernel_source_tag().decode() or None
    except AttributeError:  # built before libraries reported their sources
        lib.source_tag = None
    return lib


@functools.cache
def _load(isa: str | None) -> ctypes.CDLL | KernelUnavailable:
    """The kernels built for `isa` (None: the best this CPU runs, or
    OMNIDRAFT_KERNEL_ISA's)."""
    if isa is None:
        chosen = os.environ.get("OMNIDRAFT_KERNEL_ISA")  # to compare builds, or to step around one
        failed = None  # the best build's reason, if none loads; builds past the first that loads are not opened
        for name in runnable_isas():
            if chosen in (None, name):
                lib = _load(name)
                if not isinstance(lib, KernelUnavailable):
                    return lib
                failed = failed or lib
        if failed:
            return failed
        return KernelUnavailable(f"OMNIDRAFT_KERNEL_ISA={chosen} is not a build this CPU runs "
                                 f"({', '.join(runnable_isas())})")
    tag, prebuilt = source_tag(isa), PREBUILT / library_file(isa)
    if prebuilt.exists():
        lib = _open(prebuilt, isa)
        built_from = getattr(lib, "source_tag", None)
        if tag is None or built_from == tag:  # the package's own build of these sources
            return lib
        if isinstance(lib, KernelUnavailable) and not isinstance(lib, KernelABIMismatch):
            return lib  # it did not load (a missing system library): why, not a compiler's absence
    else:
        skipped = _manifest().get(isa, {})
        if skipped.get("skipped") and skipped.get("tag") in (tag, None):
            return KernelUnavailable(f"the {isa} kernel was not built with the package ({skipped['skipped']})")
        if tag is None:
            return KernelUnavailable(f"the {isa} kernel library is missing from the package (reinstall OmniDraft)")
    # The developer's path: sources the package was not built from, or a bare source tree.
    built = _cache_folder() / f"quant_gemm-{isa}-{tag}.so"
    if not built.exists():
        compiler = find_compiler()
        if compiler is None:
            return KernelUnavailable("no prebuilt kernel library matches these sources and there is no C "
                                     "compiler to build one (reinstall OmniDraft, or install gcc)")
        why = compile_build(isa, built, compiler)
        if why:
            return KernelUnavailable(f"the {isa} kernel did not build: {why}")
    return _open(built, isa)


def _cache_folder() -> Path:
    from ..storage.paths import cache_dir  # here, not at the top: setup.py loads this module alone

    return cache_dir() / "kernels"


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
    OMNIDRAFT_KERNEL_ISA, cpu_flags or the prebuilt folder changed: tests)."""
    _load.cache_clear()
    _manifest.cache_clear()


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
    """Why the quantized kernels cannot run here, as a sentence (None: they can; the
    generic build runs on any CPU, so only a broken install or a named build this
    CPU cannot run leaves them out)."""
    lib = library()
    if not isinstance(lib, KernelUnavailable):
        return None
    why = str(lib)
    return f"The 4-bit kernels cannot run here: {why}" + ("" if why.endswith(".") else ".")
