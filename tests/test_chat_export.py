"""Exporting a conversation as JSON or Markdown and importing it back (core, no Qt)."""

import json

import pytest
from omnidraft.core.storage import chat_export
from omnidraft.core.storage.chat_export import (
    ChatImportError,
    read_chat_file,
    to_json,
    to_markdown,
    write_export,
)
from omnidraft.core.storage.conversations import ConversationStore

pytestmark = pytest.mark.usefixtures("no_real_keyring")

# Text a Markdown export must carry verbatim: code fences, headings, our own marker.
TRICKY = (
    "Here is code:\n\n```python\ndef f():\n    return '### You'\n```\n\n"
    "### Assistant\n<!-- omnidraft user 3 chars -->\nend with spaces  \n\n"
)


def forked_chat(store: ConversationStore):
    """A chat with a regenerated reply and an edited question: two branch points."""
    conv = store.new(model_id="tiny", system_prompt="Answer in French.")
    store.append_message(conv.id, "user", "What is a drafter?")
    store.append_message(conv.id, "assistant", "A small model.", stats={"new_tokens": 4, "tokens_per_s": 9.5},
                         extra={"author": "Tiny", "drafted": [[0, 7]], "finish_reason": "stop"})
    store.fork(conv.id, 1, [{"role": "assistant", "content": "Un petit modèle.", "author": "Tiny"}])
    store.append_message(conv.id, "user", TRICKY)
    store.append_message(conv.id, "assistant", "")  # an empty (failed) reply
    store.fork(conv.id, 2, [{"role": "user", "content": "And a target?"}])
    return store.get(conv.id)


def test_json_export_reimports_identically_with_versions(home, tmp_path):
    store = ConversationStore()
    conv = forked_chat(store)
    path = tmp_path / "chat.json"
    write_export(conv, path, "json")
    chat = read_chat_file(path)
    again = store.add(chat.title, chat.messages, chat.system_prompt, chat.model_id, chat.created)

    assert again.id != conv.id and len(store) == 2  # a new chat; the original untouched
    before, after = conv.to_dict(), again.to_dict()
    for key in ("id", "updated"):
        before.pop(key), after.pop(key)
    assert after == before
    assert again.messages[1]["versions"][0][0]["content"] == "A small model."
    # ... and survives a restart, both branches switchable.
    reloaded = ConversationStore().get(again.id)
    assert reloaded.messages == conv.messages
    ConversationStore().switch_version(again.id, 2, 0)
    assert ConversationStore().get(again.id).messages[2]["content"] == TRICKY


def test_markdown_round_trip_of_roles_and_text(home, tmp_path):
    store = ConversationStore()
    conv = forked_chat(store)
    store.switch_version(conv.id, 2, 0)  # the version holding the tricky text
    text = to_markdown(conv, "Tiny")
    assert text.startswith("# What is a drafter?\n")
    assert "### You\n\nWhat is a drafter?\n" in text and "### Assistant (Tiny)\n\nUn petit modèle.\n" in text
    assert "### System prompt\n\nAnswer in French.\n" in text and TRICKY in text

    path = tmp_path / "chat.md"
    path.write_text(text, encoding="utf-8")
    chat = read_chat_file(path)
    assert chat.title == conv.title and chat.system_prompt == conv.system_prompt
    assert [(m["role"], m["content"]) for m in chat.messages] == [
        (m["role"], m["content"]) for m in conv.messages]
    assert chat.messages[2]["content"] == TRICKY and not chat.warnings


def test_markdown_edited_by_hand_still_imports(tmp_path):
    text = to_markdown(_conv_with("user", "Hello there"))
    path = tmp_path / "edited.md"
    path.write_text(text.replace("Hello there", "Hello there, edited"), encoding="utf-8")
    chat = read_chat_file(path)
    assert chat.messages == [{"role": "user", "content": "Hello there, edited"}]
    assert chat.warnings and "edited by hand" in chat.warnings[0]


def _conv_with(role, content):
    from omnidraft.core.storage.conversations import Conversation

    return Conversation("0" * 32, "T", 0.0, 0.0, [{"role": role, "content": content}])


@pytest.mark.parametrize("content, says", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2, 3]", "not an OmniDraft chat export"),
    (json.dumps({"format": "omnidraft-chat", "version": 1, "conversation": {"title": "x"}}).encode(),
     "not an OmniDraft chat export"),
    (json.dumps({"title": "x", "messages": [{"role": "robot", "content": "hi"}]}).encode(), "message 1"),
    (json.dumps({"title": "x", "messages": [{"role": "user", "content": "hi", "stats": {"new_tokens": "9"}}]})
     .encode(), "stats"),
    (json.dumps({"title": "x", "messages": [{"role": "user", "content": "hi", "drafted": [[0, "a"]]}]})
     .encode(), "drafted"),
    (json.dumps({"title": "x", "messages": [{"role": "user", "content": "hi", "versions": [[], None]}]})
     .encode(), "versions"),
    (json.dumps({"format": "omnidraft-chat", "version": 99, "conversation": {}}).encode(), "newer"),
    (b"\xff\xfe\x00garbage", "not a text file"),
    (b"# Just some notes\n\nNo chat here.\n", "no message markers"),
    (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
])
def test_damaged_or_wrong_shape_files_are_refused_with_a_sentence(tmp_path, content, says):
    path = tmp_path / "bad.json" if content.lstrip()[:1] in (b"{", b"[") else tmp_path / "bad.md"
    path.write_bytes(content)
    with pytest.raises(ChatImportError, match=says) as caught:
        read_chat_file(path)
    assert str(caught.value).endswith((".", "it."))  # a sentence for the user, not a traceback


def test_a_huge_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(chat_export, "MAX_IMPORT_BYTES", 1000)
    path = tmp_path / "huge.json"
    path.write_text(to_json(_conv_with("user", "x" * 2000)), encoding="utf-8")
    with pytest.raises(ChatImportError, match="at most"):
        read_chat_file(path)


def test_a_missing_file_is_a_sentence_too(tmp_path):
    with pytest.raises(ChatImportError, match="could not be read"):
        read_chat_file(tmp_path / "gone.json")
