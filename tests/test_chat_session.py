"""The chat session in the window, against a worker whose answers the test plays:
what is sent for each thing a user does in a chat, and what is on screen and on
disk afterwards (also when the app dies in the middle of a reply)."""

from __future__ import annotations

import pytest
from omnidraft.app.chat_header import NO_PROMPT
from omnidraft.app.chat_session import NOTES
from omnidraft.app.main_window import MainWindow
from omnidraft.core.models.catalog import ModelEntry
from omnidraft.core.models.chat_format import encode_chat
from omnidraft.core.storage.conversations import ConversationStore
from omnidraft.core.worker.protocol import (
    ChatRequest,
    ModelLoaded,
    TokenBatch,
    TurnDone,
    WorkerReady,
)
from PySide6.QtCore import Qt

from tests.gui_helpers import IdleWorker, ScriptedWorker, dispose


@pytest.fixture
def scripted(home, qapp, qt_loop):
    """A window on a scripted worker with "Model A" loaded; yields (window, worker)."""
    worker = ScriptedWorker()
    win = MainWindow(target="model-a", handle=worker)
    win.on_event(WorkerReady(1, [ModelEntry("model-a", "Model A", "/a")]))
    win.on_event(ModelLoaded(worker.sent[-1].request_id, "model-a", "Model A", 0.1, None))
    try:
        yield win, worker
    finally:
        win.close()
        dispose(qapp, win)


def last_chat_request(worker: ScriptedWorker) -> ChatRequest:
    return [r for r in worker.sent if isinstance(r, ChatRequest)][-1]


def on_disk(win, conv_id: str) -> list[dict]:
    """The conversation as a restarted app would read it."""
    return ConversationStore(keys=win.keys).get(conv_id).messages


def test_a_gui_killed_mid_reply_leaves_the_partial_reply_with_a_note(scripted, qapp, qtbot):
    win, worker = scripted
    win.pane.send_message("Tell me a story")
    request, conv_id = last_chat_request(worker), win.pane.current_conv
    # Before any text: the empty reply on disk already says it was interrupted.
    assert on_disk(win, conv_id)[-1] == {
        "role": "assistant", "content": "", "author": "Model A", "note": NOTES["interrupted"],
    }
    win.on_event(TokenBatch(request.request_id, [("Once upon", False), (" a time", True)]))
    qtbot.waitUntil(lambda: on_disk(win, conv_id)[-1]["content"] == "Once upon a time", timeout=5000)

    # The app is killed here: no TurnDone, no close. A restart reads and shows:
    saved = on_disk(win, conv_id)[-1]
    assert saved["note"] == NOTES["interrupted"] and saved["drafted"] == [[9, 16]]
    restarted = MainWindow(handle=IdleWorker())
    try:
        assert restarted.pane.current_conv == conv_id
        reply = restarted.chat.messages[-1]
        assert (reply.raw, reply.note.text()) == ("Once upon a time", NOTES["interrupted"])
    finally:
        restarted.close()
        dispose(qapp, restarted)

    # While it streams the window shows no such note; a reply that ends drops it.
    assert win.chat.messages[-1].note.isHidden()
    win.on_event(TurnDone(request.request_id, "Once upon a time.", "eos", None, "model-a", None))
    assert "note" not in on_disk(win, conv_id)[-1]
    assert on_disk(win, conv_id)[-1]["content"] == "Once upon a time."


def test_system_prompt_per_chat_with_a_default_from_settings(scripted, qapp, qtbot, smol_tok):
    win, worker = scripted
    win.apply_settings({"system_prompt": "  Answer like a pirate.  "})
    win.pane.new_chat()
    first = win.pane.current_conv
    assert win.store.get(first).system_prompt == "Answer like a pirate."
    assert win.pane.header.summary.text() == "Answer like a pirate."

    # Edited in the header, as a person would: Edit, type, Save.
    header = win.pane.header
    qtbot.mouseClick(header.edit_button, Qt.MouseButton.LeftButton)
    assert header.editing.isVisibleTo(header) and header.editor.toPlainText() == "Answer like a pirate."
    header.editor.clear()
    qtbot.keyClicks(header.editor, "Be brief.")
    qtbot.mouseClick(header.save_button, Qt.MouseButton.LeftButton)
    assert not header.editing.isVisibleTo(header)
    assert win.store.get(first).system_prompt == "Be brief."

    win.pane.send_message("Hello")
    request = last_chat_request(worker)
    assert request.messages == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"},
    ]
    # It reaches the model as the chat template's system turn.
    text = smol_tok.decode(encode_chat(smol_tok, request.messages))
    assert "<|im_start|>system\nBe brief.<|im_end|>" in text
    win.on_event(TurnDone(request.request_id, "Arr.", "eos", None, "model-a", None))

    # Another chat keeps its own; the prompt of each survives a restart.
    win.pane.new_chat()
    assert win.pane.header.summary.text() == "Answer like a pirate."
    win.pane.set_system_prompt("")
    assert win.store.get(win.pane.current_conv).system_prompt == ""
    assert header.summary.text() == NO_PROMPT
    assert ConversationStore(keys=win.keys).get(first).system_prompt == "Be brief."


