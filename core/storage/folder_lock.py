"""One OmniDraft per data folder: a lock the operating system drops with its holder.

Two apps on one folder would overwrite each other's chats, learned samples and
adapters (every save is last-writer-wins), and two engine processes would
interleave their writes. The app holds `instance.lock` in its data folder for
as long as it runs, and its engine worker `engine.lock`. Each is an advisory
lock on an open file (flock on POSIX, msvcrt on Windows): the kernel releases it
when its process ends, however it ends, so a lock left by a crashed or killed
app is taken over at the next start without guessing from pids. The file holds
the holder's pid only to name it in the message. paths.clear_data never deletes
these files: a second app would lock a fresh file beside the held one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Self

from .paths import ENGINE_LOCK_NAME, INSTANCE_LOCK_NAME, data_dir

__all__ = ["ENGINE_LOCK_NAME", "INSTANCE_LOCK_NAME", "FolderBusyError", "FolderLock"]

_RETRY_S = 0.1


class FolderBusyError(Exception):
    """Another process holds the lock; str(error) is written for the person."""

    def __init__(self, path: Path, pid: int | None):
        self.path = Path(path)
        self.pid = pid
        who = f"process {pid}" if pid else "another process"
        super().__init__(
            f"Another OmniDraft ({who}) is using the data folder {self.path.parent}. "
            "Only one can use a folder at a time: close the other one first."
        )


class FolderLock:
    """An exclusive lock on `<folder>/<name>`; acquire() raises FolderBusyError."""

    def __init__(self, name: str = INSTANCE_LOCK_NAME, folder: Path | None = None):
        self.path = Path(folder or data_dir()) / name
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, wait_s: float = 0.0) -> Self:
        """Take the lock, waiting up to `wait_s` seconds for its holder to end."""
        if self._fd is not None:
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + wait_s
        while not _try_lock(fd):
            if time.monotonic() >= deadline:
                pid = _read_pid(fd)
                os.close(fd)
                raise FolderBusyError(self.path, pid)
            time.sleep(_RETRY_S)
        if os.name == "posix":  # Windows cannot read a locked byte back: no pid there
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Let the next process take it (the file stays: see the module docstring)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        _unlock(fd)
        os.close(fd)

    def __enter__(self) -> Self:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    if os.name != "posix":
        return None
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


if os.name == "posix":
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)

else:  # Windows
    import msvcrt

    def _try_lock(fd: int) -> bool:
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def _unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
