"""The desktop app against a real engine worker running a tiny random model.

One window (and one worker process) serves the whole module: starting a
worker costs seconds, and the tests follow what a person does in one
session: chat, stop, switch targets, add a bad model, survive a worker
crash, look at the charts, close. Each test starts from a fresh chat and
waits for the app to be idle, so they do not depend on each other's details.
Pure helpers (markdown splitting, draft tinting, metrics) are tested apart.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from omnidraft.app.chat_session import NOTES
from omnidraft.app.main_window import MainWindow
from omnidraft.app.markdown_blocks import align, split_segments, tint_ranges
from omnidraft.app.message_widget import MessageWidget, mask_from_runs, runs_from_mask
from omnidraft.app.metrics_history import MetricsHistory, rolling_mean
from omnidraft.core.events import TurnStats
from omnidraft.core.models.catalog import ModelEntry
from omnidraft.core.storage.conversations import ConversationStore
from omnidraft.core.worker.protocol import (
    AddModel,
    ErrorEvent,
    LearningProgress,
    ModelLoaded,
    ModelLoading,
    Notice,
    RemoveModel,
    ResetPersonalization,
    SwitchTarget,
    TokenBatch,
    TurnDone,
    WorkerReady,
)
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from tests.gui_helpers import (
    SHORT_REPLY,
    WAIT_MS,
    IdleWorker,
    Recorder,
    ScriptedWorker,
    dispose,
    idle,
    send,
    turn,
)

LONG_REPLY = 1500  # long enough to still be streaming when the test presses Stop


# ----------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory, smol_tok):
    """Two tiny Llama targets (different seeds) with SmolLM2's real tokenizer."""
    from tiny import tiny_llama  # tests/ is on sys.path (conftest's folder)

    folders = []
    for seed in (0, 1):
        folder = tmp_path_factory.mktemp(f"tiny-target-{seed}")
        tiny_llama(len(smol_tok), seed=seed).save_pretrained(folder)
        smol_tok.save_pretrained(folder)
        folders.append(str(folder))
    return folders


@pytest.fixture(scope="module")
def window(gui_home, tiny_models, qt_loop, qapp):
    from omnidraft.app.theme import apply_theme
    from pytestqt.qtbot import QtBot

    apply_theme(qapp)
    config = gui_home / "config"
    config.mkdir(parents=True, exist_ok=True)
    # Short replies unless a test asks for a long one; greedy (the default temperature).
    (config / "settings.json").write_text(json.dumps({"max_new_tokens": SHORT_REPLY}))
    win = MainWindow(target=tiny_models[0])
    win.recorder = Recorder()
    win.bridge.event.connect(win.recorder)
    win.resize(1200, 760)
    win.show()
    win.start()
    bot = QtBot(None)
    bot.waitUntil(lambda: win.targets.current is not None, timeout=WAIT_MS)
    yield win
    if not win._closed:
        win.close()
    print("\n" + win.stall.summary())
    dispose(qapp, win)


# ----------------------------------------------------------------- with the worker


def test_window_opens_on_the_requested_target(window, tiny_models):
    assert "OmniDraft" in window.windowTitle()
    assert window.recorder.of(ModelLoaded)
    assert window.targets_menu.checked_id() == window.targets.current
    assert window.targets_menu.path_of(window.targets.current) == tiny_models[0]
    assert window.targets.progress.isHidden()
    # Tests run without a keyring: the key-file fallback is said visibly.
    assert window.keys.fallback_warning
    assert "encrypt" in window.banner.text()