def test_chats_saved_before_system_prompts_still_open(home, qapp, qt_loop):
    from omnidraft.core.storage import paths
    from omnidraft.core.storage.secure_store import default_keystore, save_encrypted

    conv_id = "0" * 32
    old = {"id": conv_id, "title": "Old chat", "created": 1.0, "updated": 2.0, "model_id": None,
           "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    save_encrypted(paths.data_dir() / "conversations" / f"{conv_id}.chat", old, default_keystore())
    win = MainWindow(handle=IdleWorker())
    try:
        assert win.pane.current_conv == conv_id and not win.store.warnings
        assert [(m.author.text(), m.raw) for m in win.chat.messages] == [
            ("You", "hi"), ("qwen2.5-coder-1.5b-instruct", "hello")]  # no catalog here: the id
        assert win.pane.header.summary.text() == NO_PROMPT
    finally:
        win.close()
        dispose(qapp, win)


def answer(win, worker, text: str, reason: str = "eos") -> ChatRequest:
    """Play the engine's whole answer to the last request; returns that request."""
    request = last_chat_request(worker)
    win.on_event(TokenBatch(request.request_id, [(text, False)]))
    win.on_event(TurnDone(request.request_id, text, reason, None, "model-a", None))
    return request


def shown(win) -> list[str]:
    return [m.raw for m in win.chat.messages]


def test_editing_a_past_message_forks_and_both_branches_survive_a_restart(scripted, qapp, qtbot):
    win, worker = scripted
    for question, reply in (("Q1", "A1"), ("Q2", "A2")):
        win.pane.send_message(question)
        answer(win, worker, reply)
    conv_id = win.pane.current_conv

    first = win.chat.messages[0]
    assert first.edit.isVisibleTo(first) and first.version is None
    qtbot.mouseClick(first.edit, Qt.MouseButton.LeftButton)
    first.editor.setPlainText("Q1, said better")
    qtbot.mouseClick(first.send_edit, Qt.MouseButton.LeftButton)
    assert last_chat_request(worker).messages == [{"role": "user", "content": "Q1, said better"}]
    assert not win.chat.messages[0].next.isEnabled()  # busy: no switching under a reply
    answer(win, worker, "B1")
    assert shown(win) == ["Q1, said better", "B1"]
    assert win.chat.messages[0].version_label.text() == "2/2"

    qtbot.mouseClick(win.chat.messages[0].previous, Qt.MouseButton.LeftButton)
    assert shown(win) == ["Q1", "A1", "Q2", "A2"]
    assert win.chat.messages[0].version_label.text() == "1/2"

    restarted = MainWindow(handle=IdleWorker())
    try:
        assert restarted.pane.current_conv == conv_id
        assert shown(restarted) == ["Q1", "A1", "Q2", "A2"]
        qtbot.mouseClick(restarted.chat.messages[0].next, Qt.MouseButton.LeftButton)
        assert shown(restarted) == ["Q1, said better", "B1"]
    finally:
        restarted.close()
        dispose(qapp, restarted)


def test_regenerate_keeps_the_old_reply_as_another_version(scripted, qtbot):
    win, worker = scripted
    win.pane.send_message("Name a colour.")
    answer(win, worker, "Red.")
    user, reply = win.chat.messages
    assert reply.regenerate.isVisibleTo(reply) and not user.regenerate.isVisibleTo(user)
    qtbot.mouseClick(reply.regenerate, Qt.MouseButton.LeftButton)
    request = last_chat_request(worker)
    assert request.messages == [{"role": "user", "content": "Name a colour."}]
    assert not win.chat.messages[-1].regenerate.isEnabled()  # while it is written
    answer(win, worker, "Blue.")
    assert shown(win) == ["Name a colour.", "Blue."]
    assert win.chat.messages[1].version_label.text() == "2/2"
    qtbot.mouseClick(win.chat.messages[1].previous, Qt.MouseButton.LeftButton)
    assert shown(win) == ["Name a colour.", "Red."]
    assert [m["content"] for m in on_disk(win, win.pane.current_conv)] == ["Name a colour.", "Red."]


def test_continue_goes_on_from_a_reply_cut_at_the_token_limit(scripted, qtbot):
    win, worker = scripted
    win.pane.send_message("Tell me a story.")
    answer(win, worker, "Once upon", reason="length")
    reply = win.chat.messages[-1]
    assert reply.note.text() == NOTES["length"] and reply.continue_.isVisibleTo(reply)
    qtbot.mouseClick(reply.continue_, Qt.MouseButton.LeftButton)
    request = last_chat_request(worker)
    assert request.messages[-1] == {"role": "assistant", "content": "Once upon"}  # the model goes on from it
    win.on_event(TokenBatch(request.request_id, [(" a time", True)]))
    assert win.chat.messages[-1].raw == "Once upon a time"
    win.on_event(TurnDone(request.request_id, " a time", "eos", None, "model-a", None))

    saved = on_disk(win, win.pane.current_conv)[-1]
    assert (saved["content"], saved["finish_reason"], saved["drafted"]) == ("Once upon a time", "eos", [[9, 16]])
    assert "note" not in saved
    reply = win.chat.messages[-1]
    assert len(win.chat.messages) == 2 and reply.note.isHidden()
    assert not reply.continue_.isVisibleTo(reply) and reply.regenerate.isVisibleTo(reply)


def test_the_chat_says_where_the_model_stopped_reading(scripted, qtbot):
    """TurnDone.omitted_messages counts the messages sent; a failed empty reply was
    not sent, so the line goes above the first message the model read."""
    win, worker = scripted
    win.pane.send_message("Q1")
    answer(win, worker, "A1")
    win.pane.send_message("Q2")
    answer(win, worker, "", reason="error")  # failed: not sent again
    win.pane.send_message("Q3")
    request = last_chat_request(worker)
    assert [m["content"] for m in request.messages] == ["Q1", "A1", "Q2", "Q3"]
    win.on_event(TurnDone(request.request_id, "A3", "eos", None, "model-a", None, omitted_messages=3))

    cut, column = win.chat.context_cut, win.chat.column_layout
    assert cut.isVisibleTo(win.chat) and "the 4 messages above" in cut.text()
    assert column.indexOf(cut) == column.indexOf(win.chat.messages[4]) - 1  # just above Q3
    assert on_disk(win, win.pane.current_conv)[-1]["context_from"] == 4
    win.pane.send_message("Q4")  # the next reply read everything again: no line
    answer(win, worker, "A4")
    assert not cut.isVisibleTo(win.chat)


def test_context_length_setting_is_offered_up_to_the_models(scripted, qtbot):
    from omnidraft.app.settings_dialog import SettingsDialog

    win, _ = scripted
    dialog = SettingsDialog(win.settings, "/data", win, max_context=2048)
    qtbot.addWidget(dialog)
    assert dialog.context.maximum() == 2048 and "2,048" in dialog.context.specialValueText()
    assert dialog.context.value() == 0 and "context_tokens" not in dialog.changes()  # the model's
    dialog.context.setValue(5000)  # more than this model reads: held at its bound
    assert dialog.changes()["context_tokens"] == 2048
    win.apply_settings(dialog.changes())
    assert win.settings.context_tokens == 2048


def test_a_message_sent_while_the_engine_starts_is_answered_after_its_first_load(home, qapp, qtbot):
    """Typed before the worker is ready, a message waits for the load the window then
    asks for, and is sent after it (the worker serves in order); one stopped while it
    waits never reaches the engine."""
    from omnidraft.core.worker.protocol import SwitchTarget

    worker = ScriptedWorker()
    win = MainWindow(target="model-a", handle=worker)
    try:
        win.pane.send_message("Hello before the engine is up")
        assert worker.sent == []  # nothing reaches a worker that is not ready
        assert win.session.active is not None  # the reply is on its way, not an error
        win.on_event(WorkerReady(1, [ModelEntry("model-a", "Model A", "/a")]))
        kinds = [type(r) for r in worker.sent]
        assert kinds.index(SwitchTarget) < kinds.index(ChatRequest)
        request = last_chat_request(worker)
        assert request.messages[-1]["content"] == "Hello before the engine is up"
        switch = next(r for r in worker.sent if isinstance(r, SwitchTarget))
        win.on_event(ModelLoaded(switch.request_id, "model-a", "Model A", 0.1, None))
        win.on_event(TokenBatch(request.request_id, [("Hi there.", False)]))
        win.on_event(TurnDone(request.request_id, "Hi there.", "eos", None, "model-a", None))
        conv_id = win.pane.current_conv
        assert on_disk(win, conv_id)[-1]["content"] == "Hi there."

        # The engine dies and restarts; a message sent meanwhile and stopped is never sent.
        win._on_worker_died("The engine stopped unexpectedly.")
        sent_before = len(worker.sent)
        win.pane.send_message("Never mind")
        assert win.pane.stop_reply() is None and win.session.active is None
        assert on_disk(win, conv_id)[-1]["finish_reason"] == "cancelled"
        win.on_event(WorkerReady(1, [ModelEntry("model-a", "Model A", "/a")]))
        assert not [r for r in worker.sent[sent_before:] if isinstance(r, ChatRequest)]
    finally:
        win.close()
        dispose(qapp, win)
