"""Where user data lives: platformdirs' user dirs, or all of it under $OMNIDRAFT_HOME.

Tests and benchmarks point OMNIDRAFT_HOME at a temporary folder so they never
touch a person's real data. Every folder made here is private (0700): chat file
names and model names are nobody else's business on a shared machine.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import platformdirs

APP_NAME = "omnidraft"
HOME_ENV = "OMNIDRAFT_HOME"
PRIVATE_DIR_MODE = 0o700
# The fallback encryption key file (core.storage.secure_store.KEY_FILE_NAME; named here
# because secure_store imports this module).
KEY_FILE_NAME = "key"
# The locks that keep a second app and a second engine off one data folder
# (core.storage.folder_lock); clear_data keeps them whatever `keep` says.
INSTANCE_LOCK_NAME = "instance.lock"
ENGINE_LOCK_NAME = "engine.lock"
LOCK_FILE_NAMES = (INSTANCE_LOCK_NAME, ENGINE_LOCK_NAME)


def private_dir(path: Path) -> Path:
    """Create `path` and any missing parents with mode 0700 (mkdir(parents=True)
    gives the parents the umask's default, 0755 on most systems)."""
    path = Path(path)
    missing = []
    for folder in (path, *path.parents):
        if folder.is_dir():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            pass  # another process made it meanwhile
        else:
            _chmod(folder, PRIVATE_DIR_MODE)
    return path


def _chmod(path: Path, mode: int) -> None:
    if os.name == "posix":
        os.chmod(path, mode)


def _tighten(path: Path) -> None:
    """A root left readable by others (made by an older version: 0755) becomes 0700."""
    if os.name == "posix" and stat.S_IMODE(path.stat().st_mode) & 0o077:
        os.chmod(path, PRIVATE_DIR_MODE)


def _root(kind: str) -> Path:
    home = os.environ.get(HOME_ENV)
    if home:
        path = Path(home).expanduser() / kind
    elif kind == "data":
        path = Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    elif kind == "cache":
        path = Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))
    else:
        path = Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))
    private_dir(path)
    _tighten(path)
    return path


def data_dir() -> Path:
    """Conversations, learned state (adapters, caches, replay buffers), catalog."""
    return _root("data")


def cache_dir() -> Path:
    """Re-creatable files: converted model weights."""
    return _root("cache")


def config_dir() -> Path:
    """Settings."""
    return _root("config")


def all_roots() -> list[Path]:
    return [data_dir(), cache_dir(), config_dir()]


def clear_data(keep: tuple[str, ...] = (KEY_FILE_NAME,)) -> list[str]:
    """Delete every file and folder in the data folder except the names in `keep`
    (top-level entries) and the lock files; returns the kept names that exist.

    Whatever the app loaded or not: damaged files set aside as `.corrupt`, chats
    encrypted with another key, files of other versions. The key file is kept by
    default: the running app still encrypts with it, and files it writes after
    this would be unreadable on the next start without it. The lock files hold
    only a pid; deleting one held by the running app would let a second app lock
    a new file of that name. Settings (config folder) and converted model copies
    (cache folder) are not data and stay.
    """
    data = data_dir()
    kept = []
    for item in sorted(data.iterdir()):
        if item.name in keep or item.name in LOCK_FILE_NAMES:
            kept.append(item.name)
        elif item.is_dir() and not item.is_symlink():
            shutil.rmtree(item)
        else:
            item.unlink(missing_ok=True)
    return kept
