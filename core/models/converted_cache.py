"""The converted copy of a GGUF model (cache/models/<id>-<key>/): sealed when it is
written, checked before each load, converted again when damaged.

A copy cut short (a full disk, a crash before the data reached the disk) failed
to load at every start and was never rebuilt; one with changed bytes loaded and
replied with nothing. So a conversion fsyncs each file and then seals the folder:
its marker records every file's size and sha256, and the file's stat signature
(mtime, ctime, inode) at that moment. Before a load:

* a recorded file missing or of another size: damaged (costs a stat per file);
* a file whose signature changed since it was sealed (anything wrote to it, or
  the folder was copied) is hashed again (~7 s for the 1.5B model's 3.5 GB);
  when it still matches, the new signature is recorded, so that happens once.

An unchanged signature is trusted: hashing gigabytes at every start would add
seconds to each load, for damage nothing wrote (a failing disk's bit rot). A
damaged copy is deleted and converted again, and the load's progress says why.
Copies sealed by versions that recorded no files are sealed on their first check.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from ..storage.persistence import atomic_write_json
from .bundled_models import Progress, no_progress

log = logging.getLogger(__name__)

MARKER = "omnidraft-converted.json"
_CHUNK = 8 * 2**20


def is_sealed(folder: Path) -> bool:
    """The conversion finished (what `check` then verifies)."""
    return (folder / MARKER).exists()


def seal(folder: Path, source: Path, fmt: int) -> None:
    """Make a finished conversion durable and record what it wrote."""
    files = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name != MARKER:
            _fsync(path)
            files[path.name] = _record(path, _sha256(path))
    atomic_write_json(folder / MARKER, {"source": str(source), "format": fmt, "files": files})


def publish(tmp: Path, dest: Path, name: str) -> None:
    """Move a sealed conversion into place. Another process converting the same file
    (the app beside the bench, two test workers) may have put its copy there first:
    a usable one is kept and ours dropped, a damaged one is replaced by ours."""
    try:
        os.replace(tmp, dest)
    except OSError:
        if usable(dest, name):
            shutil.rmtree(tmp, ignore_errors=True)
        else:  # usable() removed the damaged copy
            os.replace(tmp, dest)


def check(folder: Path) -> str | None:
    """What is wrong with a sealed copy, or None when it can be loaded."""
    marker = folder / MARKER
    try:
        sealed = json.loads(marker.read_text(encoding="utf-8"))
        files = sealed.get("files") if isinstance(sealed, dict) else None
    except (OSError, ValueError, UnicodeDecodeError):
        return "its record of what was converted is unreadable"
    if not isinstance(sealed, dict):
        return "its record of what was converted is unreadable"
    if files is None:  # sealed by an older version: record it as it is now
        seal(folder, Path(str(sealed.get("source", ""))), sealed.get("format", 0))
        return None
    if not isinstance(files, dict) or not all(_is_record(r) for r in files.values()):
        return "its record of what was converted is unreadable"
    changed = False
    for name, record in files.items():
        try:
            st = (folder / name).stat()
        except OSError:
            return f"{name} is missing"
        if st.st_size != record["size"]:
            return f"{name} has {st.st_size:,} bytes instead of {record['size']:,}"
        if _signature(st) != record["signature"]:
            if _sha256(folder / name) != record["sha256"]:
                return f"{name} has changed since it was converted"
            record["signature"] = _signature(st)
            changed = True
    if changed:
        atomic_write_json(marker, sealed)
    return None


def usable(folder: Path, name: str, progress: Progress = no_progress) -> bool:
    """True when `folder` holds a finished, intact copy. A damaged one is deleted
    (the caller converts again) and the progress says so while that runs."""
    if not is_sealed(folder):
        return False
    problem = check(folder)
    if problem is None:
        return True
    message = f"The converted copy of {name} is damaged ({problem}); converting it again"
    log.warning("%s: %s", message, folder)
    progress(message, 0.3)
    shutil.rmtree(folder, ignore_errors=True)
    return False


def _record(path: Path, sha256: str) -> dict:
    st = path.stat()
    return {"size": st.st_size, "sha256": sha256, "signature": _signature(st)}


def _is_record(record: object) -> bool:
    return (isinstance(record, dict) and type(record.get("size")) is int
            and isinstance(record.get("sha256"), str) and isinstance(record.get("signature"), list))


def _signature(st: os.stat_result) -> list[int]:
    return [st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