def test_chat_round_trip(window, qtbot):
    window.pane.new_chat()
    replies_before = len(window.history.replies)
    qtbot.keyClicks(window.chat.composer, "first line")
    qtbot.keyClick(window.chat.composer, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert window.chat.composer.toPlainText() == "first line\n"  # Shift+Enter: newline only
    assert window.session.active is None
    window.chat.composer.clear()

    request_id = send(qtbot, window, "Hello, who are you?")
    assert window.chat.busy and window.chat.send_button.text() == "Stop"
    done = turn(qtbot, window, request_id)

    assert done.reason in ("length", "eos", "stop")
    assert done.text
    shown = window.chat.messages
    assert [m.role for m in shown] == ["user", "assistant"]
    assert shown[1].raw == done.text
    assert not window.chat.busy and window.chat.send_button.text() == "Send"
    conv = window.store.get(window.pane.current_conv)
    assert [m["role"] for m in conv.messages] == ["user", "assistant"]
    assert conv.messages[0]["content"] == "Hello, who are you?"
    assert conv.messages[1]["content"] == done.text
    assert conv.title == "Hello, who are you?"
    assert window.sidebar.current_id() == conv.id
    # TurnDone recorded in the charts with the engine's own numbers.
    assert len(window.history.replies) == replies_before + 1
    recorded = window.history.replies[-1]
    assert recorded.model_id == done.model_id == window.targets.current
    assert recorded.new_tokens == done.stats.new_tokens
    assert recorded.tokens_per_s == pytest.approx(done.stats.tokens_per_s)
    assert done.baseline_tokens_per_s  # the target's plain speed, measured when it loaded
    # The engine's estimate for this reply: its own prompt read, then plain steps.
    step = 1 / done.baseline_tokens_per_s
    plain = done.stats.first_token_seconds + (done.stats.new_tokens - 1) * step
    assert done.stats.plain_seconds == pytest.approx(plain)
    assert recorded.speedup == pytest.approx(plain / done.stats.seconds)
    assert f"{recorded.speedup:.2f}x plain speed" in window.statusBar().currentMessage()
    assert "tok/s" in window.statusBar().currentMessage()
    assert 0 < done.stats.first_token_seconds < done.stats.seconds
    assert f"first after {done.stats.first_token_seconds:.1f} s" in window.statusBar().currentMessage()


def test_stop_mid_reply_keeps_partial_text(window, qtbot):
    window.pane.new_chat()
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)  # window shortcuts fire only in the active window
    request_id = send(qtbot, window, "Tell me a very long story.", max_tokens=LONG_REPLY)
    qtbot.waitUntil(lambda: bool(window.recorder.of(TokenBatch, request_id=request_id)), timeout=WAIT_MS)
    qtbot.keyClick(window.chat.composer, Qt.Key.Key_Escape)  # Esc is the Stop shortcut
    done = turn(qtbot, window, request_id)

    assert done.reason == "cancelled"
    assert done.stats.new_tokens < LONG_REPLY
    reply = window.chat.messages[-1]
    assert reply.raw == done.text
    assert reply.note.text() == NOTES["cancelled"]
    saved = window.store.get(window.pane.current_conv).messages[-1]
    assert saved["content"] == done.text and saved["note"] == NOTES["cancelled"]


def test_switching_chats_mid_reply_loses_nothing(window, qtbot):
    window.pane.new_chat()
    other = window.pane.current_conv
    turn(qtbot, window, send(qtbot, window, "A finished chat"))
    window.pane.new_chat()
    streaming = window.pane.current_conv
    request_id = send(qtbot, window, "A long reply, please.", max_tokens=LONG_REPLY)
    qtbot.waitUntil(lambda: bool(window.recorder.of(TokenBatch, request_id=request_id)), timeout=WAIT_MS)
    other_reply = window.store.get(other).messages[-1]["content"]
    window.sidebar.list.setCurrentRow(window.sidebar.ids().index(other))  # a click in the list
    assert window.pane.current_conv == other and len(window.chat.messages) == 2
    # The reply goes on streaming into its own chat, not into the one on screen.
    streamed = len(window.session.active.text)
    qtbot.waitUntil(lambda: len(window.session.active.text) > streamed, timeout=WAIT_MS)
    assert [m.raw for m in window.chat.messages][-1] == other_reply
    window.sidebar.list.setCurrentRow(window.sidebar.ids().index(streaming))
    assert len(window.session.active.text) > streamed
    assert window.chat.messages[-1].raw == window.session.active.text
    window.pane.stop_reply()
    done = turn(qtbot, window, request_id)
    assert window.chat.messages[-1].raw == done.text
    assert window.store.get(streaming).messages[-1]["content"] == done.text
    assert window.store.get(other).messages[-1]["content"] == other_reply  # untouched


