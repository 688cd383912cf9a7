"""Encryption at rest for the user's text (conversations, the learner's replay buffer).

One random data key encrypts every saved file, with AES-256-GCM under a key
derived from it (HKDF-SHA256). The data key lives in the OS keyring (service
"omnidraft", name "data-key"). Where no usable keyring exists (a headless Linux
box, a locked-down desktop) it falls back to a key file `<data_dir>/key` readable
only by the user, and says so in `KeyStore.fallback_warning` so the GUI can tell
the user. Nothing is ever written
in plaintext: conversations, the replay buffer, and everything learned from them
(n-gram caches, drafting statistics, adapter weights and counters) use this key.

File format: MAGIC + 8-byte key fingerprint + 12-byte nonce + AES-GCM ciphertext
and tag (the header authenticated with it). The fingerprint lets a reader tell
"encrypted with a key we do not hold" (keyring unavailable today, data copied from
another machine) from "damaged": the first is reported and the file left
untouched, the second is a CorruptStateError the caller quarantines. Files in the
older format (FERNET_MAGIC + fingerprint + Fernet token, AES-128-CBC + HMAC,
base64) still open and are rewritten in the new format by their next save: that
format took 0.23 s to encrypt the learner's 39 MB adapter, which GCM does in
0.007 s, and stored it a third larger (git show 524cea4:scripts/adapter_save.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from cryptography.exceptions import InvalidTag
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from . import paths
from .persistence import CorruptStateError, atomic_write_bytes, read_json

T = TypeVar("T")

KEYRING_SERVICE = "omnidraft"
KEYRING_NAME = "data-key"
KEY_FILE_NAME = paths.KEY_FILE_NAME
MAGIC = b"OMDENC2\n"  # AES-GCM (what is written)
FERNET_MAGIC = b"OMDENC1\n"  # Fernet (the older format; still read)
_FP_LEN = 8
_NONCE_LEN = 12


class KeyUnavailableError(CorruptStateError):
    """The file is intact but was encrypted with a key this KeyStore does not hold.

    Callers should report it and leave the file where it is (the key may come
    back, e.g. when the keyring is unlocked again), not quarantine it.
    """

    def __init__(self, path: Path):
        super().__init__(path, "it was encrypted with a key that is not available here")


def fingerprint(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()[:_FP_LEN]


def _aead(key: bytes) -> AESGCM:
    """The AES-256-GCM cipher of a data key (a Fernet key: 32 random bytes, base64)."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"omnidraft file encryption v2")
    return AESGCM(hkdf.derive(key))


def _is_usable_backend(backend: Any) -> bool:
    """False for keyring's 'no backend' placeholders (fail / null)."""
    from keyring.backends import fail, null

    if isinstance(backend, (fail.Keyring, null.Keyring)):
        return False
    try:
        return float(getattr(backend, "priority", 1)) > 0
    except Exception:  # noqa: BLE001 - some backends compute priority and raise when unavailable
        return False


def _valid_key(key: bytes) -> bool:
    try:
        Fernet(key)
    except (ValueError, TypeError):
        return False
    return True


