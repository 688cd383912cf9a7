"""The chat session in the window, against a worker whose answers the test plays:
what is sent for each thing a user does in a chat, and what is on screen and on
disk afterwards (also when the app dies in the middle of a reply)."""

from __future__ import annotations

import pytest
from omnidraft.app.chat_session import NOTES
from omnidraft.app.main_window import MainWindow
from omnidraft.core.models.catalog import ModelEntry
from omnidraft.core.storage.conversations import ConversationStore
from omnidraft.core.worker.protocol import (
    ChatRequest,
    ModelLoaded,
    TokenBatch,
    TurnDone,
    WorkerReady,
)

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
