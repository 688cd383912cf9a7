"""What the measurement tools share: their parsers, where the evaluation prompts
are, argument types that refuse a bad value before any model loads, and the
kernel builds the A/B tools compare.

The kernel section is the only code in tools/ that reaches into the kernels'
build (its sources): the A/B tools build a git revision's kernels beside the
working tree's and switch between them forward by forward through the kernels'
own `use_build`. `kernels()` names them.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

# The source tree's root when the tools run from a checkout (an editable install).
REPO_ROOT = Path(__file__).resolve().parents[1]


def tool_parser(module_file: str, doc: str | None) -> argparse.ArgumentParser:
    """A tool's parser: named as it is run (`python -m omnidraft.tools.NAME`), its
    docstring as the help's description."""
    return argparse.ArgumentParser(prog=f"python -m omnidraft.tools.{Path(module_file).stem}",
                                   description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def repo_root() -> Path:
    """The checkout the tools run from, or the current directory where they are
    installed elsewhere (relative defaults then read from there)."""
    return REPO_ROOT if (REPO_ROOT / "pyproject.toml").is_file() else Path.cwd()


def eval_file(name: str) -> Path:
    """eval/NAME (dev.jsonl: the 40 dev prompts, train.jsonl: the 144 training
    ones) in the checkout, else in the current directory."""
    for base in (REPO_ROOT, Path.cwd()):
        if (base / "eval" / name).is_file():
            return base / "eval" / name
    return Path("eval") / name  # missing: the tool's error names it as given


# Argument types: a bad value stops the tool at once (exit 2, with a message),
# not after its models have loaded.

def _number(convert, ok, what: str):
    """An argparse type: `convert`'s value where `ok` holds, else "needs {what}"."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not ok(value):  # NaN fails every comparison
            raise argparse.ArgumentTypeError(f"needs {what}, not {text!r}")
        return value
    return parse


positive_int = _number(int, lambda v: v >= 1, "a whole number of 1 or more")
non_negative_int = _number(int, lambda v: v >= 0, "a whole number of 0 or more")
non_negative_float = _number(float, lambda v: v >= 0, "a number of 0 or more")


def positive_float(text: str) -> float:
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"needs a number above 0, not {text!r}")
    return value


def int_list(text: str) -> tuple[int, ...]:
    """Comma-separated whole numbers of 1 or more: "1,5" -> (1, 5)."""
    try:
        return tuple(positive_int(part) for part in text.split(","))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"needs whole numbers of 1 or more, comma-separated (as 1,5), not {text!r}") from None


def float_list(text: str) -> tuple[float, ...]:
    """Comma-separated numbers above 0: "1e-4,3e-4" -> (0.0001, 0.0003)."""
    try:
        return tuple(positive_float(part) for part in text.split(","))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"needs numbers above 0, comma-separated (as 1e-4,3e-4), not {text!r}") from None


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    return path


def output_file(text: str) -> Path:
    """A file to write the report to: its folder must exist now, not at the end of a long run."""
    path = Path(text)
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"no folder {str(path.parent)!r} to write {path.name} in")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file to write")
    return path


def check_file(parser: argparse.ArgumentParser, option: str, path: Path) -> None:
    """parser.error unless path (an option's value or default) is a file."""
    if not path.is_file():
        parser.error(f"{option}: no such file: {path}")


def check_revision(parser: argparse.ArgumentParser, option: str, revision: str) -> None:
    """parser.error unless git knows `revision` as a commit of the checkout."""
    done = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"], cwd=repo_root(),
                          capture_output=True, check=False)
    if done.returncode != 0:
        parser.error(f"{option}: {revision!r} is not a git revision of {repo_root()}")


# Kernel builds: a revision's kernels beside the working tree's.

# Where a revision keeps its kernels: the package (and its C sources), or, before
# it, one module with its sources beside it. Either loads as a module of its own.
PACKAGE_DIR = "core/kernels"
MODULE_DIR, MODULE_FILES = "core/models", ("int4_gemm.c", "decoder_stack.c", "int4_gemm.h", "int4.py")


def kernels() -> SimpleNamespace:
    """The working tree's kernels as the A/B tools call them (imported when a tool
    runs, so every tool's arguments parse without them)."""
    from omnidraft.core.kernels import build, layouts, linear

    return _facade(build, layouts, linear)


def _facade(build, layouts, linear) -> SimpleNamespace:
    return SimpleNamespace(build=build, Q4K=layouts.Q4K, Q6=layouts.Q6, Q4_K=layouts.Q4_K, Q6_K=layouts.Q6_K,
                           q4_mm=linear.quant_mm, amx_rows=build.amx_rows, KernelUnavailable=build.KernelUnavailable)


def sources_at(revision: str, folder: Path) -> Path:
    """The kernels as git `revision` holds them, written into folder."""
    def show(path: str) -> bytes | None:
        done = subprocess.run(["git", "show", f"{revision}:{path}"], cwd=repo_root(), capture_output=True, check=False)
        return done.stdout if done.returncode == 0 else None

    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", revision, PACKAGE_DIR], cwd=repo_root(),
                            capture_output=True, text=True, check=False).stdout.split()
    if listed:
        for path in listed:
            out = folder / "kernels" / Path(path).relative_to(PACKAGE_DIR)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(show(path) or b"")
        return folder
    for name in MODULE_FILES:  # an older revision: one module and its sources
        text = show(f"{MODULE_DIR}/{name}")
        if text is not None:
            (folder / name).write_bytes(text)
    return folder