class KeyStore:
    """Loads (or creates, the first time) the data key once, and encrypts/decrypts with it.

    `backend` is a keyring backend instance; None uses keyring.get_keyring(). Tests
    pass keyring.backends.fail.Keyring() or an in-memory backend so the real user
    keyring is never touched.
    """

    def __init__(self, data_dir: Path | None = None, backend: Any = None):
        self.key_path = Path(data_dir or paths.data_dir()) / KEY_FILE_NAME
        self.fallback_warning: str | None = None
        self.backend_description = ""
        # fingerprint -> key; the first one encrypts, all of them decrypt.
        self._keys: dict[bytes, bytes] = {}
        self._primary: bytes = b""
        self._ciphers: dict[bytes, AESGCM] = {}  # fingerprint -> its GCM cipher
        self._load(backend)

    # ------------------------------------------------------------------ key loading

    def _load(self, backend: Any) -> None:
        if backend is None:
            import keyring

            backend = keyring.get_keyring()
        key = self._key_from_keyring(backend) if _is_usable_backend(backend) else None
        if key is not None:
            self.backend_description = f"OS keyring ({_backend_name(backend)})"
            self._use(key)
            # A key file left from an earlier fallback still decrypts what it wrote.
            old = self._read_key_file()
            if old is not None and old != key:
                self._keys.setdefault(fingerprint(old), old)
            return
        reason = (
            "no usable keyring backend was found"
            if not _is_usable_backend(backend)
            else "the keyring could not be used"
        )
        self.backend_description = f"key file {self.key_path} (mode 0600)"
        self.fallback_warning = (
            f"Your conversations are encrypted, but {reason} on this system, so the "
            f"encryption key is kept in a file readable only by your account "
            f"({self.key_path}). Anyone who can read your files can read your chats."
        )
        self._use(self._key_file_or_new())

    def _key_from_keyring(self, backend: Any) -> bytes | None:
        """The keyring's key, creating it there if needed; None when the keyring fails."""
        try:
            stored = backend.get_password(KEYRING_SERVICE, KEYRING_NAME)
            if stored and _valid_key(stored.encode()):
                return stored.encode()
            # Adopt a key file from an earlier fallback so its data stays readable.
            key = self._read_key_file() or Fernet.generate_key()
            backend.set_password(KEYRING_SERVICE, KEYRING_NAME, key.decode())
            # Read back: some backends accept a write and drop it (locked, read-only).
            if backend.get_password(KEYRING_SERVICE, KEYRING_NAME) != key.decode():
                return None
        except Exception:  # noqa: BLE001 - keyring, D-Bus, locked-collection errors all mean 'unusable'
            return None
        self._retire_key_file(key)
        return key

    def _retire_key_file(self, key: bytes) -> None:
        """Once the keyring safely holds the same key, the plaintext key file goes."""
        if self._read_key_file() == key:
            self.key_path.unlink(missing_ok=True)

    def _read_key_file(self) -> bytes | None:
        try:
            key = self.key_path.read_bytes().strip()
        except FileNotFoundError:
            return None
        return key if _valid_key(key) else None

    def _key_file_or_new(self) -> bytes:
        if self.key_path.exists():
            key = self._read_key_file()
            if key is not None:
                _tighten_permissions(self.key_path)
                return key
            # Never overwrite a key file: keep the damaged one beside, start a new key.
            kept = CorruptStateError(self.key_path, "not a key").quarantine()
            self.fallback_warning = (self.fallback_warning or "") + (
                f" The key file was damaged and was kept as {kept.name}; files encrypted "
                "with it cannot be opened."
            )
        return _create_key_file(self.key_path)

    def _use(self, key: bytes) -> None:
        self._primary = key
        self._keys = {fingerprint(key): key}

    # ------------------------------------------------------------------ encryption

    @property
    def key_fingerprint(self) -> str:
        return fingerprint(self._primary).hex()

    def encrypt(self, data: bytes) -> bytes:
        fp = fingerprint(self._primary)
        header = MAGIC + fp
        nonce = os.urandom(_NONCE_LEN)  # random: a key meets far fewer than 2^32 files
        return header + nonce + self._cipher(fp).encrypt(nonce, data, header)

    def decrypt(self, blob: bytes, path: Path) -> bytes:
        """Plain bytes; CorruptStateError when damaged, KeyUnavailableError for a foreign key."""
        magic = blob[: len(MAGIC)]
        if magic not in (MAGIC, FERNET_MAGIC) or len(blob) < len(MAGIC) + _FP_LEN:
            raise CorruptStateError(path, "not an OmniDraft encrypted file")
        header, body = blob[: len(MAGIC) + _FP_LEN], blob[len(MAGIC) + _FP_LEN :]
        fp = header[len(MAGIC) :]
        if fp not in self._keys:
            raise KeyUnavailableError(path)
        try:
            if magic == FERNET_MAGIC:
                return Fernet(self._keys[fp]).decrypt(body)
            return self._cipher(fp).decrypt(body[:_NONCE_LEN], body[_NONCE_LEN:], header)
        except (InvalidToken, InvalidTag, ValueError) as exc:  # ValueError: cut short of a nonce
            raise CorruptStateError(path, "the encrypted data does not verify") from exc

    def _cipher(self, fp: bytes) -> AESGCM:
        if fp not in self._ciphers:
            self._ciphers[fp] = _aead(self._keys[fp])
        return self._ciphers[fp]


