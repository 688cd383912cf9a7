"""The system-library check for Qt's X11 plugin (app/platform_libs.py), and, in
the integration tier, the real app opening its window on a real X server (Xvfb)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from omnidraft.app import platform_libs
from omnidraft.app.platform_libs import (
    NO_DISPLAY,
    NO_X_DISPLAY,
    display_problem,
    missing_message,
    packages_for,
    parse_ldd,
)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

# `ldd PySide6/Qt/plugins/platforms/libqxcb.so` (PySide6-Essentials 6.11.3) on
# Debian 12 with libxcb-cursor0 but not libxcb-icccm4/libxcb-keysyms1; shortened.
# Each missing library appears twice: libqxcb and libQt6XcbQpa both need it.
LDD_MISSING = """\
\tlinux-vdso.so.1 (0x00007fd6ea6b6000)
\tlibQt6XcbQpa.so.6 => /venv/PySide6/Qt/plugins/platforms/../../lib/libQt6XcbQpa.so.6 (0x00007fd6ea5e8000)
\tlibGL.so.1 => /lib/x86_64-linux-gnu/libGL.so.1 (0x00007fd6ea558000)
\tlibxkbcommon-x11.so.0 => /lib/x86_64-linux-gnu/libxkbcommon-x11.so.0 (0x00007fd6e99f5000)
\tlibxcb-cursor.so.0 => /lib/x86_64-linux-gnu/libxcb-cursor.so.0 (0x00007fd6e99ee000)
\tlibxcb-icccm.so.4 => not found
\tlibxcb-util.so.1 => /lib/x86_64-linux-gnu/libxcb-util.so.1 (0x00007fd6e99e6000)
\tlibxcb-keysyms.so.1 => not found
\tlibxcb-randr.so.0 => /lib/x86_64-linux-gnu/libxcb-randr.so.0 (0x00007fd6e99cf000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007fd6e881e000)
\tlibxcb-icccm.so.4 => not found
\tlibxcb-keysyms.so.1 => not found
\tlibEGL.so.1 => /lib/x86_64-linux-gnu/libEGL.so.1 (0x00007fd6e90a3000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007fd6ea6b8000)
"""
# What a fresh Ubuntu desktop reports (the original "Could not load xcb" abort).
LDD_FRESH_DESKTOP = """\
\tlibxcb-cursor.so.0 => not found
\tlibxcb-icccm.so.4 => not found
\tlibxcb-keysyms.so.1 => not found
\tlibxkbcommon-x11.so.0 => not found
\tlibEGL.so.1 => not found
\tlibfontconfig.so.1 => not found
\tlibxcb-shape.so.0 => not found
\tlibxcb-render-util.so.0 => not found
\tlibxcb-image.so.0 => not found
\tlibxcb-xkb.so.1 => not found
\tlibdbus-1.so.3 => not found
\tlibxcb-cursor.so.0 => not found
"""
APT = "apt-get install -y --no-install-recommends"


# ----------------------------------------------------------------- parsing and mapping


def test_parse_ldd_lists_each_missing_library_once():
    assert parse_ldd(LDD_MISSING) == ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"]


def test_parse_ldd_of_a_complete_tree_is_empty():
    complete = "".join(line + "\n" for line in LDD_MISSING.splitlines() if "not found" not in line)
    assert parse_ldd(complete) == []
    assert parse_ldd("") == []


def test_missing_sonames_map_to_debian_packages():
    packages, unknown = packages_for(parse_ldd(LDD_FRESH_DESKTOP))
    assert packages == [
        "libxcb-cursor0",
        "libxcb-icccm4",
        "libxcb-keysyms1",
        "libxkbcommon-x11-0",
        "libegl1",
        "libfontconfig1",
        "libxcb-shape0",
        "libxcb-render-util0",
        "libxcb-image0",
        "libxcb-xkb1",
        "libdbus-1-3",
    ]
    assert unknown == []


def test_message_names_the_libraries_and_the_apt_command():
    message = missing_message(parse_ldd(LDD_MISSING))
    assert "libxcb-icccm.so.4, libxcb-keysyms.so.1" in message
    assert f"sudo {APT} libxcb-icccm4 libxcb-keysyms1" in message


def test_a_library_without_a_known_package_is_named_not_guessed():
    message = missing_message(["libxcb-cursor.so.0", "libfancy.so.3"])
    assert f"sudo {APT} libxcb-cursor0\n" in message
    assert "apt-file search libfancy.so.3" in message
    assert "libfancy" not in message.splitlines()[2]  # not in the install command


# ----------------------------------------------------------------- when the app checks


@pytest.fixture
def missing(monkeypatch):
    """missing_libraries() answers what the test puts in this list (no ldd run)."""
    libs: list[str] = []
    monkeypatch.setattr(platform_libs, "missing_libraries", lambda: list(libs))
    return libs


@linux_only
def test_no_display_at_all(missing):
    missing.append("libxcb-icccm.so.4")
    assert display_problem({}) == NO_DISPLAY
    assert display_problem({"QT_QPA_PLATFORM": ""}) == NO_DISPLAY
    assert display_problem({"QT_QPA_PLATFORM": "xcb"}) == NO_X_DISPLAY


@linux_only
def test_x11_with_missing_libraries(missing):
    missing.extend(parse_ldd(LDD_MISSING))
    for env in ({"DISPLAY": ":0"}, {"DISPLAY": ":0", "QT_QPA_PLATFORM": "xcb:nograb"}):
        assert f"sudo {APT} libxcb-icccm4 libxcb-keysyms1" in display_problem(env)
    missing.clear()
    assert display_problem({"DISPLAY": ":0"}) is None


@linux_only
def test_other_platforms_do_not_need_the_xcb_libraries(missing):
    missing.append("libxcb-icccm.so.4")
    assert display_problem({"QT_QPA_PLATFORM": "offscreen"}) is None
    assert display_problem({"QT_QPA_PLATFORM": "wayland;xcb", "DISPLAY": ":0"}) is None
    assert display_problem({"WAYLAND_DISPLAY": "wayland-0"}) is None
    wayland_session = {
        "DISPLAY": ":0",
        "WAYLAND_DISPLAY": "wayland-0",
        "XDG_SESSION_TYPE": "wayland",
    }
    assert display_problem(wayland_session) is None


def test_nothing_to_check_off_linux(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert platform_libs.missing_libraries() == []
    assert display_problem({}) is None


@linux_only
def test_run_app_explains_instead_of_aborting(monkeypatch, capsys):
    from omnidraft.app.main import run_app

    for name in ("QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(name, raising=False)
    assert run_app() == 1
    assert NO_DISPLAY in capsys.readouterr().err


# ----------------------------------------------------------------- the set-up command


def test_setup_is_silent_when_nothing_is_missing(missing, capsys):
    assert platform_libs.main(["--install"]) == 0
    assert capsys.readouterr() == ("", "")


def test_without_root_it_prints_the_command(missing, monkeypatch, capsys):
    missing.extend(parse_ldd(LDD_MISSING))
    monkeypatch.setattr(platform_libs, "can_install", lambda: False)
    assert platform_libs.main(["--install"]) == 1
    assert f"sudo {APT} libxcb-icccm4 libxcb-keysyms1" in capsys.readouterr().err
    # Set-up goes on (the tests run offscreen), saying what `make run` will need.
    assert platform_libs.main(["--install", "--warn"]) == 0
    assert capsys.readouterr().err.startswith("warning: ")


def test_as_root_it_installs_the_packages(missing, monkeypatch):
    missing.extend(parse_ldd(LDD_MISSING))
    installed = []

    def apt_install(packages):
        installed.append(packages)
        missing.clear()
        return True

    monkeypatch.setattr(platform_libs, "can_install", lambda: True)
    monkeypatch.setattr(platform_libs, "apt_install", apt_install)
    assert platform_libs.main(["--install"]) == 0
    assert installed == [["libxcb-icccm4", "libxcb-keysyms1"]]


def test_a_failed_install_still_prints_the_command(missing, monkeypatch, capsys):
    missing.append("libxcb-cursor.so.0")
    monkeypatch.setattr(platform_libs, "can_install", lambda: True)
    monkeypatch.setattr(platform_libs, "apt_install", lambda packages: False)
    assert platform_libs.main(["--install"]) == 1
    assert f"sudo {APT} libxcb-cursor0" in capsys.readouterr().err


# ----------------------------------------------------------------- the real window


def _start_xvfb() -> tuple[subprocess.Popen, str]:
    """Xvfb on a display number it picks itself (-displayfd), so parallel runs
    and a developer's own X servers never collide."""
    read_end, write_end = os.pipe()
    server = subprocess.Popen(
        ["Xvfb", "-displayfd", str(write_end), "-nolisten", "tcp", "-screen", "0", "1280x800x24"],
        pass_fds=(write_end,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        number = pipe.readline().strip()  # written once the server accepts clients
    if not number:
        server.kill()
        server.wait()
        pytest.fail("Xvfb did not start")
    return server, f":{number}"


def _window_titles(display: str) -> str:
    if shutil.which("xdotool"):
        command = ["xdotool", "search", "--onlyvisible", "--name", "OmniDraft Desktop", "getwindowname"]
    else:
        command = ["xwininfo", "-root", "-tree"]
    found = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={**os.environ, "DISPLAY": display},
        timeout=30,
        check=False,
    )
    return found.stdout


def _stop(app: subprocess.Popen) -> None:
    """Ctrl+C to the app alone (it closes its window and stops its worker
    itself), then the whole process group: whatever is left, e.g. a worker mid-load."""
    if app.poll() is None:
        app.send_signal(signal.SIGINT)
        try:
            app.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(app.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    app.wait()


@pytest.mark.integration
@linux_only
@pytest.mark.skipif(
    shutil.which("Xvfb") is None, reason="Xvfb not installed (apt-get install xvfb)"
)
@pytest.mark.skipif(
    shutil.which("xdotool") is None and shutil.which("xwininfo") is None,
    reason="neither xdotool nor xwininfo installed (apt-get install xdotool x11-utils)",
)
def test_the_app_opens_its_window_on_x11(tmp_path):
    from omnidraft import __version__

    title = f"OmniDraft Desktop {__version__}"
    server, display = _start_xvfb()
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
    env.update(DISPLAY=display, OMNIDRAFT_HOME=str(tmp_path / "home"), XDG_SESSION_TYPE="x11")
    log = tmp_path / "app.log"
    try:
        with open(log, "w") as out:
            app = subprocess.Popen(
                [sys.executable, "-m", "omnidraft"],
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: the worker goes with it
            )
        try:
            # The window shows before the worker has loaded any model.
            deadline = time.monotonic() + 90
            titles = ""
            while time.monotonic() < deadline and app.poll() is None:
                titles = _window_titles(display)
                if title in titles:
                    break
                time.sleep(1)
            assert title in titles, (
                f"no window titled {title!r} on {display} "
                f"(app exit status {app.poll()}); its output:\n{log.read_text()}"
            )
        finally:
            _stop(app)
    finally:
        server.terminate()
        server.wait(timeout=30)
