"""Files in the prompt: attached by the button or dropped on the composer, shown
as chips with their token count (the engine counts them with the model's own
tokenizer), refused with a reason when binary, undecodable or too long for the
model's context, sent fenced in the message, and kept by export and import."""

from __future__ import annotations

import queue
from types import SimpleNamespace

import pytest
from omnidraft.app import theme
from omnidraft.core.storage import chat_export
from omnidraft.core.storage.attachments import (
    Attachment,
    AttachmentError,
    compose,
    fenced,
    read_attachment,
    split_attachments,
)
from omnidraft.core.worker.process import WorkerLoop
from omnidraft.core.worker.protocol import (
    ChatRequest,
    CountTokens,
    ErrorEvent,
    TokensCounted,
)
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication, QFileDialog

from tests.gui_helpers import answer, scripted_window

CODE = "def reverse(s):\n    return s[::-1]\n"


def test_a_file_is_fenced_with_its_language_and_found_again(tmp_path):
    (tmp_path / "reverse.py").write_text(CODE)
    (tmp_path / "notes.md").write_text("Has a fence:\n```\nx\n```\n")
    py, md = read_attachment(tmp_path / "reverse.py"), read_attachment(tmp_path / "notes.md")
    py.tokens, md.tokens = 12, 1
    message = compose("  What does this do?  ", [py, md])
    assert message.startswith("What does this do?\n\nFile `reverse.py` (12 tokens):\n\n```python\ndef reverse(s):")
    assert "File `notes.md` (1 token):\n\n````markdown\n" in message  # longer than the fence inside
    text, files = split_attachments(message)
    assert text == "What does this do?"
    assert [(f.name, f.text, f.tokens) for f in files] == [("reverse.py", CODE.rstrip("\n"), 12),
                                                           ("notes.md", "Has a fence:\n```\nx\n```", 1)]
    assert split_attachments("Plain text, no files.") == ("Plain text, no files.", [])