def _backend_name(backend: Any) -> str:
    return getattr(backend, "name", None) or type(backend).__name__


def _tighten_permissions(path: Path) -> None:
    """A key file others can read is repaired to 0600 (POSIX only)."""
    if os.name != "posix":
        return
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        os.chmod(path, 0o600)


def _create_key_file(path: Path) -> bytes:
    """Write a new key with mode 0600. If another process wins the race, use its key."""
    paths.private_dir(path.parent)
    key = Fernet.generate_key()
    try:
        atomic_write_bytes(path, key, exclusive=True)  # never replaces a key
    except FileExistsError:
        theirs = path.read_bytes().strip()
        if _valid_key(theirs):
            return theirs
        raise
    return key


# ---------------------------------------------------------------------- module API

_default: dict[Path, KeyStore] = {}


def default_keystore() -> KeyStore:
    """One KeyStore per data folder per process (OMNIDRAFT_HOME may change in tests)."""
    folder = paths.data_dir().resolve()
    if folder not in _default:
        _default[folder] = KeyStore(folder)
    return _default[folder]


_SURROGATE = re.compile("[\ud800-\udfff]")


def without_surrogates(text: str) -> str:
    """`text` with every lone UTF-16 surrogate replaced by U+FFFD (the replacement
    character), so it can be encoded as UTF-8 and tokenized."""
    return _SURROGATE.sub("\ufffd", text)


def save_encrypted(path: Path, obj: Any, keys: KeyStore | None = None) -> None:
    """JSON-serialise obj, encrypt it and write it atomically (mode 0600)."""
    keys = keys or default_keystore()
    # A lone UTF-16 surrogate (pasted from elsewhere, or a "\ud800" in an imported
    # file) has no UTF-8 form: it is saved as U+FFFD, the rest exactly.
    data = without_surrogates(json.dumps(obj, ensure_ascii=False, separators=(",", ":"))).encode("utf-8")
    paths.private_dir(Path(path).parent)
    atomic_write_bytes(Path(path), keys.encrypt(data))


def load_encrypted(path: Path, default: Any = None, keys: KeyStore | None = None) -> Any:
    """The saved object, or `default` when the file is missing.

    Raises CorruptStateError when the file is damaged and KeyUnavailableError (a
    CorruptStateError) when it was encrypted with a key this machine does not hold.
    """
    path = Path(path)
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return default
    keys = keys or default_keystore()
    plain = keys.decrypt(blob, path)
    try:
        return json.loads(plain.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptStateError(path, f"decrypted content is not valid JSON: {exc}") from exc


def load_or_migrate(
    path: Path, legacy: Path, parse: Callable[[Any, Path], T], keys: KeyStore | None = None
) -> T:
    """parse(object, file) of the encrypted file at `path`, or of None when there is none.

    Older versions wrote the same object as plaintext JSON at `legacy`. When only
    that exists, it is read once, checked by parse, rewritten encrypted at `path`
    and then deleted: nothing the user had is lost, and no plaintext stays. parse
    raises CorruptStateError (with the file it was given) for a wrong shape, so the
    caller quarantines the right file.
    """
    path, legacy = Path(path), Path(legacy)
    if path.exists() or not legacy.exists():
        value = parse(load_encrypted(path, None, keys), path)
        if legacy != path:  # a crash between the rewrite and the delete left the plaintext
            legacy.unlink(missing_ok=True)
        return value
    raw = read_json(legacy, None)
    value = parse(raw, legacy)
    save_encrypted(path, raw, keys)
    legacy.unlink(missing_ok=True)
    return value
