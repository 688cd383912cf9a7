"""The layers stay apart, read from the source (nothing is imported): the engine in
core/ runs without Qt (the worker process, the bench, the tools), the app in app/
reaches torch, transformers and peft only through core/, and the local server in
server/ uses neither Qt nor the model libraries (it talks to the engine worker)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Per layer: the top-level packages it must not import, lazily inside a function included.
FORBIDDEN = {
    "core": {"PySide6", "qasync", "pyqtgraph", "omnidraft.app"},
    "app": {"torch", "transformers", "peft"},
    "server": {"PySide6", "qasync", "pyqtgraph", "omnidraft.app", "torch", "transformers", "peft"},
}


def imported_modules(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, module) of each import in the file; relative imports resolved against
    the omnidraft package the file is installed as (core/ -> omnidraft.core)."""
    package = ["omnidraft", *path.relative_to(root).parent.parts]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
    return found


def _breaks(module: str, forbidden: set[str]) -> bool:
    return any(module == name or module.startswith(name + ".") for name in forbidden)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_nothing_it_must_not(layer):
    files = sorted((ROOT / layer).rglob("*.py"))
    assert files, f"no sources under {layer}/"
    wrong = [f"{path.relative_to(ROOT)}:{line}: {module}"
             for path in files for line, module in imported_modules(path)
             if _breaks(module, FORBIDDEN[layer])]
    assert not wrong, f"{layer}/ imports what it must not:\n" + "\n".join(wrong)


def test_the_check_sees_lazy_relative_and_dotted_imports(tmp_path):
    probe = tmp_path / "core" / "engine.py"
    probe.parent.mkdir()
    probe.write_text("def f():\n    import PySide6.QtCore\n"
                     "from ..app import main_window\nfrom pyqtgraph import PlotWidget\nimport torch\n")
    modules = sorted(m for _, m in imported_modules(probe, tmp_path))
    assert modules == ["PySide6.QtCore", "omnidraft.app", "pyqtgraph", "torch"]
    assert [m for m in modules if _breaks(m, FORBIDDEN["core"])] == modules[:3]
    assert _breaks("torch.nn", FORBIDDEN["app"]) and not _breaks("torchvision", FORBIDDEN["app"])


def test_the_window_and_the_server_start_without_torch():
    """The GUI process and `omnidraft serve` talk to the engine worker only: importing
    them loads no torch (seconds and hundreds of MB in a process that never runs a model)."""
    import os
    import subprocess
    import sys

    code = ("import sys; import omnidraft.app.main_window, omnidraft.server.api, omnidraft.server.runner; "
            "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