def test_system_prompt_goes_first_to_the_engine(window, qtbot, monkeypatch):
    window.pane.new_chat()
    window.pane.header.open_editor()
    qtbot.keyClicks(window.pane.header.editor, "You are terse.")
    qtbot.mouseClick(window.pane.header.save_button, Qt.MouseButton.LeftButton)
    sent: list = []
    send_request = window.bridge.send
    monkeypatch.setattr(window.bridge, "send", lambda request: sent.append(request) or send_request(request))
    done = turn(qtbot, window, send(qtbot, window, "Who are you?"))
    request = next(r for r in sent if getattr(r, "request_id", None) == done.request_id)
    assert request.messages[0] == {"role": "system", "content": "You are terse."}
    assert done.reason in ("length", "eos", "stop") and done.text  # the engine took it
    conv = window.store.get(window.pane.current_conv)
    assert conv.system_prompt == "You are terse."
    assert [m["role"] for m in conv.messages] == ["user", "assistant"]  # not a message of the chat
    assert [m.role for m in window.chat.messages] == ["user", "assistant"]


def test_continue_and_regenerate_with_the_engine(window, qtbot):
    window.pane.new_chat()
    cut = turn(qtbot, window, send(qtbot, window, "Write a long poem.", max_tokens=8))
    assert cut.reason == "length" and cut.text
    reply = window.chat.messages[-1]
    qtbot.mouseClick(reply.continue_, Qt.MouseButton.LeftButton)
    request_id = window.session.active.request_id
    more = turn(qtbot, window, request_id)
    errors = [e.message + e.detail for e in window.recorder.of(ErrorEvent, request_id=request_id)]
    assert more.reason in ("length", "eos", "stop") and more.text, errors  # the engine went on from it
    saved = window.store.get(window.pane.current_conv).messages
    assert [m["role"] for m in saved] == ["user", "assistant"]
    assert saved[1]["content"] == cut.text + more.text == window.chat.messages[-1].raw

    qtbot.mouseClick(window.chat.messages[-1].regenerate, Qt.MouseButton.LeftButton)
    again = turn(qtbot, window, window.session.active.request_id)
    assert again.text and window.chat.messages[-1].raw == again.text
    assert window.chat.messages[-1].version_label.text() == "2/2"


def test_a_chat_longer_than_the_context_setting_says_where_reading_starts(window, qtbot):
    assert window.targets.context_window == 2048  # the tiny model's, as the engine reports it
    window.apply_settings({"context_tokens": 700})  # 188 tokens of chat for the model
    try:
        window.pane.new_chat()
        for i in range(8):
            done = turn(qtbot, window, send(qtbot, window, f"Message {i}: " + " ".join(["words"] * 30)))
            if done.omitted_messages:
                break
        assert done.omitted_messages > 0 and done.reason != "error"
        messages = window.store.get(window.pane.current_conv).messages
        first_read = messages[-1]["context_from"]
        assert messages[first_read]["role"] == "user"  # whole turns are left out
        cut, column = window.chat.context_cut, window.chat.column_layout
        assert cut.isVisibleTo(window.chat) and f"the {first_read} messages above" in cut.text()
        assert column.indexOf(cut) == column.indexOf(window.chat.messages[first_read]) - 1
    finally:
        window.apply_settings({"context_tokens": 0})


def test_switch_target_keeps_conversation(window, qtbot, tiny_models, monkeypatch):
    window.pane.new_chat()
    done = turn(qtbot, window, send(qtbot, window, "Before the switch"))
    conv_id, first_model = window.pane.current_conv, window.targets.current

    # "Add local model folder…" in the Targets menu, with the folder dialog answered.
    from PySide6.QtWidgets import QFileDialog

    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: tiny_models[1])
    add = next(a for a in window.targets_menu.actions() if a.text().startswith("Add local model folder"))
    add.trigger()
    qtbot.waitUntil(
        lambda: window.targets.current not in (None, first_model), timeout=WAIT_MS
    )
    second_model = window.targets.current
    loaded = window.recorder.of(ModelLoaded, model_id=second_model)
    assert len(loaded) == 1  # progress was reported for that load
    assert window.recorder.of(ModelLoading, request_id=loaded[0].request_id, model_id=second_model)
    assert window.targets_menu.checked_id() == second_model
    assert window.targets.progress.isHidden()
    # The same conversation is on screen and continues with the new target.
    assert window.pane.current_conv == conv_id
    assert window.chat.messages[1].raw == done.text
    after = turn(qtbot, window, send(qtbot, window, "After the switch"))
    assert after.model_id == second_model
    assert len(window.store.get(conv_id).messages) == 4

    # Switching back through the menu's check-marked entry.
    back = next(a for a in window.targets_menu.actions() if a.data() == first_model)
    back.trigger()
    qtbot.waitUntil(lambda: window.targets.current == first_model, timeout=WAIT_MS)
    assert window.targets_menu.checked_id() == first_model
    assert window.pane.current_conv == conv_id


