"""A runtime hook of the bundle (omnidraft.spec), for its check only: with
OMNIDRAFT_BUNDLE_PROBE naming a file, the frozen executable writes there, as
JSON, which kernels it finds (core/kernels/build.py) and exits before the app
starts. omnidraft.tools.bundle_check runs it with no compiler on PATH. Without
the variable it does nothing, and nothing else reads it.
"""


def _probe() -> None:
    import os

    out = os.environ.pop("OMNIDRAFT_BUNDLE_PROBE", None)
    if not out:
        return
    import json
    import shutil
    import sys
    from pathlib import Path

    from omnidraft.core.kernels import build

    lib = build.library()
    folder = Path(build.__file__).parent
    report = {
        "frozen": bool(getattr(sys, "frozen", False)),
        "kernel_isa": build.kernel_isa(),
        "unavailable": build.unavailable(),
        "library": getattr(lib, "_name", None),  # the file loaded: in the bundle, or a cache
        "compiler": shutil.which("cc") or shutil.which("gcc"),
        "kernels_folder": sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()),
        "bundle": getattr(sys, "_MEIPASS", None),
    }
    Path(out).write_text(json.dumps(report, indent=1))
    sys.exit(0)


_probe()
