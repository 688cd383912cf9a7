"""Shared fixtures and the test tiers' markers. Every test session (each
pytest-xdist worker too) gets its own OMNIDRAFT_HOME; assembled model files and
the real tokenizers are kept between runs in .test-cache/ (re-creatable,
git-ignored) so repeated runs stay fast."""

from __future__ import annotations

import functools
import inspect
import os
import shutil
import subprocess
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
# Assembled model files are pure caches: share them across test runs.
(TEST_CACHE / "gguf").mkdir(parents=True, exist_ok=True)
_cache = Path(os.environ["OMNIDRAFT_HOME"]) / "cache"
_cache.mkdir(parents=True, exist_ok=True)
(_cache / "gguf").symlink_to(TEST_CACHE / "gguf")


# ------------------------------------------------------------------ test tiers
# Markers are given here, from what a test uses, so test files need no marks of
# their own (pyproject.toml registers them; the Makefile's tiers select on them):
#   gui      uses pytest-qt (qtbot, qapp) or the app's window fixtures
#   process  starts another process: an engine worker, the app, a helper program
#   models   loads a bundled model's weights or reads its GGUF file
#   engine   drives a whole Engine (tiny models): decoding, learning rounds and
#            saved state end to end, where a unit test checks one part
# `make test-unit` leaves all four out, and there (whenever -m leaves out
# `process` or `models`) a test that starts a process or opens a bundled model
# file anyway fails, naming the entry to add below.
GUI_FIXTURES = {"qtbot", "qapp", "qt_loop", "gui_home"}
# By file: fixtures and tests (their names without parameters) that start
# processes or load bundled models; "*": the whole file.
STARTS_PROCESSES = {
    "test_answer_quality.py": {"*"},
    "test_bench.py": {"test_llamacpp_server_methods_drive_the_servers_api"},
    "test_faults.py": {
        "test_random_kills_during_saves_lose_nothing_that_was_saved",
        "test_a_lock_of_a_killed_app_is_taken_over",
        "test_a_second_engine_on_the_same_folder_is_refused",
        "test_an_engine_whose_gui_was_killed_mid_reply_stops_and_frees_the_folder",
    },
    "test_faults_files.py": {"test_what_the_engine_creates_in_the_cache_is_private"},
    "test_faults_lifetime.py": {"test_a_gui_killed_during_a_model_load_takes_its_engine_along"},
    "test_gui.py": {"window"},
    "test_layering.py": {"test_the_window_and_the_server_start_without_torch"},
    "test_no_compiler.py": {"*"},
    "test_packaging.py": {"test_a_frozen_style_worker_starts_through_the_entry_point",
                          "test_the_desktop_entry_installer_points_the_menu_at_the_bundle"},
    "test_platform_libs.py": {"test_the_app_opens_its_window_on_x11"},
    "test_server.py": {"served"},
    "test_worker.py": {"worker", "test_killed_worker_can_be_restarted"},
}
LOADS_MODELS = {
    "test_answer_quality.py": {"*"},
    "test_bench.py": {"test_omnidraft_on_gemma_is_lossless_when_greedy"},
    "test_bundled_models.py": {"*"},
    "test_faults_files.py": {"test_a_gguf_file_cut_to_half_is_refused_at_add"},
    "test_gguf_loading.py": {"*"},
    "test_gui_bundled.py": {"*"},
    "test_model_info.py": {"test_a_bundled_q4_k_m_file_shows_its_real_mix"},
}
# Programs a unit-tier test may start: the kernels' C compiler (core/kernels
# builds its library once into a cache), git (the tools' --against checks) and
# uname (Python's platform module).
ALLOWED_PROGRAMS = {"cc", "gcc", "clang", "git", "uname"}
MODELS_TIMEOUT_S = 1200  # a fresh cache converts a bundled model first (minutes on 2 cores)


# A test, or a fixture or helper of its file it uses, that builds an engine
# calls one of these.
ENGINE_BUILDERS = ("tiny_engine(", "learning_engine(", "Engine(", "cli.main(")
_ENGINE_HELPERS: dict = {}  # module -> names of its functions that build engines


@functools.cache  # the same fixtures serve hundreds of tests
def _source(function) -> str:
    try:
        return inspect.getsource(function)
    except (TypeError, OSError):
        return ""


def _engine_helpers(module) -> set[str]:
    """Functions of a test module that build an engine, directly or through another."""
    if module not in _ENGINE_HELPERS:
        own = {name: _source(f) for name, f in vars(module).items()
               if inspect.isfunction(f) and f.__module__ == module.__name__}
        found: set[str] = set()
        calls = ENGINE_BUILDERS
        while True:
            more = {name for name, text in own.items() if name not in found and any(c in text for c in calls)}
            if not more:
                break
            found |= more
            calls = (*calls, *(f"{name}(" for name in more))
        _ENGINE_HELPERS[module] = found
    return _ENGINE_HELPERS[module]


