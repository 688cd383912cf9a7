"""The GUI's worst stall while a long code block renders and is syntax-highlighted.

Puts a reply holding one fenced block of LINES lines of real Python (this
package's own source) into the chat column of a window, measured by the app's
10 ms stall monitor, twice: opened whole (a saved chat shown), then streamed in
batches every 30 ms over --stream-seconds (faster than any model writes, so
more renders per second than a real reply). Each phase runs until the block is
fully coloured; the report gives the worst event-loop stall and the time to
colour, per phase. --lang "" leaves the fence unnamed, so the language is guessed.

    .venv/bin/python -m omnidraft.tools.code_block_stall --lines 2000
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from .common import positive_float, positive_int, tool_parser

BATCH_MS = 30  # the engine worker's batch interval


def parse_args(argv: list[str] | None = None):
    p = tool_parser(__file__, __doc__)
    p.add_argument("--lines", type=positive_int, default=2000)
    p.add_argument("--lang", default="python", help='the fence\'s language ("" to have it guessed)')
    p.add_argument("--stream-seconds", type=positive_float, default=20.0,
                   help="how long the streamed phase takes to write the block")
    p.add_argument("--theme", choices=("light", "dark"), default="light")
    return p.parse_args(argv)


def python_source(lines: int) -> str:
    """`lines` lines of this package's own Python, file after file."""
    import omnidraft.core

    out: list[str] = []
    for path in sorted(Path(omnidraft.core.__file__).parent.rglob("*.py")):
        out += path.read_text(encoding="utf-8").splitlines()
        if len(out) >= lines:
            break
    while len(out) < lines:
        out += out[: lines - len(out)]
    return "\n".join(out[:lines])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from omnidraft.app.chat_view import ChatView
    from omnidraft.app.stall_monitor import StallMonitor
    from omnidraft.app.theme import apply_theme
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv)
    apply_theme(app, args.theme)
    view = ChatView()
    view.resize(1280, 800)
    view.show()
    code = python_source(args.lines)
    reply = f"Here it is:\n\n```{args.lang}\n{code}\n```\n\nThat is the whole module."
    monitor = StallMonitor()

    def wait(predicate, limit: float = 300.0) -> None:
        start = time.perf_counter()
        while not predicate():
            if time.perf_counter() - start > limit:
                raise SystemExit("the block was not coloured in time")
            app.processEvents()
            time.sleep(0.001)

    def coloured() -> bool:
        reply_widget = view.current_reply()
        blocks = reply_widget.body.code_blocks() if reply_widget else []
        return bool(blocks) and all(b.highlighted() and b.code() == code for b in blocks)

    def settle() -> None:
        end = time.perf_counter() + 0.3
        wait(lambda: time.perf_counter() > end)

    report: dict = {"lines": args.lines, "chars": len(code), "lang": args.lang or "(guessed)", "theme": args.theme}
    user = {"role": "user", "content": "Show me the module."}

    settle()
    monitor.start()
    settle()
    monitor.reset()
    start = time.perf_counter()
    view.load([user, {"role": "assistant", "content": reply}], "Assistant")
    wait(coloured)
    report["opened"] = {"worst_stall_ms": round(monitor.max_stall_ms, 1),
                        "coloured_after_s": round(time.perf_counter() - start, 2)}

    view.clear()
    settle()
    monitor.reset()
    view.load([user, {"role": "assistant", "content": ""}], "Assistant")
    batches = max(1, int(args.stream_seconds * 1000 / BATCH_MS))
    step = max(1, len(reply) // batches)
    start = time.perf_counter()
    for at in range(0, len(reply), step):
        view.stream([(reply[at:at + step], False)])
        until = time.perf_counter() + BATCH_MS / 1000
        wait(lambda u=until: time.perf_counter() >= u)
    view.current_reply().flush()
    streamed = time.perf_counter()
    wait(coloured)
    report["streamed"] = {"worst_stall_ms": round(monitor.max_stall_ms, 1),
                          "written_in_s": round(streamed - start, 2),
                          "coloured_after_end_s": round(time.perf_counter() - streamed, 2)}
    monitor.stop()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
