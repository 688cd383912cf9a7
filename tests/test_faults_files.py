"""The fault tier (marker `fault`): bad files a person hands the app.

* Add local model refuses a GGUF file cut short and a model folder with random
  weights or a junk tokenizer, each with a sentence, before it reaches the
  Targets menu.
* Import chat refuses a chat whose versions nest without end, and shows figures
  that are not numbers (NaN, infinity) as unknown.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fault

# What a person must never see: an exception's class name or a repr.
EXCEPTION_NAMES = re.compile(
    r"\b\w*(Error|Exception|Expired|Interrupt|Warning)\b|Traceback|<\w+ object at|\w+\(['\"]|\[Errno")


def assert_sentence(text: str) -> None:
    assert text and text.strip()[-1] in ".!?)", text
    assert not EXCEPTION_NAMES.search(text), text


def test_a_gguf_file_cut_to_half_is_refused_at_add(home, tmp_path):
    """Before: it was added, and failed at every switch with "cannot reshape array…"."""
    from omnidraft.core.models.catalog import ModelCatalog, ModelError

    from tests.tiny import TEST_CACHE

    whole = TEST_CACHE / "gguf" / "gemma-3-270m-q4_k_m.gguf"
    if not whole.exists():
        pytest.skip("the Gemma GGUF file is not in the test cache")
    cut = tmp_path / "gemma-cut.gguf"
    with whole.open("rb") as src, cut.open("wb") as dst:
        dst.write(src.read(whole.stat().st_size // 2))
    catalog = ModelCatalog()
    with pytest.raises(ModelError) as refused:
        catalog.add(cut)
    assert "incomplete" in str(refused.value)
    assert_sentence(str(refused.value))
    assert ModelCatalog().entries() == catalog.entries() and not any(e.path == str(cut) for e in catalog.entries())


def _folder(tmp_path: Path, smol_tok, weights: str, tokenizer: str) -> Path:
    from tests.tiny import tiny_smol_target

    folder = tmp_path / f"model-{weights}-{tokenizer}"
    tiny_smol_target(folder, smol_tok)
    st = folder / "model.safetensors"
    if weights == "random":
        st.write_bytes(os.urandom(st.stat().st_size))
    elif weights == "cut":
        data = st.read_bytes()
        st.write_bytes(data[: len(data) // 2])
    if tokenizer == "junk":
        (folder / "tokenizer.json").write_bytes(os.urandom(4096))
    return folder


@pytest.mark.parametrize("weights,tokenizer,says", [
    ("random", "good", "weights file"),
    ("cut", "good", "incomplete"),
    ("good", "junk", "tokenizer.json"),
    ("random", "junk", "weights file"),
])
def test_a_broken_model_folder_is_refused_at_add(home, tmp_path, smol_tok, weights, tokenizer, says):
    """Before: a folder with config.json, random weights and a junk tokenizer.json was
    added, and every switch failed with "Expecting value: line 1 column 1 (char 0)"."""
    from omnidraft.core.models.catalog import ModelCatalog, ModelError

    folder = _folder(tmp_path, smol_tok, weights, tokenizer)
    with pytest.raises(ModelError) as refused:
        ModelCatalog().add(folder)
    assert says in str(refused.value)
    assert_sentence(str(refused.value))
    assert len(ModelCatalog().entries()) == len(ModelCatalog().entries()) and not ModelCatalog()._user


def test_a_sound_model_folder_is_still_added(home, tmp_path, smol_tok):
    from omnidraft.core.models.catalog import ModelCatalog

    entry = ModelCatalog().add(_folder(tmp_path, smol_tok, "good", "good"))
    assert [e.id for e in ModelCatalog()._user] == [entry.id]


def _modes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): oct(p.stat().st_mode & 0o777) for p in [root, *root.rglob("*")]}


def test_what_learning_saves_is_private(home, no_real_keyring):
    """Before: the adapter's files were 0644 (the README says 0600)."""
    from omnidraft.core.learning.adapters import AdapterStore
    from omnidraft.core.storage import paths

    from tests.tiny import tiny_llama

    store = AdapterStore(paths.data_dir() / "adapters", tiny_llama(64), rank=2, alpha=4)
    store.activate("t")
    store.save("t", {"steps": 1})
    modes = _modes(paths.data_dir() / "adapters")
    assert {m for name, m in modes.items() if (paths.data_dir() / "adapters" / name).is_file()} == {"0o600"}, modes
    assert {m for name, m in modes.items() if (paths.data_dir() / "adapters" / name).is_dir()} == {"0o700"}, modes


PRIVATE = r"""
import os, sys
from omnidraft.core.worker.process import private_files
private_files()
from omnidraft.core.storage import paths
cache = paths.cache_dir() / "kernels" / "build"
os.makedirs(cache)
with open(cache / "lib.so", "wb") as f:
    f.write(b"x")
"""


def test_what_the_engine_creates_in_the_cache_is_private(home):
    """Before: cache folders and their files were 0755/0644 (the README says 0700/0600):
    whatever library writes them, the worker creates them private."""
    import subprocess
    import sys

    from omnidraft.core.storage import paths

    subprocess.run([sys.executable, "-c", PRIVATE], check=True, timeout=120,
                   env={**os.environ, "OMNIDRAFT_HOME": str(home)})
    modes = _modes(paths.cache_dir() / "kernels")
    assert modes == {".": "0o700", "build": "0o700", "build/lib.so": "0o600"}, modes


def test_the_context_offered_is_the_models_own_up_to_what_memory_holds(qapp):
    """Before: every model was capped at 8,192 tokens, and Settings did not say so."""
    from omnidraft.app.settings_dialog import SettingsDialog
    from omnidraft.core.models.context import kv_bytes_per_token, model_window
    from omnidraft.core.storage.settings import Settings
    from transformers import Qwen2Config

    qwen = Qwen2Config(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                       max_position_embeddings=32768)  # Qwen2.5-Coder-1.5B's shape
    assert kv_bytes_per_token(qwen) == 2 * 28 * 2 * 128 * 4
    assert model_window(qwen, available=16 * 2**30) == 32768
    small = model_window(qwen, available=2**30)  # a quarter of it for the KV cache
    assert small == 2**30 // 4 // kv_bytes_per_token(qwen) // 1024 * 1024 == 4096
    dialog = SettingsDialog(Settings(), "/tmp", max_context=small, model_context=32768)
    try:
        assert dialog.context.maximum() == 4096
        assert "32,768" in dialog.context_bounds.text() and "4,096" in dialog.context_bounds.text()
    finally:
        dialog.deleteLater()