def test_bad_model_path_shows_a_message(window, qtbot, tmp_path, monkeypatch):
    idle(qtbot, window)
    shown: list[tuple[str, str]] = []
    monkeypatch.setattr(
        QMessageBox, "warning", lambda parent, title, text, *a, **k: shown.append((title, text))
    )
    current = window.targets.current
    junk = tmp_path / "not-a-model"
    junk.mkdir()
    (junk / "notes.txt").write_text("hello")
    window.targets_menu.add_requested.emit(str(junk))
    qtbot.waitUntil(lambda: len(shown) == 1, timeout=WAIT_MS)
    assert shown[0][0] == "Could not add the model"
    assert "not-a-model" in shown[0][1] and "config.json" in shown[0][1]

    window.targets.switch(str(tmp_path / "missing.gguf"))
    qtbot.waitUntil(lambda: len(shown) == 2, timeout=WAIT_MS)
    assert shown[1][0] == "Could not load the model"
    assert "does not exist" in shown[1][1]
    # The model that was answering still is, and still has the check mark.
    assert window.targets.current == current
    assert window.targets_menu.checked_id() == current
    assert window.targets.progress.isHidden()


def test_worker_killed_is_restarted_and_nothing_is_lost(window, qtbot):
    window.pane.new_chat()
    done = turn(qtbot, window, send(qtbot, window, "A question before the crash"))
    conv_id, target = window.pane.current_conv, window.targets.current
    old_pid = window.bridge.handle.pid
    loads_before = len(window.recorder.of(ModelLoaded))

    request_id = send(qtbot, window, "Keep talking", max_tokens=LONG_REPLY)
    qtbot.waitUntil(lambda: bool(window.recorder.of(TokenBatch, request_id=request_id)), timeout=WAIT_MS)
    window.bridge.handle.kill()  # SIGKILL, as a crash or the OOM killer would

    qtbot.waitUntil(lambda: "stopped unexpectedly" in window.banner.text(), timeout=WAIT_MS)
    assert window.isVisible()
    qtbot.waitUntil(lambda: len(window.recorder.of(ModelLoaded)) > loads_before, timeout=WAIT_MS)
    assert window.bridge.handle.pid != old_pid and window.bridge.is_alive()
    assert window.targets.current == target
    assert "stopped unexpectedly" not in window.banner.text()  # cleared once reloaded

    conv = window.store.get(conv_id)
    assert conv.messages[1]["content"] == done.text
    partial = conv.messages[3]
    assert partial["note"] == NOTES["worker_died"]
    assert window.chat.messages[-1].note.text() == NOTES["worker_died"]
    # Saved, not only in memory: a fresh store reads it back from disk.
    reread = ConversationStore(keys=window.keys).get(conv_id)
    assert reread.messages[3]["content"] == partial["content"]
    # And the restarted engine answers.
    again = turn(qtbot, window, send(qtbot, window, "Are you back?"))
    assert again.reason in ("length", "eos", "stop") and again.model_id == target


def test_charts_receive_metrics_and_export(window, qtbot, tmp_path):
    # A reply of its own: the plot must not rely on earlier tests having chatted.
    window.pane.new_chat()
    turn(qtbot, window, send(qtbot, window, "Chart this reply."))
    measured = [e for e in window.recorder.of(TurnDone) if e.stats and e.stats.new_tokens > 0]
    assert len(window.history.replies) == len(measured)
    assert window.charts.tps_plot.listDataItems(), "tokens-per-step plot is empty"

    # Learning progress as the worker reports it lands in the learning chart.
    target = window.targets.current
    for steps, loss, acc in ((1, 2.5, 0.1), (2, 2.1, 0.2)):
        window.on_event(LearningProgress(target, "running", steps, 8 * steps, loss, acc))
    assert [m.steps for m in window.history.learning_for(target)][-2:] == [1, 2]
    assert window.learning.label.text().startswith("Learning: running")
    assert window.charts.learning_plot.listDataItems()
    window.on_event(LearningProgress(target, "idle"))
    assert window.learning.label.text() == "Learning: idle"

    png, csv_path = tmp_path / "charts.png", tmp_path / "metrics.csv"
    window.charts.export_png(png)
    window.charts.export_csv(csv_path)
    assert png.stat().st_size > 1000
    rows = csv_path.read_text().splitlines()
    assert rows[0].startswith("kind,")
    assert sum(r.startswith("reply,") for r in rows) == len(window.history.replies)
    assert sum(r.startswith("learning,") for r in rows) == len(window.history.learning)

    window.charts.save()
    restored = MetricsHistory()
    restored.load()
    assert len(restored.replies) == len(window.history.replies)
    assert restored.learning[-1].loss == 2.1


