"""Drive the real desktop app once and measure how responsive it stays.

Starts the window (offscreen unless a display is set) with a real engine
worker, loads a target, sends the given prompts one after another, and
reports the worst event-loop stall per phase (engine start, model loading,
streaming) from the window's 10 ms stall monitor. Optionally saves
screenshots of the window, the charts and the settings dialog.

    .venv/bin/python -m omnidraft.tools.gui_check --target qwen2.5-coder-1.5b-instruct \
        --prompt "Write a Python function that reverses a string." --shots docs/screenshots

--learn-seconds N then asks the engine to learn now and watches it for N seconds.
--attach FILE attaches files to the first prompt (the engine counts their tokens);
--search TEXT searches the chats' messages from the sidebar at the end. With
--shots, the attached chips, the search results and the last reply's code block
get a screenshot each (attach.png, search.png, code-highlighting.png), and
battery.png shows the status bar as the worker leaves it when learning waits for
mains power (the worker's event, sent to the window: no battery needed).

User data goes to a fresh temporary OMNIDRAFT_HOME; --cache points its cache
at an existing one (converted weights) so models are not converted again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .common import existing_file, non_negative_float, positive_float, positive_int, tool_parser

DEFAULT_PROMPT = "Write a short Python function that reverses a string, and explain it."


def window_size(text: str) -> tuple[int, int]:
    """WIDTHxHEIGHT in pixels: "1280x800" -> (1280, 800)."""
    width, _, height = text.partition("x")
    try:
        size = int(width), int(height)
    except ValueError:
        size = (0, 0)
    if min(size) < 1:
        raise argparse.ArgumentTypeError(f"needs WIDTHxHEIGHT in pixels (as 1280x800), not {text!r}")
    return size


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = tool_parser(__file__, __doc__)
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct", help="catalog id or model path")
    p.add_argument("--prompt", action="append",
                   help=f"a message to send (repeatable; default: {DEFAULT_PROMPT!r})")
    p.add_argument("--max-new-tokens", type=positive_int, default=128)
    p.add_argument("--cache", type=Path, help="an existing cache folder (holding models/, gguf/) to reuse")
    p.add_argument("--shots", type=Path, help="folder for PNG screenshots")
    p.add_argument("--highlight", action="store_true", help="tint text from accepted drafts")
    p.add_argument("--learn-seconds", type=non_negative_float, default=0.0,
                   help="after the prompts, ask the engine to learn now and watch it this long")
    p.add_argument("--pause", type=non_negative_float, default=0.0,
                   help="seconds between a reply and the next prompt, as a person reading it")
    p.add_argument("--keep-home", action="store_true", help="keep the temporary data folder")
    p.add_argument("--attach", type=existing_file, action="append", default=[],
                   help="a file to attach to the first prompt (repeatable)")
    p.add_argument("--search", default="reverse", help="what to search the chats' messages for at the end")
    p.add_argument("--size", type=window_size, default=(1280, 800), help="the window's WIDTHxHEIGHT (default 1280x800)")
    p.add_argument("--timeout", type=positive_float, default=900.0,
                   help="seconds each phase (loading, a reply) may take")
    args = p.parse_args(argv)
    if args.cache is not None and not args.cache.expanduser().is_dir():
        p.error(f"--cache: no such folder: {args.cache}")
    args.prompt = args.prompt or [DEFAULT_PROMPT]
    return args


def prepare_home(args: argparse.Namespace) -> Path:
    home = Path(tempfile.mkdtemp(prefix="omnidraft-gui-check-"))
    if args.cache:
        (home / "cache").mkdir()
        for name in ("models", "gguf"):
            source = args.cache.expanduser().resolve() / name
            if source.exists():
                (home / "cache" / name).symlink_to(source)
    (home / "config").mkdir()
    settings = {"max_new_tokens": args.max_new_tokens, "highlight_drafts": args.highlight}
    (home / "config" / "settings.json").write_text(json.dumps(settings))
    os.environ["OMNIDRAFT_HOME"] = str(home)
    return home


async def until(predicate, timeout: float) -> None:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise TimeoutError("the app did not get there in time")
        await asyncio.sleep(0.05)


async def drive(window, args, shots: Path | None) -> dict:
    from omnidraft.core.worker.protocol import ErrorEvent, TurnDone

    events: list = []
    window.bridge.event.connect(events.append)
    started = time.monotonic()
    await until(lambda: window.targets.current is not None
                or any(isinstance(e, ErrorEvent) for e in events), args.timeout)
    if window.targets.current is None:
        raise SystemExit(f"the model did not load: {[e.message for e in events if isinstance(e, ErrorEvent)]}")
    load_s = time.monotonic() - started
    turns = []
    for n, prompt in enumerate(args.prompt):
        if n:
            await asyncio.sleep(args.pause)
        if n == 0 and args.attach:
            tray = window.chat.attachments
            tray.add_paths([str(path) for path in args.attach])
            await until(tray.ready, args.timeout)
            await asyncio.sleep(0.3)
            if shots:
                shots.mkdir(parents=True, exist_ok=True)
                window.grab().save(str(shots / "attach.png"))
        window.chat.composer.setPlainText(prompt)
        window.chat._submit()
        request_id = window.session.active.request_id
        await until(lambda rid=request_id: any(isinstance(e, TurnDone) and e.request_id == rid
                                               for e in events), args.timeout)
        done = next(e for e in events if isinstance(e, TurnDone) and e.request_id == request_id)
        stats = done.stats.as_dict() if done.stats is not None else {}
        turns.append({"reason": done.reason, **{k: stats.get(k) for k in (
            "method", "new_tokens", "seconds", "first_token_seconds", "tokens_per_s", "acceptance_rate",
            "tokens_per_step", "plain_seconds", "speedup")},
            "baseline_tokens_per_s": done.baseline_tokens_per_s})
    learning = None
    if args.learn_seconds > 0:
        window.learning.learn_now()
        await asyncio.sleep(args.learn_seconds)
        points = window.history.learning_for(window.targets.current)
        learning = {"points": len(points), "last": points[-1].__dict__ if points else None,
                    "state": window.learning.state}
    await asyncio.sleep(0.5)  # let the last layout settle
    stall = window.stall  # read before the screenshots: grabbing a window is our own stall
    stall_ms = {"worst_overall": round(stall.max_stall_ms, 1),
                **{k: round(v, 1) for k, v in stall.phase_max_ms.items()}}
    ticks = stall.ticks
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
        window.grab().save(str(shots / "main-window.png"))
        window.charts.grab().save(str(shots / "charts.png"))
        menu = window.targets_menu
        menu.popup(window.mapToGlobal(window.rect().center()))
        await asyncio.sleep(0.2)
        menu.grab().save(str(shots / "targets-menu.png"))
        menu.hide()
        from omnidraft.app.settings_dialog import SettingsDialog
        from omnidraft.core.storage import paths

        dialog = SettingsDialog(window.settings, str(paths.data_dir()), window)
        dialog.show()
        await asyncio.sleep(0.2)
        dialog.grab().save(str(shots / "settings.png"))
        dialog.close()
        reply = window.chat.current_reply()
        blocks = reply.body.code_blocks() if reply is not None else []
        if blocks:
            await until(lambda: all(b.highlighted() for b in blocks), args.timeout)
            reply.grab().save(str(shots / "code-highlighting.png"))
        window.sidebar.search.setText(args.search)
        await until(lambda: window.sidebar.results.count() > 0 or window.sidebar.results_title.isVisible(), 10)
        await asyncio.sleep(0.3)
        window.grab().save(str(shots / "search.png"))
        # No battery here: the status bar as the worker's "paused on battery" leaves it.
        from omnidraft.core.worker.power import BATTERY_STATUS
        from omnidraft.core.worker.protocol import LearningProgress

        window.bridge.event.emit(LearningProgress(window.targets.current, BATTERY_STATUS))
        await asyncio.sleep(0.3)
        window.statusBar().grab().save(str(shots / "battery.png"))
    return {
        "target": window.targets.current,
        "load_seconds": round(load_s, 1),
        "turns": turns,
        "learning": learning,
        "stall_ms": stall_ms,
        "stall_ticks": ticks,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    home = prepare_home(args)
    import qasync
    from omnidraft.app.main_window import MainWindow
    from omnidraft.app.theme import apply_theme
    from PySide6.QtWidgets import QApplication

    app = QApplication(sys.argv)
    apply_theme(app)
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    window = MainWindow(target=args.target)
    window.resize(*args.size)
    window.show()
    window.start()
    shots = args.shots
    async def run() -> dict:
        try:
            return await drive(window, args, shots)
        finally:
            window.close()  # saves and stops the worker while the loop still runs

    with loop:
        report = loop.run_until_complete(run())
    print(json.dumps(report, indent=2))
    if not args.keep_home:  # only links into --cache live there besides our own files
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
