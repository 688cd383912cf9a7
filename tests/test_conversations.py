"""The persisted, encrypted conversation list."""

import threading
import time

import pytest
from keyring.backends import fail
from omnidraft.core.storage import conversations
from omnidraft.core.storage.conversations import (
    DEFAULT_TITLE,
    ConversationStore,
    title_from,
    version_of,
)
from omnidraft.core.storage.paths import data_dir
from omnidraft.core.storage.secure_store import KeyStore, save_encrypted

pytestmark = pytest.mark.usefixtures("no_real_keyring")


def test_new_append_and_reload(home):
    store = ConversationStore()
    conv = store.new(model_id="gemma-3-270m")
    store.append_message(conv.id, "user", "What is a drafter?\nIn two lines.")
    store.append_message(conv.id, "assistant", "A small model", stats={"tokens_per_s": 12.5})
    store.update_last_message(conv.id, "A small model that proposes tokens.", {"tokens_per_s": 13.0})

    again = ConversationStore().get(conv.id)
    assert again.title == "What is a drafter?"
    assert again.model_id == "gemma-3-270m"
    assert again.messages == [
        {"role": "user", "content": "What is a drafter?\nIn two lines."},
        {"role": "assistant", "content": "A small model that proposes tokens.",
         "stats": {"tokens_per_s": 13.0}},
    ]


def test_files_are_encrypted_one_per_conversation(home):
    store = ConversationStore()
    for word in ("alpha-secret", "beta-secret"):
        store.append_message(store.new().id, "user", word)
    files = sorted((data_dir() / "conversations").glob("*.chat"))
    assert len(files) == 2
    for f in files:
        assert b"secret" not in f.read_bytes()


def test_list_is_newest_first_and_touching_moves_up(home):
    store = ConversationStore()
    a, b, c = store.new(title="a"), store.new(title="b"), store.new(title="c")
    assert [x.title for x in store.list()] == ["c", "b", "a"]
    store.append_message(a.id, "user", "hello")
    assert [x.id for x in store.list()] == [a.id, c.id, b.id]
    assert [x.id for x in ConversationStore().list()] == [a.id, c.id, b.id]


def test_rename_and_delete_persist(home):
    store = ConversationStore()
    keep, drop = store.new(), store.new()
    store.rename(keep.id, "  Trip plans  ")
    store.delete(drop.id)
    again = ConversationStore()
    assert [c.title for c in again.list()] == ["Trip plans"]
    assert drop.id not in again
    with pytest.raises(KeyError):
        again.get(drop.id)


def test_streaming_updates_stay_in_memory_until_saved(home):
    store = ConversationStore()
    conv = store.new()
    store.append_message(conv.id, "user", "hi")
    store.append_message(conv.id, "assistant", "")
    store.update_last_message(conv.id, "Hel", persist=False)
    assert ConversationStore().get(conv.id).messages[-1]["content"] == ""
    store.update_last_message(conv.id, "Hello!", persist=False)
    store.save(conv.id)
    assert ConversationStore().get(conv.id).messages[-1]["content"] == "Hello!"


def test_background_saves_never_land_after_a_later_change(home, monkeypatch):
    """A streaming reply is saved from a background thread; a rename or a delete
    that follows must win, however slow that write is."""
    real = conversations.save_encrypted

    def slow_in_background(*args):
        if threading.current_thread() is not threading.main_thread():
            time.sleep(0.2)  # still in flight when the next change comes
        real(*args)

    monkeypatch.setattr(conversations, "save_encrypted", slow_in_background)
    store = ConversationStore()
    conv = store.new()
    store.append_message(conv.id, "user", "first words")
    store.save_in_background(conv.id)
    store.rename(conv.id, "Renamed")
    store.flush()
    assert ConversationStore().get(conv.id).title == "Renamed"

    store.save_in_background(conv.id)
    store.delete(conv.id)
    store.flush()
    assert list((data_dir() / "conversations").glob("*.chat")) == []


def test_invalid_role_and_bad_ids_are_refused(home):
    store = ConversationStore()
    conv = store.new()
    with pytest.raises(ValueError):
        store.append_message(conv.id, "root", "x")
    with pytest.raises(KeyError):
        store.delete("../../settings")
    with pytest.raises(ValueError):
        store.update_last_message(conv.id, "nothing to update")