def test_pause_learning_is_sent_and_remembered(window, qtbot):
    idle(qtbot, window)
    window.actions["pause_learning"].trigger()
    assert window.settings.learning_paused
    qtbot.waitUntil(lambda: bool(window.recorder.of(LearningProgress, state="paused")), timeout=WAIT_MS)
    assert window.learning.label.text() == "Learning: paused"
    window.actions["pause_learning"].trigger()
    assert not window.settings.learning_paused


def test_rename_and_delete_chats(window, qtbot, monkeypatch):
    from PySide6.QtWidgets import QInputDialog

    idle(qtbot, window)
    conv_id = window.pane.current_conv
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("Renamed chat", True))
    window.sidebar.ask_rename(conv_id)
    assert window.store.get(conv_id).title == "Renamed chat"
    assert window.sidebar.title_of(conv_id) == "Renamed chat"

    window.pane.new_chat()
    doomed = turn(qtbot, window, send(qtbot, window, "Short-lived chat"))
    doomed_id = window.pane.current_conv
    assert doomed.text
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    window.sidebar.ask_delete(doomed_id)
    assert doomed_id not in window.store and doomed_id not in window.sidebar.ids()
    assert window.pane.current_conv != doomed_id
    assert not (window.store.folder / f"{doomed_id}.chat").exists()


def test_settings_change_reaches_window_and_disk(window, qtbot):
    from omnidraft.app.settings_dialog import SettingsDialog
    from omnidraft.core.storage.settings import load_settings

    idle(qtbot, window)
    dialog = SettingsDialog(window.settings, "/somewhere", window)
    qtbot.addWidget(dialog)
    dialog.temperature.setValue(0.7)
    dialog.adaptive.setChecked(True)
    dialog.gamma.setValue(0.4)
    dialog.highlight.setChecked(True)
    assert dialog.data_folder.isReadOnly()
    window.apply_settings(dialog.changes())
    saved, problems = load_settings()
    assert not problems
    assert (saved.temperature, saved.adaptive_gamma, saved.highlight_drafts) == (0.7, 0.4, True)
    assert window.chat.highlight and window.actions["highlight"].isChecked()
    window.apply_settings({"temperature": 0.0, "adaptive_gamma": None, "highlight_drafts": False})
    assert not window.chat.highlight


def test_reset_personalization_asks_first(window, qtbot, monkeypatch):
    idle(qtbot, window)
    sent: list = []
    send = window.bridge.send
    monkeypatch.setattr(window.bridge, "send", lambda request: sent.append(request) or send(request))
    answers = iter([QMessageBox.StandardButton.Cancel, QMessageBox.StandardButton.Yes])
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: next(answers))
    window.actions["reset_learning"].trigger()  # Cancel: nothing is sent
    assert sent == []
    window.actions["reset_learning"].trigger()  # Yes
    assert [type(r) for r in sent] == [ResetPersonalization]
    assert sent[0].model_id == window.targets.current
    qtbot.waitUntil(lambda: bool(window.recorder.of(Notice, request_id=sent[0].request_id)), timeout=WAIT_MS)
    assert "was reset" in window.statusBar().currentMessage()


def test_close_saves_and_stops_the_worker(window, qtbot):
    idle(qtbot, window)
    conv_ids = {c.id for c in window.store.list()}
    handle = window.bridge.handle
    window.close()
    assert window._closed and not handle.is_alive()
    assert {c.id for c in ConversationStore(keys=window.keys).list()} == conv_ids
    assert (Path(os.environ["OMNIDRAFT_HOME"]) / "config" / "settings.json").exists()


# ----------------------------------------------------------------- pure helpers


