"""Atomic saves: a crash mid-write never leaves a half-written file behind.

Write to a temporary file in the same folder, fsync it, rename it over the old
one (rename is atomic on one filesystem), then fsync the folder so the rename
itself survives a power cut.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o600, exclusive: bool = False) -> None:
    """exclusive: never replace an existing file, raise FileExistsError instead
    (a key file another process created first must win)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if exclusive:
            _link_new(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)  # gone already unless linked or failed
    _fsync_dir(path.parent)


def _link_new(tmp: str, path: Path) -> None:
    try:
        os.link(tmp, path)  # atomic, and fails if path exists
    except FileExistsError:
        raise
    except OSError:  # filesystems without hard links: replace (the race is not guarded there)
        os.replace(tmp, path)


def append_bytes(path: Path, data: bytes, sync: bool = True, mode: int = 0o600) -> None:
    """Append to a log file (created with `mode`). sync: fsync the data (and the
    folder, for a new file) before returning. A crash mid-append leaves the old
    content and a cut-short tail, which the log's reader drops."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
    with os.fdopen(fd, "ab") as f:
        created = os.fstat(fd).st_size == 0
        f.write(data)
        f.flush()
        if sync:
            os.fsync(fd)
    if sync and created:
        _fsync_dir(path.parent)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=2, ensure_ascii=False).encode("utf-8"))


def read_json(path: Path, default: Any) -> Any:
    """The saved object, or `default` when the file is missing.

    A corrupt file raises CorruptStateError so the caller can tell the user and
    keep the broken file aside instead of silently overwriting it.
    """
    path = Path(path)
    if not path.exists():
        return default
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptStateError(path, str(exc)) from exc


class CorruptStateError(Exception):
    def __init__(self, path: Path, detail: str):
        super().__init__(f"Saved file {path} is damaged and could not be read ({detail}).")
        self.path = Path(path)

    def quarantine(self) -> Path:
        """Move the damaged file aside (kept for the user, never deleted)."""
        dest = self.path.with_name(self.path.name + ".corrupt")
        n = 1
        while dest.exists():
            dest = self.path.with_name(f"{self.path.name}.corrupt{n}")
            n += 1
        os.replace(self.path, dest)
        return dest


def partial_path(final: Path) -> Path:
    """Where a large file or folder is built before it is renamed to `final`."""
    return final.with_name(f"{final.name}.partial-{os.getpid()}")


def remove_stale_partials(final: Path) -> None:
    """Delete what builds of `final` killed half-way left behind (their process is
    gone): a killed model conversion would otherwise keep gigabytes on disk."""
    for leftover in final.parent.glob(f"{final.name}.partial-*"):
        pid = leftover.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
            continue  # another process is building it right now
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