def module_at(folder: Path):
    """The kernels in `folder` (sources_at's) loaded beside the working tree's, into
    the package they were written for (their relative imports: ..storage)."""
    tag = abs(hash(folder))
    if (folder / "kernels").is_dir():
        name = f"omnidraft.core._kernels_{tag}"
        spec = importlib.util.spec_from_file_location(name, folder / "kernels" / "__init__.py",
                                                      submodule_search_locations=[str(folder / "kernels")])
        package = importlib.util.module_from_spec(spec)
        sys.modules[name] = package
        spec.loader.exec_module(package)
        parts = [importlib.import_module(f"{name}.{part}") for part in ("build", "layouts", "linear")]
        return _facade(*parts)
    spec = importlib.util.spec_from_file_location(f"omnidraft.core.models._int4_{tag}", folder / "int4.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_at(module, folder: Path):
    """The kernels `module` (module_at's) builds from `folder`'s sources."""
    if isinstance(module, SimpleNamespace):
        build = module.build
        csrc = folder / "kernels" / "csrc"
        build.SOURCES = [p for p in (csrc / "quant_gemm.c", csrc / "decoder_stack.c") if p.exists()]
        build.HEADERS = [p for p in [csrc / "quant_gemm.h"] if p.exists()]
        build.forget_builds()
        lib = build.library()
    else:  # an older revision's single module
        module._SOURCES = [folder / "int4_gemm.c", folder / "decoder_stack.c"]
        module._HEADERS = [path for path in [folder / "int4_gemm.h"] if path.exists()]
        module._library.cache_clear()
        lib = module._library()
    if isinstance(lib, Exception):
        raise SystemExit(f"{folder}: {lib}")
    return lib


def working_build():
    """The working tree's kernels, the build this CPU runs (OMNIDRAFT_KERNEL_ISA
    picks one by name)."""
    build = kernels().build
    lib = build.library()
    if isinstance(lib, build.KernelUnavailable):
        raise SystemExit(f"the working tree's kernels: {lib}")
    return lib


_CHOSEN: dict = {}


def use_build(lib, module=None) -> None:
    """Run `module`'s kernel calls (default: the working tree's) on `lib`, a build
    from build_at or working_build, until the next call; lib None gives it its own
    choice back. The nets ask for the library at each forward, so this switches
    builds between two forwards. Another revision's stack binding must be of this
    interface version (its ABI): the working tree's nets refuse any other."""
    module = module or kernels()
    if not isinstance(module, SimpleNamespace):  # an older revision's module: its own loader
        own = _CHOSEN.setdefault(id(module), module._library)
        module._library = own if lib is None else (lambda isa=None: lib)
        return
    key = module.build.__name__
    held = _CHOSEN.pop(key, None)
    if held is not None:
        held.close()
    if lib is not None:
        stack = ExitStack()
        stack.enter_context(module.build.use_build(lib))
        _CHOSEN[key] = stack


def prompt_nets(max_len: int = 1024, target: str = "qwen2.5-coder-1.5b-instruct") -> dict:
    """The bundled drafter's net (room for max_len positions) and the target's, as
    a reply reads a prompt with them."""
    import torch
    from omnidraft.core.models.catalog import SMOLLM2_ID, ModelCatalog
    from omnidraft.core.models.lean_llama import LeanLlama
    from omnidraft.core.models.loader import load

    catalog = ModelCatalog()
    return {"drafter": LeanLlama(load(catalog.get(SMOLLM2_ID), torch.bfloat16).model, int8=True, int4=True,
                                 max_len=max_len),
            "target": load(catalog.get(target), torch.bfloat16, int8=True).runner.net}


def write_json(path: Path | None, report: dict, indent: int = 1) -> None:
    """Write the report to path, if one was given."""
    if path:
        import json

        path.write_text(json.dumps(report, indent=indent) + "\n")
