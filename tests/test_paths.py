from omnidraft.core.storage import paths


def test_everything_lives_under_omnidraft_home(home):
    for root in paths.all_roots():
        assert root.is_dir()
        assert root.is_relative_to(home)


def test_data_folders_are_private(home):
    import os
    import stat

    old_umask = os.umask(0o022)  # the usual desktop umask, which made them 0755
    try:
        roots = paths.all_roots()
        deep = paths.private_dir(paths.data_dir() / "state" / "a" / "b")
    finally:
        os.umask(old_umask)
    for folder in [home, *roots, deep, deep.parent, deep.parent.parent]:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


def test_a_root_left_open_by_an_older_version_is_closed(home):
    import os
    import stat

    os.chmod(paths.data_dir(), 0o755)
    assert stat.S_IMODE(paths.data_dir().stat().st_mode) == 0o700


def test_clear_data_removes_every_file_but_the_key(home):
    from keyring.backends.fail import Keyring
    from omnidraft.core.storage.conversations import ConversationStore
    from omnidraft.core.storage.secure_store import KeyStore

    data = paths.data_dir()
    keys = KeyStore(data, Keyring())  # the key-file fallback: a "key" file in the data folder
    store = ConversationStore(keys=keys)
    conv = store.new()
    store.append_message(conv.id, "user", "private words")
    chats = data / "conversations"
    (chats / "0123.chat.corrupt").write_bytes(b"damaged, set aside")
    (chats / "4567.chat").write_bytes(b"OMDENC1\n12345678 under another key")
    (data / "state" / "x").mkdir(parents=True)
    (data / "state" / "x" / "ngram_cache.json").write_text("[]")
    (data / "adapters" / ".t.old").mkdir(parents=True)
    (data / ".hidden.tmp").write_text("left by a crash")
    (data / "notes from another version.txt").write_text("unknown")
    (data / "link").symlink_to(home / "outside")  # a link is removed, never followed
    (home / "outside").mkdir()
    (home / "outside" / "kept.txt").write_text("not ours")

    kept = paths.clear_data()
    assert kept == ["key"]
    assert [p.name for p in data.iterdir()] == ["key"]
    assert (home / "outside" / "kept.txt").exists()
    assert KeyStore(data, Keyring()).key_fingerprint == keys.key_fingerprint  # still the same key
    assert paths.clear_data(keep=()) == [] and not list(data.iterdir())