def test_split_segments_finds_code_blocks_even_unclosed():
    raw = "Intro *text*\n\n```python\nprint(1)\n```\nafter\n~~~\nopen"
    segs = split_segments(raw)
    assert [(s.kind, s.lang) for s in segs] == [
        ("text", ""), ("code", "python"), ("text", ""), ("code", ""),
    ]
    assert segs[1].text == "print(1)" and raw[segs[1].start :].startswith("print(1)")
    assert segs[3].text == "open"  # still streaming: runs to the end
    assert split_segments("") == [split_segments("")[0]] and split_segments("")[0].kind == "text"


def test_draft_tint_follows_rendered_markdown():
    source = "**bold** plain"
    rendered = "bold plain"
    mapping = align(source, rendered)
    assert mapping[0] == 2 and mapping[-1] == len(source) - 1
    drafted = [False] * len(source)
    for i in range(source.index("plain"), len(source)):
        drafted[i] = True
    assert tint_ranges(drafted, 0, mapping) == [(5, 10)]
    assert mask_from_runs(runs_from_mask(drafted), len(drafted)) == drafted


def test_message_widget_tints_drafted_text(qtbot):
    widget = MessageWidget("assistant", "Model")
    qtbot.addWidget(widget)
    widget.set_highlight(True)
    widget.append([("Hello ", False), ("world", True)])
    widget.flush()  # streaming renders are paced; the finished reply is shown at once
    doc = widget.body.blocks[0].document()
    from PySide6.QtGui import QTextCursor

    def background_at(pos: int):
        cursor = QTextCursor(doc)
        cursor.setPosition(pos + 1)
        return cursor.charFormat().background().color().name()

    assert background_at(7) != background_at(1)


def test_rolling_mean_and_speedup_only_when_measured(tmp_path):
    assert rolling_mean([1, 0, 1, 0], window=2) == [1, 0.5, 0.5, 0.5]
    history = MetricsHistory(tmp_path / "m.json")
    stats = TurnStats(method="omnidraft", new_tokens=10, seconds=1.0, steps=5, proposed=4, accepted=2)
    assert history.add_turn(stats, "m", None).speedup is None  # the plain step not measured yet
    stats.plain_seconds = 2.0  # the engine's estimate, once it is
    assert history.add_turn(stats, "m", 5.0).speedup == pytest.approx(2.0)
    history.save()
    again = MetricsHistory(tmp_path / "m.json")
    again.load()
    assert [r.speedup for r in again.replies] == [None, pytest.approx(2.0)]


def test_answers_are_matched_to_their_requests_by_id(home, qapp, qt_loop, qtbot, monkeypatch):
    """Two loads and an add, answered out of order with an error tied to no request
    in between: each answer reaches the request it names, whatever the order."""
    shown: list[tuple[str, str]] = []
    monkeypatch.setattr(
        QMessageBox, "warning", lambda parent, title, text, *a, **k: shown.append((title, text))
    )
    worker = ScriptedWorker()
    win = MainWindow(target="model-a", handle=worker)
    try:
        catalog = [ModelEntry("model-a", "Model A", "/a"), ModelEntry("model-b", "Model B", "/b")]
        win.on_event(WorkerReady(1, catalog))  # the window asks for its target
        first = worker.sent[-1]
        win.targets.switch("model-b")
        second = worker.sent[-1]
        win.targets.add("/junk")
        add = worker.sent[-1]
        assert isinstance(first, SwitchTarget) and first.model_id == "model-a"
        assert isinstance(second, SwitchTarget) and second.model_id == "model-b"
        assert isinstance(add, AddModel)
        assert len({first.request_id, second.request_id, add.request_id}) == 3

        win.on_event(ErrorEvent(None, "Learning stopped: adapter exploded"))
        assert "Learning stopped" in win.banner.text()
        assert set(win.targets.loads) == {first.request_id, second.request_id}  # no load failed
        win.on_event(ModelLoaded(second.request_id, "model-b", "Model B", 0.1, None))
        assert win.targets.current == "model-b" and win.targets_menu.checked_id() == "model-b"
        win.on_event(ErrorEvent(add.request_id, "/junk is not a model"))
        win.on_event(ErrorEvent(first.request_id, "model-a is broken"))
        qtbot.waitUntil(lambda: len(shown) == 2)
        assert shown[0] == ("Could not add the model", "/junk is not a model")
        assert shown[1][0] == "Could not load the model" and shown[1][1].startswith("model-a is broken")
        assert win.targets.current == win.targets.wanted == "model-b"  # the loaded one stays
        assert win.targets_menu.checked_id() == "model-b" and win.targets.progress.isHidden()
        assert not win.targets.loads and not win.targets.adds
    finally:
        win.close()
        dispose(qapp, win)


