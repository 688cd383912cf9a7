"""The C heap's free memory, handed back to the OS.

glibc keeps freed blocks for reuse and returns little of them, so memory the
process freed stays resident: each learner batch's activations come in other
sizes (the worker's RSS crept up turn after turn with learning on;
python -m omnidraft.tools.memory_soak), and a model's weights, once moved onto 2 MB pages
(core/models/huge_pages.py), left their old pages resident.
"""

from __future__ import annotations

import ctypes
import sys


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl): nothing to trim
        return None


_LIBC = _libc()


def trim_heap() -> None:
    """Give the heap's free pages back to the OS (glibc's malloc_trim; elsewhere
    nothing)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
