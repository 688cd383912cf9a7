"""File → Export chat as Markdown / JSON and Import chat in the window, and a
reply's Copy, against a worker whose answers the test plays. The formats
themselves are tested in test_chat_export."""

from __future__ import annotations

import pytest
from omnidraft.app import chat_files
from omnidraft.core.storage import chat_export
from omnidraft.core.storage.conversations import ConversationStore
from PySide6.QtGui import QGuiApplication
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QFileDialog, QMessageBox

from tests.gui_helpers import answer, scripted_window

REPLY = "Use a list:\n\n```python\nitems = [1, 2]\n```\n\n**Done.**"


@pytest.fixture
def scripted(home, qapp, qt_loop):
    with scripted_window(qapp) as pair:
        yield pair


@pytest.fixture
def boxes(monkeypatch):
    shown = []
    monkeypatch.setattr(QMessageBox, "warning", lambda parent, title, text, *a, **k: shown.append((title, text)))
    return shown


def forked_chat(win, worker) -> str:
    """A chat as a person makes one: a question, a reply, the reply regenerated."""
    win.pane.new_chat()
    win.pane.send_message("How do I keep two numbers?")
    answer(win, worker, "With a tuple.")
    win.actions["regenerate"].trigger()
    answer(win, worker, REPLY)
    conv = win.store.get(win.pane.current_conv)
    assert conv.messages[1]["versions"][0][0]["content"] == "With a tuple."  # really forked
    return conv.id


def menu_texts(win, title: str) -> list[str]:
    menu = next(a.menu() for a in win.menuBar().actions() if a.text() == title)
    return [a.text() for a in menu.actions()]


def test_json_export_from_the_file_menu_reimports_as_a_new_identical_chat(scripted, tmp_path, monkeypatch):
    win, worker = scripted
    assert {"Export chat as Markdown…", "Export chat as JSON…", "Import chat…"} <= set(menu_texts(win, "&File"))
    conv_id = forked_chat(win, worker)
    original = win.store.get(conv_id).to_dict()
    # The menu's dialog, given a name without the extension: the extension is added.
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(tmp_path / "mine"), ""))
    win.actions["export_json"].trigger()
    assert (tmp_path / "mine.json").exists()

    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(tmp_path / "mine.json"), ""))
    win.actions["import_chat"].trigger()  # read and saved on a background thread
    win.files.importing.join(30)
    QTest.qWait(50)  # its answer arrives through the event loop
    new_id = win.pane.current_conv
    assert new_id != conv_id and len(win.store) == 2
    assert win.sidebar.ids()[0] == new_id  # listed first, and on screen
    imported = win.store.get(new_id).to_dict()
    for record in (original, imported):
        record.pop("id"), record.pop("updated")
    assert imported == original
    assert win.store.get(conv_id).to_dict()["messages"] == original["messages"]  # the original untouched
    assert "Imported" in win.statusBar().currentMessage()
    # Both versions came along and survive a restart.
    assert ConversationStore(keys=win.keys).get(new_id).messages[1]["versions"][0][0]["content"] == "With a tuple."
    assert [w.raw for w in win.chat.messages] == ["How do I keep two numbers?", REPLY]


def test_markdown_export_reads_well_and_imports_back(scripted, tmp_path):
    win, worker = scripted
    conv_id = forked_chat(win, worker)
    path = tmp_path / "chat.md"
    assert win.files.export("markdown", path)
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# How do I keep two numbers?\n")
    assert "### You\n\nHow do I keep two numbers?\n" in text
    assert f"### Assistant (Model A)\n\n{REPLY}\n" in text  # the reply's Markdown, code block and all

    new_id = win.files.import_file(path)
    messages = win.store.get(new_id).messages
    assert [(m["role"], m["content"]) for m in messages] == [
        (m["role"], m["content"]) for m in win.store.get(conv_id).messages]


@pytest.mark.parametrize("name, content, says", [
    ("broken.json", '{"format": "omnidraft-chat", "version": 1, "conversation": {"title": "x", "mess',
     "not valid JSON"),
    ("shape.json", '{"title": "x", "messages": [{"role": "user", "content": 42}]}', "message 1 has no text"),
    ("notes.md", "# My notes\n\nNothing exported here.\n", "no message markers"),
])
def test_a_damaged_import_says_why_and_changes_nothing(scripted, tmp_path, boxes, name, content, says):
    win, worker = scripted
    conv_id = forked_chat(win, worker)
    folder = win.store.folder
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")

    assert win.files.import_file(path) is None
    assert len(boxes) == 1 and says in boxes[0][1] and chat_files.UNCHANGED in boxes[0][1]
    assert len(win.store) == 1 and win.pane.current_conv == conv_id
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_a_file_over_the_size_cap_is_refused_with_a_message(scripted, tmp_path, boxes, monkeypatch):
    win, _ = scripted
    assert chat_export.MAX_IMPORT_BYTES == 20 * 2**20
    monkeypatch.setattr(chat_export, "MAX_IMPORT_BYTES", 2**20)
    path = tmp_path / "big.json"
    path.write_bytes(b" " * (2**20 + 1))
    assert win.files.import_file(path) is None
    assert "at most 1 MB" in boxes[0][1] and len(win.store) == 0


def test_export_with_no_chat_on_screen_says_so(scripted):
    win, _ = scripted
    win.pane.show_conversation(None)
    win.actions["export_markdown"].trigger()
    assert "Open a chat" in win.statusBar().currentMessage()


def test_copy_on_a_reply_gives_its_markdown_source(scripted):
    win, worker = scripted
    forked_chat(win, worker)
    reply = win.chat.messages[-1]
    reply.copy.click()
    assert QGuiApplication.clipboard().text() == REPLY  # fences, bold and all
    code = reply.body.code_blocks()[0]
    assert code.code() == "items = [1, 2]"  # the code block's own Copy: just the code