def test_an_added_model_that_fails_to_load_can_be_removed_from_the_list(home, qapp, qt_loop, qtbot,
                                                                       monkeypatch):
    asked: list[str] = []

    def answer(parent, title, text, *args, **kwargs):
        asked.append(text)
        return QMessageBox.StandardButton.Yes

    monkeypatch.setattr(QMessageBox, "warning", answer)
    worker = ScriptedWorker()
    win = MainWindow(target="mine", handle=worker)
    try:
        win.on_event(WorkerReady(1, [ModelEntry("mine", "My model", "/m.gguf")]))
        load = worker.sent[-1]
        win.on_event(ErrorEvent(load.request_id, "My model could not be loaded: its files are damaged."))
        qtbot.waitUntil(lambda: len(asked) == 1)
        assert "Remove My model from the model list?" in asked[0]
        removal = worker.sent[-1]
        assert isinstance(removal, RemoveModel) and removal.model_id == "mine"
    finally:
        win.close()
        dispose(qapp, win)


def test_window_restores_saved_chart_history(home, qapp, qt_loop):
    saved = MetricsHistory()
    stats = TurnStats(method="omnidraft", new_tokens=8, seconds=2.0, steps=5, proposed=8, accepted=2,
                      plain_seconds=4.0)
    saved.add_turn(stats, "some-target", 2.0)
    saved.save()
    win = MainWindow(handle=IdleWorker())
    try:
        assert len(win.history.replies) == 1
        assert win.charts.target_combo.findData("some-target") >= 0
        assert win.charts.acceptance_plot.listDataItems()
        assert win.charts.speedup_plot.listDataItems()
    finally:
        win.close()
        dispose(qapp, win)


def test_window_layout_is_restored_and_a_broken_one_ignored(home, qapp, qt_loop):
    from omnidraft.core.storage import paths

    win = MainWindow(handle=IdleWorker())
    try:
        win.show()
        win.resize(780, 520)  # inside the offscreen 800x600 screen
        win.pane.setSizes([300, 480])
        win.charts_dock.hide()
        qapp.processEvents()
        sidebar = win.pane.sizes()[0]
    finally:
        win.close()
        dispose(qapp, win)
    again = MainWindow(handle=IdleWorker())
    try:
        again.show()
        qapp.processEvents()
        assert (again.width(), again.height()) == (780, 520)
        assert again.charts_dock.isHidden()
        assert again.pane.sizes()[0] == sidebar
    finally:
        again.close()
        dispose(qapp, again)
    (paths.config_dir() / "window.ini").write_text("[General]\ngeometry=@ByteArray(junk)\nstate=3\n")
    fresh = MainWindow(handle=IdleWorker())
    try:
        assert (fresh.width(), fresh.height()) == (1280, 800) and not fresh.charts_dock.isHidden()
    finally:
        fresh.close()
        dispose(qapp, fresh)


def test_clear_all_data_keeps_only_the_key(home, qapp, qt_loop):
    from omnidraft.core.storage import paths

    win = MainWindow(handle=IdleWorker())
    try:
        conv = win.store.new()
        win.store.append_message(conv.id, "user", "private words")
        win.charts.add_turn(TurnStats(method="target", new_tokens=3, seconds=3.0), "m", None)
        win.charts.save()
        (paths.data_dir() / "state").mkdir()
        (paths.data_dir() / "state" / "adapter.bin").write_bytes(b"learned")
        (paths.data_dir() / "conversations" / "x.chat.corrupt").write_bytes(b"set aside")
        win.clear_all_data()
        # Tests run without a keyring, so the key lives in a file, the one thing kept.
        assert win.keys.fallback_warning is not None
        assert sorted(p.name for p in paths.data_dir().iterdir()) == ["key"]
        assert win.history.replies == [] and len(win.store) == 0
        assert "deleted" in win.banner.text() and "Kept: key" in win.banner.text()
    finally:
        win.close()
        dispose(qapp, win)


def test_qt_binding_keeps_none_alive(qapp):
    """PySide6 6.12.0 on Python 3.11 aborts a GUI session after minutes (see app/qt_check)."""
    from omnidraft.app.qt_check import binding_problem

    assert binding_problem() is None
