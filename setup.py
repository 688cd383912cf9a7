"""The package's build step beyond pyproject.toml: the C kernels (core/kernels/csrc)
compiled into shared libraries inside the package (omnidraft/core/kernels/lib), one
per build of core/kernels/build.py's ISAS (every x86 instruction set they are
written for, and the portable generic build), so the app never needs a compiler.

It runs for a wheel (`pip wheel .`, `python -m build`), a plain install, and an
editable one (`pip install -e .`, where the libraries land in core/kernels/lib of
the source tree). The libraries are built with build.py's own flags and loaded by
it at run time (the best this CPU runs). A build the compiler cannot make (an older
gcc without AMX intrinsics, a compiler for another CPU) is skipped with a warning;
the install still succeeds, and the generic build serves where nothing better runs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
# Where the package maps omnidraft.core (pyproject.toml's package-dir) and its kernels.
KERNELS = Path("core", "kernels")
INSTALLED = Path("omnidraft", "core", "kernels")


def kernel_build():
    """core/kernels/build.py, loaded alone (it imports nothing of the package at its top)."""
    spec = importlib.util.spec_from_file_location("_omnidraft_kernel_build", ROOT / KERNELS / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and the like look their module up
    spec.loader.exec_module(module)
    return module


class BuildKernels(build_ext):
    """build_ext for shared libraries loaded with ctypes (no Python extension
    modules: nothing links libpython, and one library serves every Python)."""

    def run(self) -> None:
        build = kernel_build()
        inplace = self.inplace or getattr(self, "editable_mode", False)
        folder = ROOT / KERNELS / build.PREBUILT.name if inplace else Path(self.build_lib) / INSTALLED / "lib"
        self._folder = folder
        compiler = build.find_compiler()
        print(f"building the C kernels into {folder} with {compiler or 'no compiler'}")
        manifest = build.build_all(folder, compiler)
        for isa, entry in manifest["builds"].items():
            if "file" in entry:
                print(f"  {isa}: built")
            else:
                self.warn(f"the {isa} kernel build was skipped: {entry['skipped']}")
        if "file" not in manifest["builds"]["generic"]:
            self.warn("not even the generic kernel built: OmniDraft will run its models in int8, slower")

    def get_outputs(self) -> list[str]:
        folder = getattr(self, "_folder", None)
        return [str(path) for path in sorted(folder.iterdir())] if folder and folder.is_dir() else []


class BinaryDistribution(Distribution):
    """A platform wheel (the libraries are machine code), and build_ext always runs."""

    def has_ext_modules(self) -> bool:
        return True


setup(distclass=BinaryDistribution, cmdclass={"build_ext": BuildKernels})
