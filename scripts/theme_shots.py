"""Screenshots of the window in a theme, without an engine or a model.

Builds the real main window on a stand-in worker, fills it with one sample
chat (a code answer, its drafted text tinted) and a sample chart history, and
saves the window and the Help → Keyboard shortcuts dialog, offscreen:

    .venv/bin/python scripts/theme_shots.py --theme dark --out docs/screenshots
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import sys
import tempfile
from pathlib import Path

QUESTION = "Write a Python function that reverses a string."
REPLY = """Here is a simple way, with slicing:

```python
def reverse(text: str) -> str:
    \"\"\"The characters of `text` in reverse order.\"\"\"
    return text[::-1]
```

`text[::-1]` steps through the string **backwards**; it works for any sequence.
"""


class StandInWorker:
    """Records what the window sends; answers nothing (the script plays the events)."""

    pid = exitcode = None

    def __init__(self) -> None:
        self.sent: list = []
        self._ids = itertools.count(1)

    def start(self) -> None: ...
    def stop(self, timeout: float = 5.0) -> None: ...
    def is_alive(self) -> bool:
        return True
    def poll(self, timeout: float = 0.0) -> list:
        return []
    def send(self, request) -> None:
        self.sent.append(request)
    def next_id(self) -> int:
        return next(self._ids)


def sample_history(window, model_id: str) -> None:
    from omnidraft.app.metrics_history import LearningMetric, ReplyMetric

    for n in range(24):
        speedup = 1.25 + 0.3 * n / 23 + (0.06 if n % 3 == 0 else -0.04)
        acceptance = 0.46 + 0.12 * n / 23 + (0.03 if n % 2 else -0.03)
        window.history.replies.append(ReplyMetric(
            1000.0 + 60 * n, model_id, "omnidraft", 128, 26.0, 4.9, acceptance, 1.8 + acceptance,
            200, int(200 * acceptance), 3.6, speedup))
        if n in (6, 13, 19):
            window.history.learning.append(LearningMetric(1030.0 + 60 * n, model_id, 4 * n, 32 * n,
                                                          2.4 - 0.05 * n, acceptance))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--theme", default="dark", choices=("light", "dark"))
    p.add_argument("--out", default="docs/screenshots")
    p.add_argument("--size", default="1280x800")
    args = p.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ["OMNIDRAFT_HOME"] = tempfile.mkdtemp(prefix="omnidraft-theme-shots-")
    os.environ["PYTHON_KEYRING_BACKEND"] = "keyring.backends.fail.Keyring"  # no banner about a real keyring

    from omnidraft.app.main_window import MainWindow
    from omnidraft.app.theme import apply_theme
    from omnidraft.core.models.catalog import ModelEntry
    from omnidraft.core.worker.protocol import ModelLoaded, WorkerReady
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv)
    apply_theme(app, args.theme)
    worker = StandInWorker()
    window = MainWindow(target="qwen", handle=worker)
    window.apply_settings({"theme": args.theme, "highlight_drafts": True}, tell_worker=False)
    window.on_event(WorkerReady(1, [ModelEntry("qwen", "Qwen2.5-Coder-1.5B-Instruct", "/q.gguf")]))
    window.on_event(ModelLoaded(worker.sent[-1].request_id, "qwen", "Qwen2.5-Coder-1.5B-Instruct", 0.1,
                                "SmolLM2-135M-Instruct"))
    store = window.store
    conv = store.new("qwen", system_prompt="You are a concise Python tutor.")
    store.append_message(conv.id, "user", QUESTION)
    # Every other word or two, as accepted drafts come: whole tokens, in runs.
    words = [(m.start(), m.end()) for m in re.finditer(r"\S+", REPLY)]
    drafted = [[a, b] for n, (a, b) in enumerate(words) if n % 3 != 1]
    store.append_message(conv.id, "assistant", REPLY, model_id="qwen", extra={
        "author": "Qwen2.5-Coder-1.5B-Instruct", "drafted": drafted, "baseline_tokens_per_s": 3.6,
        "stats": {"new_tokens": 64, "tokens_per_s": 5.6, "tokens_per_step": 2.3, "acceptance_rate": 0.58}})
    for title in ("Explain Python decorators", "Regex for ISO dates"):
        store.rename(store.new("qwen").id, title)
    sample_history(window, "qwen")
    window.charts.refresh()
    window.banner.clear()
    window.pane.show_conversation(conv.id)
    width, height = (int(v) for v in args.size.split("x"))
    window.resize(width, height)
    window.show()
    for _ in range(5):
        app.processEvents()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    window.grab().save(str(out / f"{args.theme}-theme.png"))
    dialog = window.show_shortcuts()
    for _ in range(3):
        app.processEvents()
    dialog.grab().save(str(out / f"shortcuts-{args.theme}.png"))
    print(f"saved {out / f'{args.theme}-theme.png'} and {out / f'shortcuts-{args.theme}.png'}")
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