@pytest.mark.parametrize("name, data, reason", [
    ("photo.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "photo.png is a binary file, not text"),
    ("latin1.txt", "café au lait".encode("latin-1"), "latin1.txt is not UTF-8 text (byte 3 cannot"),
    ("empty.txt", b"  \n", "empty.txt is empty."),
    ("huge.log", b"x" * (600 * 1024), "huge.log is 600 KB; a file in a message is at most 512 KB."),
])
def test_what_is_not_a_text_file_is_refused_with_a_reason(tmp_path, name, data, reason):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(AttachmentError) as refused:
        read_attachment(tmp_path / name)
    assert str(refused.value).startswith(reason)


def test_the_engine_counts_with_the_targets_tokenizer_and_says_its_limit(gemma_tok):
    engine = SimpleNamespace(target=SimpleNamespace(tokenizer=gemma_tok), context_window=lambda: 8192)
    events: queue.Queue = queue.Queue()
    loop = WorkerLoop(queue.Queue(), events, engine)
    text = fenced(Attachment("reverse.py", CODE))
    loop._handle(CountTokens(7, [text, "hi"]))
    answer_ = events.get_nowait()
    assert answer_ == TokensCounted(7, [len(gemma_tok(text, add_special_tokens=False)["input_ids"]),
                                        len(gemma_tok("hi", add_special_tokens=False)["input_ids"])], 8192 - 512)
    engine.target = None  # no model loaded: a sentence, not a count
    loop._handle(CountTokens(8, ["x"]))
    error = events.get_nowait()
    assert isinstance(error, ErrorEvent) and error.request_id == 8 and "No model is loaded" in error.message


# ------------------------------------------------------------------ in the window


@pytest.fixture
def scripted(home, qapp, qt_loop):
    with scripted_window(qapp) as pair:
        yield pair
    theme.apply_theme(qapp, "light")


def counts(worker) -> list[CountTokens]:
    return [r for r in worker.sent if isinstance(r, CountTokens)]


def chips(tray) -> list[str]:
    return [c.label.text() for c in tray.chips]


def drop(widget, paths) -> None:
    """Drop files on a widget as a file manager would."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    pos = QPointF(widget.rect().center())
    enter = QDragEnterEvent(pos.toPoint(), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, enter)
    assert enter.isAccepted()
    QApplication.sendEvent(widget, QDropEvent(pos, Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                                              Qt.KeyboardModifier.NoModifier))


def test_attach_count_refuse_and_send_files_in_the_window(scripted, qtbot, tmp_path, monkeypatch):
    win, worker = scripted
    win.show()
    tray = win.chat.attachments
    (tmp_path / "reverse.py").write_text(CODE)
    (tmp_path / "big.py").write_text("x = 1\n" * 3000)
    (tmp_path / "photo.png").write_bytes(b"\x89PNG\x00\x00")

    # The attach button: a file dialog; the file is read and the engine asked to count it.
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: ([str(tmp_path / "reverse.py")], ""))
    qtbot.mouseClick(win.chat.attach_button, Qt.MouseButton.LeftButton)
    [request] = counts(worker)
    assert request.texts == [fenced(Attachment("reverse.py", CODE))]
    assert chips(tray) == ["reverse.py · counting…"] and tray.isVisible()
    qtbot.keyClicks(win.chat.composer, "Explain this")
    qtbot.keyClick(win.chat.composer, Qt.Key.Key_Return)  # not yet: the count is not back
    assert not [r for r in worker.sent if isinstance(r, ChatRequest)]
    assert "Counting" in tray.note.text()
    win.on_event(TokensCounted(request.request_id, [23], 4000))
    assert chips(tray) == ["reverse.py · 23 tokens"]

    # Dropped on the composer: a binary file is refused with why, a text file counted.
    drop(win.chat.composer.viewport(), [tmp_path / "photo.png", tmp_path / "big.py"])
    assert tray.note.text().startswith("photo.png is a binary file, not text")
    big = counts(worker)[-1]
    assert "big.py" in big.texts[0]
    win.on_event(TokensCounted(big.request_id, [3990], 4000))  # with reverse.py: 4,013 of 4,000
    assert chips(tray) == ["reverse.py · 23 tokens"]
    assert tray.note.text() == (
        "big.py was not attached: it is 3,990 tokens; with the files already attached that makes 4,013, "
        "and Model A reads at most 4,000 tokens of a chat (its context, less room for the reply).")

    # Sent: the file goes into the message, fenced, after what was typed; the chips go.
    qtbot.keyClick(win.chat.composer, Qt.Key.Key_Return)
    [chat] = [r for r in worker.sent if isinstance(r, ChatRequest)]
    sent = chat.messages[-1]["content"]
    assert sent == "Explain this\n\nFile `reverse.py` (23 tokens):\n\n```python\n" + CODE + "```"
    assert tray.chips == [] and tray.isHidden()
    answer(win, worker, "It reverses a string.")

    # The message shows what was typed, and the file as a chip that opens it.
    mine = win.chat.messages[0]
    assert mine.body.blocks[0].toPlainText() == "Explain this"
    assert [c.label.text() for c in mine.files.chips] == ["reverse.py · 23 tokens"]
    qtbot.mouseClick(mine.files.chips[0], Qt.MouseButton.LeftButton)
    shown = mine.files.views[0]
    assert shown.code() == CODE.rstrip("\n")
    qtbot.waitUntil(shown.isVisible, timeout=5000)
    qtbot.waitUntil(shown.highlighted, timeout=10_000)

    # Exported and imported (JSON and Markdown): the imported chat shows the file again.
    conv = win.store.get(win.pane.current_conv)
    for kind in ("json", "markdown"):
        path = tmp_path / f"chat.{'json' if kind == 'json' else 'md'}"
        chat_export.write_export(conv, path, kind)
        imported = chat_export.read_chat_file(path)
        new = win.store.add(imported.title, imported.messages, imported.system_prompt)
        win.pane.show_conversation(new.id)
        first = win.chat.messages[0]
        assert [c.label.text() for c in first.files.chips] == ["reverse.py · 23 tokens"], kind
        assert first.files.files[0].text == CODE.rstrip("\n")


def test_with_no_model_loaded_a_file_is_refused_with_the_engines_reason(scripted, tmp_path):
    win, worker = scripted
    tray = win.chat.attachments
    (tmp_path / "a.txt").write_text("hello")
    tray.add_paths([str(tmp_path / "a.txt")])
    request = counts(worker)[-1]
    win.on_event(ErrorEvent(request.request_id, "No model is loaded yet to count a file's tokens; "
                                                "attach it once the model has loaded."))
    assert tray.files == [] and tray.note.text().startswith("a.txt was not attached: No model is loaded yet")
    assert "No model is loaded" not in win.banner.text()  # claimed by the tray, not an engine error
