"""Shared fixtures. Every test session gets its own OMNIDRAFT_HOME; converted
model weights are kept between runs in .test-cache/
(re-creatable, git-ignored) so repeated runs stay fast."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tests.tiny import TEST_CACHE

ROOT = Path(__file__).resolve().parent.parent
EVAL_DIR = ROOT / "eval"

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Never touch a developer's real keyring from tests.
os.environ["PYTHON_KEYRING_BACKEND"] = "keyring.backends.fail.Keyring"
os.environ["OMNIDRAFT_HOME"] = tempfile.mkdtemp(prefix="omnidraft-test-home-")
# Converted models are pure caches: share them across test runs.
(TEST_CACHE / "models").mkdir(parents=True, exist_ok=True)
(TEST_CACHE / "gguf").mkdir(parents=True, exist_ok=True)
_cache = Path(os.environ["OMNIDRAFT_HOME"]) / "cache"
_cache.mkdir(parents=True, exist_ok=True)
for _name in ("models", "gguf"):
    (_cache / _name).symlink_to(TEST_CACHE / _name)


def _tokenizer(entry_id: str):
    """The bundled model's real tokenizer, from its converted copy (converting the
    GGUF once serves both these fixtures and the bundled-model smoke tests)."""
    from omnidraft.core.models.catalog import BUNDLED
    from omnidraft.core.models.loader import weights_folder
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(weights_folder(BUNDLED[entry_id]))


@pytest.fixture(scope="session")
def smol_tok():
    return _tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma_tok():
    return _tokenizer("gemma-3-270m")


@pytest.fixture(scope="session")
def qwen_tok():
    """The Qwen2 tokenizer of both bundled Qwen2.5-Coder targets (from the smaller one)."""
    return _tokenizer("qwen2.5-coder-0.5b-instruct")


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh, empty OMNIDRAFT_HOME for one test."""
    monkeypatch.setenv("OMNIDRAFT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="session", autouse=True)
def tiny_drafter(smol_tok):
    """Engines made in tests (and worker processes they spawn) draft with a tiny
    random Llama instead of loading the real SmolLM2; tests of the real models
    pass drafter_id explicitly."""
    from tests.tiny import tiny_llama

    folder = TEST_CACHE / "tiny-drafter"
    if not (folder / "config.json").exists():
        tiny_llama(len(smol_tok), seed=9).save_pretrained(folder)
        smol_tok.save_pretrained(folder)
    os.environ["OMNIDRAFT_DRAFTER"] = str(folder)
    return folder


@pytest.fixture(scope="module")
def cross(smol_tok, gemma_tok):
    """Cross-vocabulary decoding parts: a tiny random Gemma-3 target, a tiny random
    Llama drafter with SmolLM2's tokenizer, and their vocabulary bridge."""
    from omnidraft.core.decoding.vocab_bridge import VocabBridge

    from tests.tiny import lean_drafter, tiny_gemma3, tiny_llama

    target = tiny_gemma3(len(gemma_tok), seed=1)
    drafter = lean_drafter(tiny_llama(len(smol_tok), seed=2), smol_tok)
    return target, drafter, VocabBridge(smol_tok, gemma_tok)


@pytest.fixture
def target_dir(tmp_path, gemma_tok):
    """A folder holding a tiny random Gemma-3 target (tests.tiny.tiny_gemma_target)."""
    from tests.tiny import tiny_gemma_target

    return tiny_gemma_target(tmp_path / "tiny-gemma", gemma_tok)


@pytest.fixture
def no_real_keyring(monkeypatch):
    """Whatever a test does, the process-wide keyring is a fail backend and no
    default key store is cached from another test."""
    import keyring
    from keyring.backends import fail
    from omnidraft.core.storage import secure_store

    monkeypatch.setattr(keyring, "get_keyring", lambda: fail.Keyring())
    monkeypatch.setattr(secure_store, "_default", {})


@pytest.fixture(scope="module")
def gui_home(tmp_path_factory):
    """Like `home`, for a whole module of GUI tests: their window lives that long."""
    home = tmp_path_factory.mktemp("gui") / "home"
    home.mkdir()
    # Converted weights (the drafter's) are a cache: share the session home's, whose
    # folders conftest links to .test-cache, instead of converting again.
    (home / "cache").symlink_to(Path(os.environ["OMNIDRAFT_HOME"]) / "cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMNIDRAFT_HOME", str(home))
        yield home


@pytest.fixture(scope="module")
def qt_loop(qapp):
    """The qasync loop, attached to the Qt loop pytest-qt already spins."""
    import asyncio

    import qasync

    loop = qasync.QEventLoop(qapp, already_running=True)
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.events._set_running_loop(None)
    asyncio.set_event_loop(None)


@pytest.fixture
def hub(monkeypatch):
    """A local server answering like the Hugging Face Hub (tests/fake_hub.py), with
    huggingface_hub pointed at it."""
    from tests.fake_hub import FakeHub

    server = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    yield server
    server.close()