def _drives_engine(item) -> bool:
    helpers = tuple(f"{name}(" for name in _engine_helpers(item.module))
    functions = [item.function]
    functions += [d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs]
    return any(any(c in _source(f) for c in (*ENGINE_BUILDERS, *helpers)) for f in functions)


def _listed(item, table: dict) -> bool:
    names = table.get(item.path.name, ())
    return "*" in names or item.originalname in names or bool(set(item.fixturenames) & set(names))


@pytest.hookimpl(tryfirst=True)  # before -m deselects and xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        if GUI_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.gui)
        if _listed(item, STARTS_PROCESSES):
            item.add_marker(pytest.mark.process)
        if _drives_engine(item):
            item.add_marker(pytest.mark.engine)
        if _listed(item, LOADS_MODELS):
            item.add_marker(pytest.mark.models)
            item.add_marker(pytest.mark.timeout(MODELS_TIMEOUT_S))
        # Under `--dist loadgroup` a file's tests share one worker (and its
        # module-scoped windows, workers and models); the bundled-model tests of
        # all files share one too, so no two workers convert the same model.
        group = "models" if item.get_closest_marker("models") else item.path.name
        item.add_marker(pytest.mark.xdist_group(group))


def _left_out(config, marker: str) -> bool:
    """Whether this run's -m expression deselects tests marked `marker` alone."""
    from _pytest.mark.expression import Expression

    expr = config.getoption("markexpr")
    if not expr:
        return False
    return not Expression.compile(expr).evaluate(lambda name: name == marker)


_BUNDLED_FILES = {}  # the bundled models' file getters, unguarded (conftest's tokenizers)
_IN_TEST = [False]  # the guards hold while a test runs, not while pytest starts or collects


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _IN_TEST[0] = True
    try:
        return (yield)
    finally:
        _IN_TEST[0] = False


def pytest_configure(config):
    from omnidraft.core.models import catalog

    _BUNDLED_FILES.update(catalog._BUNDLED_FILES)
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        return  # pytest-xdist's controller: it starts the workers, and runs no test
    if _left_out(config, "process"):
        _guard_processes()
    if _left_out(config, "models"):
        for entry_id in catalog._BUNDLED_FILES:
            catalog._BUNDLED_FILES[entry_id] = _refuse_models


def _refuse_models(*args, **kwargs):
    assert _IN_TEST[0], "a bundled model file opened outside any test"
    pytest.fail("this test opens a bundled model file: add it to LOADS_MODELS in tests/conftest.py "
                "(marker `models`)")


def _guard_processes() -> None:
    import multiprocessing.process

    popen_init = subprocess.Popen.__init__
    process_start = multiprocessing.process.BaseProcess.start

    def guarded_popen(self, args, *rest, **kwargs):
        program = args if isinstance(args, (str, bytes, os.PathLike)) else args[0]
        if _IN_TEST[0] and Path(os.fsdecode(program).split()[0]).name not in ALLOWED_PROGRAMS:
            _refuse_process(program)
        popen_init(self, args, *rest, **kwargs)

    def guarded_start(self):
        if _IN_TEST[0]:
            _refuse_process(self.name)
        process_start(self)

    subprocess.Popen.__init__ = guarded_popen  # for the whole session: it is this tier's rule
    multiprocessing.process.BaseProcess.start = guarded_start


def _refuse_process(what) -> None:
    pytest.fail(f"this test starts a process ({what}): add it to STARTS_PROCESSES in "
                "tests/conftest.py (marker `process`)")


def _tokenizer(entry_id: str):
    """The bundled model's real tokenizer: the fast tiers' test data, not a model.
    Read once from the GGUF file's header (no weights) into .test-cache/tokenizers.
    Written under another name and renamed, so parallel test workers never read
    half a folder."""
    from transformers import AutoTokenizer

    gguf = _BUNDLED_FILES[entry_id]()  # the unguarded getter (see pytest_configure)
    folder = TEST_CACHE / "tokenizers" / f"{entry_id}-{gguf.stat().st_size}"
    if (folder / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    _save_atomically(tokenizer.save_pretrained, folder)
    return tokenizer


def _save_atomically(save, folder: Path) -> None:
    """save(tmp) into a fresh folder beside `folder`, then rename it to `folder`
    unless another process got there first."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    save(tmp)
    try:
        os.rename(tmp, folder)
    except OSError:  # made meanwhile by a parallel worker
        shutil.rmtree(tmp, ignore_errors=True)


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
        def save(tmp):
            tiny_llama(len(smol_tok), seed=9).save_pretrained(tmp)
            smol_tok.save_pretrained(tmp)

        _save_atomically(save, folder)
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
