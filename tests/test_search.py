"""Full-text search over every chat's messages (not only titles): the in-memory
index kept current as messages arrive, are edited and deleted, and the sidebar
that lists the matching lines and opens a chat at the message found."""

from __future__ import annotations

import pytest
from omnidraft.app import theme
from omnidraft.core.storage.conversations import ConversationStore
from omnidraft.core.storage.search_index import SearchIndex
from PySide6.QtCore import Qt

from tests.gui_helpers import answer, scripted_window


def chat(store: ConversationStore, title: str, *texts: str):
    conv = store.new(title=title)
    for i, text in enumerate(texts):
        store.append_message(conv.id, "user" if i % 2 == 0 else "assistant", text)
    return store.get(conv.id)


def found(index: SearchIndex, store: ConversationStore, query: str) -> list[tuple[str, int, str]]:
    index.sync(store.list())
    return [(h.conv_id, h.index, h.line) for h in
            index.search(query, lambda c, i: store.get(c).messages[i]["content"])]


def test_the_index_finds_message_text_and_follows_every_change(tmp_path):
    store = ConversationStore(tmp_path / "chats")
    a = chat(store, "Strings", "How do I reverse a string?",
             "Use slicing:\n\n```python\ndef reverse(s):\n    return s[::-1]\n```")
    b = chat(store, "Lists", "Sort a list of tuples by the second item")
    index = SearchIndex()
    assert index.sync(store.list()) == 2  # built once, at start

    # Text inside messages, not only titles; case-insensitive; inside words; the line shown.
    assert found(index, store, "RETURN S[::-1]") == [(a.id, 1, "return s[::-1]")]
    assert found(index, store, "revers") == [(a.id, 0, "How do I reverse a string?"),
                                             (a.id, 1, "def reverse(s):")]
    assert found(index, store, "tuples second") == [(b.id, 0, "Sort a list of tuples by the second item")]
    assert found(index, store, "tuples reverse") == []  # every word in one message

    # A message arrives: found; only that chat is indexed again.
    store.append_message(b.id, "assistant", "sorted(items, key=lambda t: t[1])")
    assert index.sync(store.list()) == 1
    assert found(index, store, "lambda") == [(b.id, 1, "sorted(items, key=lambda t: t[1])")]

    # An edit (a fork): the new text is found, the replaced one is not.
    store.fork(a.id, 0, [{"role": "user", "content": "How do I split a string?"}])
    assert found(index, store, "split") == [(a.id, 0, "How do I split a string?")]
    assert found(index, store, "slicing") == []

    # A deleted chat is gone from the results.
    store.delete(b.id)
    assert found(index, store, "lambda") == []
    assert index.sync(store.list()) == 0 and len(index) == 1


def test_the_index_is_never_written_to_disk(tmp_path):
    store = ConversationStore(tmp_path / "chats")
    chat(store, "Secret", "the launch code is plaintext-marker-7731")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    index = SearchIndex()
    index.sync(store.list())
    assert found(index, store, "plaintext-marker") != []
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before  # no index file, and the chat files still hold no plaintext
    assert not any(b"plaintext-marker" in data for data in after.values())


def test_a_long_line_is_cut_around_the_match(tmp_path):
    store = ConversationStore(tmp_path / "chats")
    chat(store, "Long", "word " * 60 + "needle " + "word " * 60)
    index = SearchIndex()
    [(_, _, line)] = found(index, store, "needle")
    assert "needle" in line and line.startswith("…") and line.endswith("…") and len(line) < 100


# ------------------------------------------------------------------ the sidebar


@pytest.fixture
def scripted(home, qapp, qt_loop):
    with scripted_window(qapp) as pair:
        yield pair
    theme.apply_theme(qapp, "light")


def results(win) -> list[str]:
    return [win.sidebar.results.item(i).text() for i in range(win.sidebar.results.count())]


def test_searching_the_sidebar_lists_matching_lines_and_opens_the_chat_at_the_message(scripted, qtbot,
                                                                                      monkeypatch):
    win, worker = scripted
    monkeypatch.setattr(win.chat, "FOUND_MS", 120_000)  # the mark outlasts a slow machine's waits
    win.resize(1100, 700)
    win.show()
    store = win.store
    filler = [f"Message number {i} about nothing in particular.\n" * 6 for i in range(30)]
    long_chat = chat(store, "Weekend plans", *filler[:20], "The zebra crossing is by the bakery.", *filler[20:])
    chat(store, "Other", "Nothing here either")
    win.pane.show_conversation(store.list()[0].id)  # on the other chat
    # A reply arrives in a chat while the app runs: its text is searchable too.
    win.pane.send_message("Where is the zebra?")
    answer(win, worker, "Try the zebra crossing near the park.")

    qtbot.keyClicks(win.sidebar.search, "zebra crossing")
    qtbot.waitUntil(lambda: len(results(win)) == 2, timeout=5000)
    assert results(win)[0].endswith("Reply: Try the zebra crossing near the park.")
    assert results(win)[1] == "Weekend plans\nYou: The zebra crossing is by the bakery."
    assert win.sidebar.results_title.text() == "In messages · 2"

    item = win.sidebar.results.item(1)
    rect = win.sidebar.results.visualItemRect(item)
    qtbot.mouseClick(win.sidebar.results.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    qtbot.waitUntil(lambda: win.pane.current_conv == long_chat.id, timeout=5000)
    target = next(w for w in win.chat.messages if w.index == 20)
    assert target.property("found") is True

    def target_in_view() -> bool:
        bar = win.chat.scroll.verticalScrollBar()
        top = target.mapTo(win.chat.scroll.widget(), target.rect().topLeft()).y()
        return bar.value() > 0 and 0 <= top - bar.value() < win.chat.scroll.viewport().height()

    qtbot.waitUntil(target_in_view, timeout=5000)
    qtbot.wait(300)  # the chat does not jump back to its bottom once the layout settles
    assert target_in_view()

    # A deleted chat's messages leave the results.
    win.pane._delete(long_chat.id)
    win.sidebar.refresh_results()
    assert len(results(win)) == 1
    win.sidebar.search.clear()
    assert win.sidebar.results.isHidden() and win.sidebar.results_title.isHidden()
