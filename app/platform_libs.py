"""The system libraries Qt's X11 platform plugin needs, checked before Qt starts.

Since Qt 6.5 the xcb plugin links against libraries (libxcb-cursor0,
libxcb-icccm4, ...) that pip cannot install and that a fresh Debian/Ubuntu
desktop may lack. Without them QApplication aborts with "Could not load the Qt
platform plugin xcb" and names the wrong library, so `ldd` is asked instead,
and the answer is turned into the apt-get command that fixes it.

Standard library only, and PySide6 is located without being imported: this
runs from set-up and before any Qt module is loaded.

    python -m omnidraft.app.platform_libs [--install] [--warn]

is silent when nothing is missing. Otherwise --install installs the packages
(as root, where apt-get exists); whatever is still missing is printed with the
command to run, and the exit status is 1 (0 with --warn).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

# soname -> the Debian/Ubuntu package that ships it. Ubuntu's t64 renames
# (libglib2.0-0t64, libpng16-16t64) provide the old names, and apt-get picks
# the sole provider, so one table serves both.
DEBIAN_PACKAGES = {
    "libxcb.so.1": "libxcb1",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libX11.so.6": "libx11-6",
    "libXau.so.6": "libxau6",
    "libXdmcp.so.6": "libxdmcp6",
    "libSM.so.6": "libsm6",
    "libICE.so.6": "libice6",
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-glx.so.0": "libxcb-glx0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xinerama.so.0": "libxcb-xinerama0",
    "libxcb-xinput.so.0": "libxcb-xinput0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libEGL.so.1": "libegl1",
    "libGL.so.1": "libgl1",
    "libGLX.so.0": "libglx0",
    "libGLdispatch.so.0": "libglvnd0",
    "libOpenGL.so.0": "libopengl0",
    "libfontconfig.so.1": "libfontconfig1",
    "libfreetype.so.6": "libfreetype6",
    "libpng16.so.16": "libpng16-16",
    "libexpat.so.1": "libexpat1",
    "libz.so.1": "zlib1g",
    "libdbus-1.so.3": "libdbus-1-3",
    "libglib-2.0.so.0": "libglib2.0-0",
    "libgthread-2.0.so.0": "libglib2.0-0",
}

APT_INSTALL = ["apt-get", "install", "-y", "--no-install-recommends"]
_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found\s*$")


def parse_ldd(text: str) -> list[str]:
    """The sonames `ldd` reports as "not found", each once, in its order
    (a library two others need is listed twice)."""
    found: dict[str, None] = {}
    for line in text.splitlines():
        match = _NOT_FOUND.match(line)
        if match:
            found.setdefault(match.group(1))
    return list(found)


def packages_for(sonames: Iterable[str]) -> tuple[list[str], list[str]]:
    """(Debian packages to install, sonames no package is known for)."""
    packages: dict[str, None] = {}
    unknown = []
    for soname in sonames:
        if soname in DEBIAN_PACKAGES:
            packages.setdefault(DEBIAN_PACKAGES[soname])
        else:
            unknown.append(soname)
    return list(packages), unknown


def xcb_plugin() -> Path | None:
    """PySide6's libqxcb.so, found without importing PySide6."""
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        plugin = Path(folder) / "Qt" / "plugins" / "platforms" / "libqxcb.so"
        if plugin.is_file():
            return plugin
    return None


def missing_libraries() -> list[str]:
    """Sonames the xcb plugin (or a library it pulls in) cannot find; empty off
    Linux, or where there is no plugin or no ldd to ask."""
    if not sys.platform.startswith("linux"):
        return []
    plugin = xcb_plugin()
    ldd = shutil.which("ldd")
    if plugin is None or ldd is None:
        return []
    # ldd lists the whole tree, so one call covers libQt6XcbQpa, libQt6Gui and the rest.
    try:
        result = subprocess.run(
            [ldd, str(plugin)], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_ldd(result.stdout)


def install_command(packages: Iterable[str]) -> str:
    return " ".join(["sudo", *APT_INSTALL, *packages])


def missing_message(sonames: list[str]) -> str:
    """What is missing and the command that installs it."""
    packages, unknown = packages_for(sonames)
    lines = [
        "Qt's X11 (xcb) platform plugin cannot load: these system libraries are missing: "
        + ", ".join(sonames)
        + "."
    ]
    if packages:
        lines += ["On Debian/Ubuntu install them with:", "    " + install_command(packages)]
    if unknown:
        lines.append(
            "Find the package for "
            + ", ".join(unknown)
            + " with your package manager (e.g. `apt-file search "
            + unknown[0]
            + "`)."
        )
    return "\n".join(lines)


NO_DISPLAY = (
    "There is no display to open the OmniDraft window on: neither DISPLAY nor "
    "WAYLAND_DISPLAY is set. Start it from a desktop session (or over `ssh -X`)."
)
NO_X_DISPLAY = "QT_QPA_PLATFORM asks for X11 (xcb), but DISPLAY is not set."


def display_problem(env: Mapping[str, str] | None = None) -> str | None:
    """A message when the Qt GUI cannot start here, before Qt tries and aborts:
    no display at all, or X11 without the libraries its plugin needs."""
    env = os.environ if env is None else env
    if not sys.platform.startswith("linux"):
        return None
    # QT_QPA_PLATFORM may be "xcb:options" or a fallback list, "wayland;xcb".
    requested = env.get("QT_QPA_PLATFORM", "").split(";")[0].split(":")[0].strip()
    if requested and requested != "xcb":
        return None  # offscreen, wayland, ...: the xcb plugin is not loaded
    has_x11 = bool(env.get("DISPLAY"))
    has_wayland = bool(env.get("WAYLAND_DISPLAY"))
    if not requested:
        if not has_x11 and not has_wayland:
            return NO_DISPLAY
        if not has_x11 or env.get("XDG_SESSION_TYPE") == "wayland":
            return None  # Qt picks its Wayland plugin
    elif not has_x11:
        return NO_X_DISPLAY
    missing = missing_libraries()
    return missing_message(missing) if missing else None


def can_install() -> bool:
    return (
        sys.platform.startswith("linux")
        and os.geteuid() == 0
        and shutil.which("apt-get") is not None
    )


def apt_install(packages: list[str]) -> bool:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run([*APT_INSTALL, *packages], env=env, check=False).returncode == 0:
        return True
    # A fresh container has empty package lists: fetch them once and retry.
    subprocess.run(["apt-get", "update", "-q"], env=env, check=False)
    return subprocess.run([*APT_INSTALL, *packages], env=env, check=False).returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m omnidraft.app.platform_libs",
        description="Check (and install) the system libraries Qt's X11 plugin needs.",
    )
    parser.add_argument(
        "--install", action="store_true", help="install missing ones with apt-get (as root)"
    )
    parser.add_argument(
        "--warn", action="store_true", help="report what is still missing, but exit 0"
    )
    args = parser.parse_args(argv)
    missing = missing_libraries()
    if args.install and missing and can_install():
        # A library missing from ldd's tree hides its own needs; apt-get brings
        # those along as dependencies, and the loop catches any it does not.
        for _ in range(3):
            packages, _unknown = packages_for(missing)
            if not packages:
                break
            print("Installing Qt's system libraries: " + " ".join(packages), file=sys.stderr)
            if not apt_install(packages):
                break
            missing = missing_libraries()
            if not missing:
                break
    if not missing:
        return 0
    message = missing_message(missing)
    if args.warn:
        print("warning: " + message, file=sys.stderr)
        print(
            "(Continuing: the tests run offscreen without them; the app needs them on X11.)",
            file=sys.stderr,
        )
        return 0
    print(message, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