def test_corrupt_file_is_quarantined_and_others_still_load(home):
    store = ConversationStore()
    good = store.new()
    store.append_message(good.id, "user", "keep me")
    bad = store.new()
    path = data_dir() / "conversations" / f"{bad.id}.chat"
    path.write_bytes(path.read_bytes()[:-10])

    again = ConversationStore()
    assert [c.id for c in again.list()] == [good.id]
    assert len(again.warnings) == 1 and "damaged" in again.warnings[0]
    assert not path.exists()
    kept = list(path.parent.glob(f"{bad.id}.chat.corrupt*"))
    assert len(kept) == 1 and kept[0].stat().st_size > 0


def test_decryptable_but_malformed_record_is_quarantined(home):
    store = ConversationStore()
    conv = store.new()
    path = data_dir() / "conversations" / f"{conv.id}.chat"
    save_encrypted(path, {"id": conv.id, "title": "x", "messages": "not a list"})
    again = ConversationStore()
    assert len(again) == 0 and again.warnings
    assert list(path.parent.glob("*.corrupt*"))


def test_file_under_an_unavailable_key_is_left_untouched(home, tmp_path):
    store = ConversationStore()
    conv = store.new()
    path = data_dir() / "conversations" / f"{conv.id}.chat"
    other = KeyStore(tmp_path / "other", backend=fail.Keyring())
    save_encrypted(path, store.get(conv.id).to_dict(), other)
    before = path.read_bytes()

    again = ConversationStore()
    assert len(again) == 0 and "key" in again.warnings[0]
    assert path.read_bytes() == before, "never moved or rewritten"


def test_title_from_first_line():
    assert title_from("\n\n  Hello there  \nmore") == "Hello there"
    assert title_from("   ") == DEFAULT_TITLE
    long = title_from("x" * 500)
    assert len(long) == 60 and long.endswith("…")


def _texts(conv) -> list[str]:
    return [m["content"] for m in conv.messages]


def test_forks_keep_every_version_switchable_and_saved(home):
    store = ConversationStore()
    conv = store.new()
    for role, text in (("user", "Q1"), ("assistant", "A1"), ("user", "Q2"), ("assistant", "A2")):
        store.append_message(conv.id, role, text)

    store.fork(conv.id, 2, [{"role": "user", "content": "Q2 edited"}])  # edit Q2
    store.append_message(conv.id, "assistant", "A2'")
    store.fork(conv.id, 3, [{"role": "assistant", "content": "A2''"}])  # regenerate inside the edit
    assert _texts(store.get(conv.id)) == ["Q1", "A1", "Q2 edited", "A2''"]
    assert version_of(store.get(conv.id).messages[2]) == (1, 2)
    assert version_of(store.get(conv.id).messages[3]) == (1, 2)

    store.switch_version(conv.id, 2, 0)  # back to the original question and its answer
    assert _texts(store.get(conv.id)) == ["Q1", "A1", "Q2", "A2"]
    assert version_of(store.get(conv.id).messages[2]) == (0, 2)
    assert version_of(store.get(conv.id).messages[3]) is None

    reread = ConversationStore().get(conv.id)  # both branches survive a restart
    assert _texts(reread) == ["Q1", "A1", "Q2", "A2"]
    store = ConversationStore()
    store.switch_version(conv.id, 2, 1)  # the edited branch, with its own two replies
    assert _texts(store.get(conv.id)) == ["Q1", "A1", "Q2 edited", "A2''"]
    store.switch_version(conv.id, 3, 0)
    assert _texts(ConversationStore().get(conv.id)) == ["Q1", "A1", "Q2 edited", "A2'"]

    with pytest.raises(ValueError, match="no version 5"):
        store.switch_version(conv.id, 2, 5)
    with pytest.raises(ValueError, match="no message 9"):
        store.fork(conv.id, 9, [{"role": "user", "content": "x"}])


def test_a_file_with_malformed_versions_is_quarantined(home):
    conv_id = "1" * 32
    bad = {"id": conv_id, "title": "t", "created": 1.0, "updated": 1.0,
           "messages": [{"role": "user", "content": "hi", "versions": [[{"role": "user"}], None]}]}
    save_encrypted(data_dir() / "conversations" / f"{conv_id}.chat", bad)
    store = ConversationStore()
    assert conv_id not in store and "damaged" in store.warnings[0]
