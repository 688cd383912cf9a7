"""A start-up check of the Qt binding itself.

PySide6 6.12.0 forgets to take a reference when a void method hands Python
its None result. On Python 3.11, where None is an ordinary reference-counted
object, every such call drops None's count by one, and after some minutes of
normal GUI use the interpreter aborts with "none_dealloc". pyproject excludes
that release; this probe catches it (or a regression like it) in whatever is
actually installed, before a chat is lost to the crash.
"""

from __future__ import annotations

import sys

PROBE_CALLS = 200


def drops_none_references(calls: int = PROBE_CALLS) -> bool:
    if sys.version_info >= (3, 12):
        return False  # None is immortal there: the binding bug cannot crash anything
    from PySide6.QtCore import QObject

    probe = QObject()
    before = sys.getrefcount(None)
    for _ in range(calls):
        probe.setObjectName("probe")  # returns void
    return sys.getrefcount(None) < before - calls // 2


def binding_problem() -> str | None:
    """A sentence for the user when the installed PySide6 would crash the app."""
    if not drops_none_references():
        return None
    import PySide6

    return (
        f"The installed PySide6 {PySide6.__version__} has a reference-counting bug that "
        f"crashes Python {sys.version_info.major}.{sys.version_info.minor} after a few minutes. "
        "Install another version, e.g.  pip install 'PySide6-Essentials==6.11.3'"
    )
