"""Atomic saves: a crash mid-write never leaves a half-written file behind.

Write to a temporary file in the same folder, fsync it, rename it over the old
one (rename is atomic on one filesystem), then fsync the folder so the rename
itself survives a power cut.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

_NO_SPACE = "No space left on device"  # how libraries that hide the errno (safetensors) say it


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether a failure, or one it was raised from, is a full disk (ENOSPC)."""
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
            return True
        if _NO_SPACE in str(exc):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GB" if n >= 2**30 else f"{max(n, 2**20) / 2**20:.0f} MB"


def free_bytes(folder: Path) -> int | None:
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


SAVED_AGAIN = "Nothing saved before was lost; free some space and it is saved again with the next change."


def disk_full_message(what: str, folder: Path, needed: int, then: str = SAVED_AGAIN) -> str:
    """A sentence for a save or a copy that found the disk full: what needs how
    much room where, and what is free there; `then`: what happens next."""
    free = free_bytes(folder)
    have = f" and {_size(free)} is free" if free is not None else ""
    return f"The disk is full: {what} needs about {_size(needed)} of free space in {folder}{have}. {then}"


def save_failure(what: str, folder: Path, exc: OSError, needed: int = 0, then: str = SAVED_AGAIN) -> str:
    """A sentence for a save that failed (`what`: "what the drafter learned");
    `then`: what happens next."""
    if is_disk_full(exc):
        return disk_full_message(f"saving {what}", folder, needed or 2**20, then).strip()
    reason = (exc.strerror or "the folder could not be written").lower()
    kept = "The copy saved before is kept." if then else ""
    return f"{what[:1].upper()}{what[1:]} could not be saved in {folder} ({reason}). {kept}".strip()


class DiskFullError(OSError):
    """A save that found the disk full; str() is a sentence naming the space needed.
    The file it would have replaced is unchanged."""

    def __init__(self, path: Path, needed: int):
        self.path = Path(path)
        self.needed = needed
        super().__init__(errno.ENOSPC, disk_full_message(f"saving {self.path.name}", self.path.parent, needed))

    def __str__(self) -> str:
        return self.strerror


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o600, exclusive: bool = False) -> None:
    """exclusive: never replace an existing file, raise FileExistsError instead
    (a key file another process created first must win)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        if is_disk_full(exc):
            raise DiskFullError(path, len(data)) from exc
        raise
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
    except OSError as exc:  # the old file is untouched: only the temporary one was written
        if is_disk_full(exc) and not isinstance(exc, DiskFullError):
            raise DiskFullError(path, len(data)) from exc
        raise
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
    try:
        size = os.fstat(fd).st_size
        created = size == 0
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
        except OSError as exc:
            # Cut the half-written record off again: a later append after it would
            # otherwise leave damage in the middle of the log, not at its end.
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
            if is_disk_full(exc):
                raise DiskFullError(path, len(data)) from exc
            raise
    finally:
        os.close(fd)
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
    if os.name == "nt":  # signal 0 would terminate the process there; psutil only asks
        import psutil

        return psutil.pid_exists(pid)
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
