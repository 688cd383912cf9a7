"""Encryption at rest: keyring key, key-file fallback, damaged and foreign files."""

import json
import os
import stat

import pytest
from keyring.backend import KeyringBackend
from keyring.backends import fail
from keyring.errors import PasswordSetError
from omnidraft.core.storage import secure_store
from omnidraft.core.storage.paths import data_dir
from omnidraft.core.storage.persistence import CorruptStateError
from omnidraft.core.storage.secure_store import (
    FERNET_MAGIC,
    KEYRING_NAME,
    KEYRING_SERVICE,
    MAGIC,
    KeyStore,
    KeyUnavailableError,
    fingerprint,
    load_encrypted,
    save_encrypted,
)

SECRET = {"text": "my bank PIN is 4711 – ünïcode ✓", "n": [1, 2.5, None]}


class MemoryKeyring(KeyringBackend):
    """An in-memory keyring so tests never touch the real user keyring."""

    priority = 1

    def __init__(self):
        super().__init__()
        self.store: dict[tuple[str, str], str] = {}

    def get_password(self, service, username):
        return self.store.get((service, username))

    def set_password(self, service, username, password):
        self.store[(service, username)] = password

    def delete_password(self, service, username):
        self.store.pop((service, username), None)


class BrokenKeyring(MemoryKeyring):
    """Looks usable but every write fails (a locked or read-only keyring)."""

    def set_password(self, service, username, password):
        raise PasswordSetError("locked")


pytestmark = pytest.mark.usefixtures("no_real_keyring")


def test_this_machine_has_no_usable_keyring_so_default_store_falls_back(home):
    keys = secure_store.default_keystore()
    assert keys.fallback_warning and "file" in keys.fallback_warning
    assert str(keys.key_path) in keys.fallback_warning
    assert keys.key_path == data_dir() / "key" and keys.key_path.exists()
    assert "key file" in keys.backend_description
    if os.name == "posix":
        assert stat.S_IMODE(keys.key_path.stat().st_mode) == 0o600


def test_round_trip_is_encrypted_on_disk_and_private(home):
    keys = KeyStore(backend=fail.Keyring())
    path = home / "data" / "x.enc"
    save_encrypted(path, SECRET, keys)
    raw = path.read_bytes()
    assert b"4711" not in raw and "ünïcode".encode() not in raw
    assert load_encrypted(path, None, keys) == SECRET
    if os.name == "posix":
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_files_saved_by_older_versions_open_and_their_next_save_is_compact(home):
    from cryptography.fernet import Fernet

    keys = KeyStore(backend=fail.Keyring())
    key = keys.key_path.read_bytes().strip()
    plain = json.dumps(SECRET, ensure_ascii=False, separators=(",", ":")).encode()
    path = home / "data" / "old.enc"
    path.write_bytes(FERNET_MAGIC + fingerprint(key) + Fernet(key).encrypt(plain))  # the older format
    assert load_encrypted(path, None, keys) == SECRET
    save_encrypted(path, SECRET, keys)
    raw = path.read_bytes()
    assert raw.startswith(MAGIC) and load_encrypted(path, None, keys) == SECRET
    # Binary, not base64: the text's bytes plus header, nonce and tag.
    assert len(raw) == len(MAGIC) + 8 + 12 + len(plain) + 16
    old = FERNET_MAGIC + fingerprint(key) + Fernet(key).encrypt(plain)
    path.write_bytes(old[:-5])  # an older file cut short is damaged, as a new one would be
    with pytest.raises(CorruptStateError) as info:
        load_encrypted(path, None, keys)
    assert not isinstance(info.value, KeyUnavailableError)


def test_key_file_is_reused_across_instances(home):
    a = KeyStore(backend=fail.Keyring())
    save_encrypted(home / "a.enc", SECRET, a)
    b = KeyStore(backend=fail.Keyring())
    assert b.key_fingerprint == a.key_fingerprint
    assert load_encrypted(home / "a.enc", None, b) == SECRET


