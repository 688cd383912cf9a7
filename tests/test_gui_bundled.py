"""A new user's first start, with the bundled models (integration tier):
the app opens on Qwen2.5-Coder-1.5B-Instruct with the real SmolLM2 drafter, a
chat reply is drafted and verified across the two vocabularies, the charts show
its acceptance and measured speedup, switching to the 0.5B and back keeps the
conversation, and "Learn now" trains
the drafter on what was served."""

from __future__ import annotations

import pytest
from omnidraft.app.main_window import MainWindow
from omnidraft.core.models.catalog import QWEN05_ID, QWEN15_ID, SMOLLM2_ID
from omnidraft.core.worker.protocol import LearningProgress

from tests.gui_helpers import WAIT_MS, Recorder, dispose, send, turn

pytestmark = pytest.mark.integration
REPLY = 48


@pytest.fixture(scope="module")
def app_window(gui_home, qt_loop, qapp):
    from omnidraft.app.theme import apply_theme
    from pytestqt.qtbot import QtBot

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMNIDRAFT_DRAFTER", SMOLLM2_ID)  # the real drafter, not the tests' tiny one
        apply_theme(qapp)
        win = MainWindow()  # no target named: the app's default
        win.recorder = Recorder()
        win.bridge.event.connect(win.recorder)
        win.show()
        win.start()
        QtBot(None).waitUntil(lambda: win.targets.current is not None, timeout=3 * WAIT_MS)
        yield win
        if not win._closed:
            win.close()
        dispose(qapp, win)


def test_first_session_with_the_bundled_models(app_window, qtbot):
    win = app_window
    assert win.targets.current == QWEN15_ID
    assert win.targets_menu.checked_id() == QWEN15_ID
    labels = [a.text() for a in win.targets_menu.actions()]
    assert any(t.startswith("Qwen2.5-Coder-1.5B-Instruct  (1.1 GB, chat and code") for t in labels)
    assert any("base model" in t for t in labels)

    done = turn(qtbot, win, send(qtbot, win, "Write a Python function that adds two numbers.", REPLY))
    assert done.reason in ("length", "eos") and done.text.strip()
    assert done.stats.method == "omnidraft" and done.stats.proposed > 0
    assert done.baseline_tokens_per_s and done.baseline_tokens_per_s > 0  # measured at load
    reply = win.history.replies[-1]
    assert reply.acceptance_rate == pytest.approx(done.stats.acceptance_rate)
    assert reply.speedup == pytest.approx(done.stats.speedup) and reply.speedup > 0
    assert win.charts.acceptance_plot.listDataItems() and win.charts.speedup_plot.listDataItems()
    conv_id = win.pane.current_conv

    win.targets.switch(QWEN05_ID)
    qtbot.waitUntil(lambda: win.targets.current == QWEN05_ID and win.session.active is None, timeout=3 * WAIT_MS)
    assert win.targets_menu.checked_id() == QWEN05_ID and win.pane.current_conv == conv_id
    other = turn(qtbot, win, send(qtbot, win, "And one that multiplies them?", REPLY))
    assert other.model_id == QWEN05_ID and other.text.strip()

    win.targets.switch(QWEN15_ID)
    qtbot.waitUntil(lambda: win.targets.current == QWEN15_ID and win.session.active is None, timeout=3 * WAIT_MS)
    assert [m["role"] for m in win.store.get(conv_id).messages] == ["user", "assistant"] * 2
    turn(qtbot, win, send(qtbot, win, "Now write one that subtracts them.", REPLY))

    win.learning.learn_now()
    qtbot.waitUntil(
        lambda: any(e.steps > 0 for e in win.recorder.of(LearningProgress, model_id=QWEN15_ID)),
        timeout=5 * WAIT_MS,
    )
    assert win.history.learning_for(QWEN15_ID)
