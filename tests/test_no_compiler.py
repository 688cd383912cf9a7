"""The installed kernels need no compiler: the engine and omnidraft-bench, started with
no C compiler on PATH and an empty cache folder, run their 4-bit layers on the
libraries the package's build compiled (core/kernels/lib), and decode as before."""

import json
import os
import sys
from pathlib import Path

import pytest
from omnidraft.core.kernels import build

from tests.tiny import tiny_qwen2, tiny_smol_target

# Each test starts a fresh Python that imports torch and transformers and builds an
# engine: well within the default on an idle machine, minutes on a busy 2-core one.
pytestmark = pytest.mark.timeout(900)

# The engine in a process of its own: a Q4_K_M-like tiny target (as test_kernels.py's
# _file_like), plain and speculative decoding of one prompt.
ENGINE_SCRIPT = """
import json, sys
import torch
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine, LearnSettings
from omnidraft.core.events import TurnFinished
from omnidraft.core.kernels import build, layouts
from omnidraft.core.models import loader, quantize
from omnidraft.core.models.catalog import ModelCatalog

quantize.MIN_WEIGHTS = 0
def file_like(name, w):
    return layouts.fit6(w) if name.endswith(("v_proj", "down_proj", "lm_head")) else layouts.fit_q4_k(w)
loader._four_bit = lambda entry, model: file_like
engine = Engine(ModelCatalog(), dtype=torch.float32, int8=True, learn_settings=LearnSettings(enabled=False))
engine.load_target(sys.argv[1], measure_baseline=False)
cfg = GenerationConfig(max_new_tokens=12)
prompt = "def add(a, b):\\n    return a + b\\n\\ndef add(a, b):\\n"
plain = next(e for e in engine.complete(prompt, cfg) if isinstance(e, TurnFinished))
spec = next(e for e in engine.complete(prompt, cfg, speculative=True) if isinstance(e, TurnFinished))
print(json.dumps({"compiler": build.find_compiler(), "isa": build.kernel_isa(), "library": build.library()._name,
                  "unavailable": build.unavailable(), "runs_as": engine.describe_target().runs_as,
                  "same": plain.token_ids == spec.token_ids, "proposed": spec.stats.proposed}))
"""


def _run(args: list[str], home: Path, tmp_path: Path) -> str:
    """args run with PATH holding the venv's programs and an empty folder only (no
    cc, gcc or clang), no $CC, and OMNIDRAFT_HOME a fresh folder (an empty cache)."""
    import subprocess

    bare = tmp_path / "bare-path"
    bare.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in ("CC", "OMNIDRAFT_KERNEL_ISA")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{bare}", OMNIDRAFT_HOME=str(home),
               QT_QPA_PLATFORM="offscreen")
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, check=False,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _no_kernel_was_compiled(home: Path) -> None:
    assert not [p for p in home.rglob("*") if p.name.startswith("quant_gemm-")]  # the developer path's cache


def test_the_engine_runs_its_4_bit_layers_on_the_prebuilt_kernels_with_no_compiler(tmp_path, qwen_tok):
    target = tmp_path / "target"
    tiny_qwen2(len(qwen_tok), seed=1).save_pretrained(target)
    qwen_tok.save_pretrained(target)
    script = tmp_path / "engine.py"
    script.write_text(ENGINE_SCRIPT)
    home = tmp_path / "home"

    out = json.loads(_run([sys.executable, str(script), str(target)], home, tmp_path).splitlines()[-1])

    assert out["compiler"] is None and out["unavailable"] is None
    best = build.runnable_isas()[0]  # the best build this CPU runs (amx's without tiles the OS lends none)
    assert out["isa"] in (best, "avx512bf16" if best == "amx" else best)
    assert Path(out["library"]).parent == build.PREBUILT
    assert "4-bit weights" in out["runs_as"] and "int8" not in out["runs_as"]
    assert out["same"] and out["proposed"] > 0
    _no_kernel_was_compiled(home)


def test_omnidraft_bench_runs_on_the_prebuilt_kernels_with_no_compiler(tmp_path, smol_tok):
    target = tmp_path / "target"
    tiny_smol_target(target, smol_tok)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "p0", "prompt": "def fibonacci(n):\n    "}) + "\n")
    report = tmp_path / "bench.json"
    home = tmp_path / "home"
    bench = Path(sys.executable).parent / "omnidraft-bench"
    if not bench.exists():
        pytest.skip("omnidraft-bench is not installed beside this Python")

    _run([str(bench), "--target", str(target), "--prompts", str(prompts), "--max-new-tokens", "8",
          "--methods", "target,omnidraft", "--json", str(report)], home, tmp_path)

    result = json.loads(report.read_text())
    assert result["machine"]["kernel"] is not None  # the drafter's 4-bit layers ran on a kernel build
    assert result["greedy_identical"] in (True, 1.0)
    _no_kernel_was_compiled(home)
