"""llama.cpp, the peer users run (LM Studio, Ollama, Jan and GPT4All are built on
it): its optional install (`make peers`) and its plain greedy decoding as a bench method.

llama-cpp-python ships as source only, so installing it compiles llama.cpp (~13 min
on 2 cores). Builds are tried from the fastest to the most portable; each is
smoke-tested in a child process because a build for instructions this CPU lacks
dies with SIGILL at its first eval, not at import. The build that ran is recorded
beside the interpreter and copied into every bench report.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

VERSION = "0.3.36"
_COMMON = "-DGGML_NATIVE=OFF -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX=ON -DGGML_AVX2=ON"
BUILDS = {
    "native": "-DGGML_NATIVE=ON",
    "avx512": _COMMON + " -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON",
    "avx2": _COMMON + " -DGGML_AVX512=OFF",
}
INSTALL_HINT = "llama.cpp is not installed: `make peers` builds it (~15 min, optional)"
_SMOKE = """
import sys, llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_threads=2, verbose=False)
llm.eval(llm.tokenize(b"def add(a, b):"))
print(int(llm.n_tokens))
"""


def build_file() -> Path:
    return Path(sys.prefix) / "omnidraft-llamacpp-build.json"


def build_info() -> dict | None:
    """The installed build (name, CMake flags, version), or None when not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    try:
        info = json.loads(build_file().read_text())
    except (OSError, ValueError):
        info = {"build": "unknown (installed by hand)"}
    info["version"] = llama_cpp.__version__
    info["system_info"] = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    return info


def _smoke_test(gguf: Path) -> tuple[bool, str]:
    proc = subprocess.run(
        [sys.executable, "-c", _SMOKE, str(gguf)], check=False, capture_output=True, text=True, timeout=300
    )
    why = f"exit {proc.returncode}" + (" (SIGILL: an instruction this CPU lacks)" if proc.returncode == -4 else "")
    return proc.returncode == 0, why + (f": {proc.stderr.strip()[-300:]}" if proc.returncode else "")


def install(order: list[str], gguf: Path) -> dict:
    """Build and install llama-cpp-python with the first build in `order` that runs here."""
    tried = []
    for name in order:
        print(f"building llama.cpp ({name}: {BUILDS[name]}) ...", flush=True)
        env = {**os.environ, "CMAKE_ARGS": BUILDS[name], "FORCE_CMAKE": "1"}
        with tempfile.TemporaryDirectory() as tmp:
            # No wheel cache: pip keys cached wheels by source, not by CMAKE_ARGS.
            pip = [sys.executable, "-m", "pip", "install", "-q", "--no-cache-dir", "--force-reinstall", "--no-deps"]
            built = subprocess.run([*pip, f"llama-cpp-python=={VERSION}"], check=False, env={**env, "TMPDIR": tmp})
        if built.returncode != 0:
            tried.append(f"{name}: build failed")
            continue
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "diskcache>=5.6", "jinja2>=2.11"], check=False)
        ok, why = _smoke_test(gguf)
        if ok:
            info = {"build": name, "cmake_args": BUILDS[name], "tried": tried}
            build_file().write_text(json.dumps(info, indent=1))
            print(f"llama.cpp {VERSION} ({name}) runs here", flush=True)
            return info
        tried.append(f"{name}: {why}")
        print(f"the {name} build does not run here ({why})", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", "llama-cpp-python"], check=False)
    raise SystemExit("no llama.cpp build runs here: " + "; ".join(tried))


def runner(gguf: Path, tokenizer, stops: set[int], chat: bool, threads: int):
    """Plain greedy decoding by llama.cpp of the prompt ids the other methods decode."""
    import llama_cpp

    from .runners import prompt_ids

    llm = llama_cpp.Llama(
        model_path=str(gguf), n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False
    )
    atexit.register(llm.close)  # before interpreter teardown, which it does not survive
    calls = [0]

    def run(prompt: str, cfg) -> tuple[list[int], None]:
        if not cfg.greedy:
            raise NotImplementedError("the llamacpp method decodes greedily only")
        out: list[int] = []
        for token in llm.generate(prompt_ids(tokenizer, prompt, chat), top_k=1, temp=0.0, reset=True):
            if token in stops:
                break
            out.append(int(token))
            calls[0] += 1
            if len(out) == cfg.max_new_tokens:
                break  # now, not after the generator evaluates one more token
        return out, None

    return run, calls  # calls: one per token sampled, as plain decoding counts


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m omnidraft.bench.llamacpp", description=__doc__)
    p.add_argument("--install", action="store_true", help="build and install llama-cpp-python")
    p.add_argument(
        "--builds",
        default=os.environ.get("LLAMACPP_BUILDS", "native,avx512,avx2"),
        help="builds to try, in order (default: native,avx512,avx2)",
    )
    args = p.parse_args(argv)
    info = build_info()
    if args.install:
        if info and build_file().exists():
            print(f"llama.cpp already installed: {json.dumps(info)}")
            return 0
        from omnidraft.core.models.bundled_models import smollm2_gguf

        install([b.strip() for b in args.builds.split(",") if b.strip()], smollm2_gguf())
        return 0
    print(json.dumps(info, indent=1) if info else INSTALL_HINT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