def test_a_key_file_another_process_writes_first_wins(home, monkeypatch):
    """Two processes starting at once each find no key file; the second to write
    must take the first one's key, never replace it (its files would be lost)."""
    from cryptography.fernet import Fernet

    folder, theirs, found = data_dir(), Fernet.generate_key(), []
    private_dir = secure_store.paths.private_dir

    def other_process_writes_meanwhile(path):
        made = private_dir(path)
        found.append((folder / "key").exists())
        (folder / "key").write_bytes(theirs)
        return made

    monkeypatch.setattr(secure_store.paths, "private_dir", other_process_writes_meanwhile)
    keys = KeyStore(folder, backend=fail.Keyring())
    assert found == [False]  # no key file when this process decided to write one
    assert keys.key_path.read_bytes() == theirs
    assert keys.key_fingerprint == secure_store.fingerprint(theirs).hex()
    assert not list(folder.glob(".key.*"))  # no temporary file left


def test_key_file_with_loose_permissions_is_tightened(home):
    if os.name != "posix":
        pytest.skip("POSIX permissions")
    keys = KeyStore(backend=fail.Keyring())
    os.chmod(keys.key_path, 0o644)
    KeyStore(backend=fail.Keyring())
    assert stat.S_IMODE(keys.key_path.stat().st_mode) == 0o600


def test_keyring_holds_the_key_and_no_key_file_is_written(home):
    ring = MemoryKeyring()
    keys = KeyStore(backend=ring)
    assert keys.fallback_warning is None
    assert "keyring" in keys.backend_description
    assert ring.store[(KEYRING_SERVICE, KEYRING_NAME)]
    assert not keys.key_path.exists()
    save_encrypted(home / "a.enc", SECRET, keys)
    assert load_encrypted(home / "a.enc", None, KeyStore(backend=ring)) == SECRET


def test_keyring_that_fails_on_write_falls_back_to_key_file(home):
    keys = KeyStore(backend=BrokenKeyring())
    assert keys.fallback_warning and keys.key_path.exists()
    save_encrypted(home / "a.enc", SECRET, keys)
    assert load_encrypted(home / "a.enc", None, keys) == SECRET


def test_key_file_from_a_fallback_moves_into_a_keyring_that_appears(home):
    old = KeyStore(backend=fail.Keyring())
    save_encrypted(home / "a.enc", SECRET, old)
    ring = MemoryKeyring()
    new = KeyStore(backend=ring)
    assert new.fallback_warning is None
    assert load_encrypted(home / "a.enc", None, new) == SECRET
    assert not old.key_path.exists(), "the plaintext key file is removed once the keyring has it"


def test_missing_file_gives_default(home):
    keys = KeyStore(backend=fail.Keyring())
    assert load_encrypted(home / "nope.enc", {"empty": True}, keys) == {"empty": True}


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[:-7],  # truncated
        lambda b: b[:40] + bytes([b[40] ^ 1]) + b[41:],  # one flipped bit
        lambda b: b[:20] + bytes([b[20] ^ 1]) + b[21:],  # in the nonce
        lambda b: b[:24],  # cut within the nonce
        lambda b: b"",
        lambda b: b'{"text": "plain json is not accepted"}',
    ],
    ids=["truncated", "bitflip", "nonce", "short", "empty", "plaintext"],
)
def test_damaged_file_raises_corrupt_state(home, damage):
    keys = KeyStore(backend=fail.Keyring())
    path = home / "a.enc"
    save_encrypted(path, SECRET, keys)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CorruptStateError) as info:
        load_encrypted(path, None, keys)
    assert not isinstance(info.value, KeyUnavailableError)
    kept = info.value.quarantine()
    assert kept.exists() and not path.exists()


def test_file_from_another_key_is_reported_as_key_unavailable(home, tmp_path):
    mine = KeyStore(backend=fail.Keyring())
    theirs = KeyStore(tmp_path / "elsewhere", backend=fail.Keyring())
    save_encrypted(home / "a.enc", SECRET, theirs)
    with pytest.raises(KeyUnavailableError):
        load_encrypted(home / "a.enc", None, mine)


def test_damaged_key_file_is_kept_aside_not_overwritten(home):
    keys = KeyStore(backend=fail.Keyring())
    keys.key_path.write_bytes(b"not a fernet key")
    again = KeyStore(backend=fail.Keyring())
    assert "damaged" in again.fallback_warning
    assert (keys.key_path.parent / "key.corrupt").read_bytes() == b"not a fernet key"
    assert again.key_path.exists()
