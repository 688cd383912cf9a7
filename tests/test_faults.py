"""The fault tier (`make test-fault`, marker `fault`): what a crash, a damaged
file or a second app does to the user's data, probed as a hostile but fair tester would.

* Crash injection: a child process saves every kind of data file in a loop
  (chat, replay log, n-gram cache, drafting statistics, chart history, learned
  adapter) and is killed with SIGKILL at random moments; after each kill
  everything it had reported saved loads back, and nothing is set aside.
* Corruption of every file kind (garbage, cut short, valid JSON of the wrong
  shape): set aside as .corrupt and reported, never fatal, never overwritten
  unseen; a model file cut short after it was added is named at the next switch.
* Two apps and two engines on one data folder: the second is refused.
* A GUI killed mid-reply: its engine stops and the folder is free again.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from keyring.backends import fail
from omnidraft.core.storage import paths

pytestmark = pytest.mark.fault

ROOT = Path(__file__).resolve().parent.parent
KILLS = 12  # child processes killed; each kill lands at a random point of a save loop

SAVER = r"""
import sys
import torch
from omnidraft.app.metrics_history import MetricsHistory
from omnidraft.core.decoding.adaptive_drafting import DraftPolicy
from omnidraft.core.decoding.vocab_bridge import NgramCache
from omnidraft.core.events import TurnStats
from omnidraft.core.learning.adapters import AdapterStore
from omnidraft.core.learning.replay_buffer import ReplayBuffer, Sample
from omnidraft.core.storage import paths
from omnidraft.core.storage.conversations import ConversationStore
from tests.tiny import tiny_llama

data = paths.data_dir()
store = ConversationStore()
conv = store.list()[0] if len(store) else store.new()
buffer = ReplayBuffer.load(data / "replay.bin", max_samples=100_000)
ngram = NgramCache.load(data / "ngram_cache.bin")
policy = DraftPolicy.load(data / "draft_policy.bin")
history = MetricsHistory()
history.load()
adapters = AdapterStore(data / "adapters", tiny_llama(64), rank=2, alpha=4)
adapters.activate("t")
steps = adapters.meta("t").get("steps", 0)
stats = TurnStats(method="omnidraft", new_tokens=10, seconds=1.0, steps=5, proposed=4, accepted=2)


def ack(kind, count):
    print(kind, count, flush=True)


while True:
    n = len(store.get(conv.id).messages)
    store.append_message(conv.id, "user", f"message {n}")
    ack("chat", n + 1)
    buffer.add(Sample([1, 2, buffer.total_added], 2, [3, 4], 1))
    buffer.save()
    ack("replay", len(buffer))
    k = len(ngram)
    ngram.add((k + 1,), (k + 1,))
    ngram.save(data / "ngram_cache.bin")
    ack("ngram", len(ngram))
    policy.record("drafter", 1, 0.1)
    policy.save(data / "draft_policy.bin")
    ack("policy", int(policy.stats["drafter"].steps))
    history.add_turn(stats, "m", 2.0)
    history.save()
    ack("history", len(history.replies))
    steps += 1
    adapters.save("t", {"steps": steps})
    ack("adapter", steps)
"""


def _keys():
    from omnidraft.core.storage.secure_store import KeyStore

    return KeyStore(paths.data_dir(), fail.Keyring())


def _loaded_counts() -> tuple[dict[str, int], list[str]]:
    """What a fresh start finds in the data folder, and its warnings."""
    from omnidraft.app.metrics_history import MetricsHistory
    from omnidraft.core.decoding.adaptive_drafting import DraftPolicy
    from omnidraft.core.decoding.vocab_bridge import NgramCache
    from omnidraft.core.learning.adapters import AdapterStore
    from omnidraft.core.learning.replay_buffer import ReplayBuffer
    from omnidraft.core.storage.conversations import ConversationStore

    from tests.tiny import tiny_llama

    keys, data = _keys(), paths.data_dir()
    store = ConversationStore(keys=keys)
    buffer = ReplayBuffer.load(data / "replay.bin", max_samples=100_000, keys=keys)
    history = MetricsHistory()
    history.load()
    policy = DraftPolicy.load(data / "draft_policy.bin", keys)
    adapters = AdapterStore(data / "adapters", tiny_llama(64), rank=2, alpha=4, keys=keys)
    counts = {
        "chat": sum(len(c.messages) for c in store.list()),
        "replay": len(buffer),
        "ngram": len(NgramCache.load(data / "ngram_cache.bin", keys=keys)),
        "policy": int(policy.stats["drafter"].steps) if "drafter" in policy.stats else 0,
        "history": len(history.replies),
        "adapter": adapters.meta("t").get("steps", 0),
    }
    warnings = [*store.warnings, *adapters.warnings, *filter(None, [buffer.warning, history.load_warning])]
    return counts, warnings


@pytest.mark.slow
def test_random_kills_during_saves_lose_nothing_that_was_saved(home):
    rng = random.Random(14)
    acked: dict[str, int] = {}
    env = {**os.environ, "OMNIDRAFT_HOME": str(home), "PYTHONPATH": str(ROOT)}
    for kill in range(KILLS):
        child = subprocess.Popen([sys.executable, "-c", SAVER], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = threading.Event()

        def read(child=child, first=first) -> None:
            for line in child.stdout:
                kind, count = line.split()
                acked[kind] = int(count)
                first.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert first.wait(120), child.stderr.read() if child.poll() is not None else "no save within 120 s"
        time.sleep(rng.uniform(0.0, 1.5))
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
        reader.join(10)
        counts, warnings = _loaded_counts()
        assert warnings == [], f"kill {kill}: {warnings}"
        for kind, saved in acked.items():
            # Everything reported saved is there; at most the save in flight also made it.
            assert saved <= counts[kind] <= saved + 1, (kill, kind, saved, counts[kind])
    assert min(acked.values()) >= KILLS, "the kills landed before most saves"
    leftovers = [p.name for p in paths.data_dir().rglob("*") if p.name.endswith(".corrupt")]
    assert leftovers == []


# ---------------------------------------------------------------- corruption


def _encrypted(obj) -> bytes:
    return _keys().encrypt(json.dumps(obj).encode())


def _make_chat():
    from omnidraft.core.storage.conversations import ConversationStore

    store = ConversationStore(keys=_keys())
    conv = store.new()
    store.append_message(conv.id, "user", "hello")
    return store._path(conv.id)


def _load_chat():
    from omnidraft.core.storage.conversations import ConversationStore

    return ConversationStore(keys=_keys()).warnings


def _make_replay():
    from omnidraft.core.learning.replay_buffer import ReplayBuffer, Sample

    buffer = ReplayBuffer(paths.data_dir() / "replay.bin", keys=_keys())
    buffer.add(Sample([1, 2, 3], 2, [4, 5], 1))
    buffer.save()
    return buffer.path


def _load_replay():
    from omnidraft.core.learning.replay_buffer import ReplayBuffer

    return list(filter(None, [ReplayBuffer.load(paths.data_dir() / "replay.bin", keys=_keys()).warning]))


def _make_state(kind):
    def make():
        from omnidraft.core.decoding.adaptive_drafting import DraftPolicy
        from omnidraft.core.decoding.vocab_bridge import NgramCache

        if kind == "ngram":
            state = NgramCache()
            state.add((1, 2), (3,))
        else:
            state = DraftPolicy()
            state.record("drafter", 2, 0.5)
        path = paths.data_dir() / f"{kind}.bin"
        state.save(path, _keys())
        return path
    return make


def _load_state(kind):
    def load():
        from omnidraft.core.decoding.adaptive_drafting import DraftPolicy
        from omnidraft.core.decoding.vocab_bridge import NgramCache
        from omnidraft.core.storage.persistence import CorruptStateError

        cls = NgramCache if kind == "ngram" else DraftPolicy
        try:
            cls.load(paths.data_dir() / f"{kind}.bin", keys=_keys())
        except CorruptStateError as exc:  # what the engine does with it (TargetState._load)
            return [f"damaged; kept as {exc.quarantine().name}"]
        return []
    return load


def _make_history():
    from omnidraft.app.metrics_history import MetricsHistory
    from omnidraft.core.events import TurnStats

    history = MetricsHistory()
    history.add_turn(TurnStats(method="target", new_tokens=3, seconds=1.0), "m", None)
    history.save()
    return history.path


def _load_history():
    from omnidraft.app.metrics_history import MetricsHistory

    history = MetricsHistory()
    history.load()
    return list(filter(None, [history.load_warning]))


def _make_catalog():
    from omnidraft.core.models.catalog import ModelCatalog

    catalog = ModelCatalog()
    catalog._save()
    return catalog.store


def _load_catalog():
    from omnidraft.core.models.catalog import ModelCatalog

    return list(filter(None, [ModelCatalog().load_warning]))


def _make_settings():
    from omnidraft.core.storage.settings import Settings, save_settings, settings_path

    save_settings(Settings())
    return settings_path()


def _load_settings():
    from omnidraft.core.storage.settings import load_settings

    return load_settings()[1]


def _make_adapter_meta():
    from omnidraft.core.learning.adapters import META_FILE, AdapterStore

    from tests.tiny import tiny_llama

    store = AdapterStore(paths.data_dir() / "adapters", tiny_llama(64), rank=2, alpha=4, keys=_keys())
    store.activate("t")
    store.save("t", {"steps": 3})
    return store.folder("t") / META_FILE


def _load_adapter_meta():
    from omnidraft.core.learning.adapters import AdapterStore

    from tests.tiny import tiny_llama

    store = AdapterStore(paths.data_dir() / "adapters", tiny_llama(64), rank=2, alpha=4, keys=_keys())
    store.meta("t")
    store.activate("t")
    return store.warnings


KINDS = {
    "chat": (_make_chat, _load_chat),
    "replay": (_make_replay, _load_replay),
    "ngram": (_make_state("ngram"), _load_state("ngram")),
    "policy": (_make_state("policy"), _load_state("policy")),
    "history": (_make_history, _load_history),
    "catalog": (_make_catalog, _load_catalog),
    "settings": (_make_settings, _load_settings),
    "adapter": (_make_adapter_meta, _load_adapter_meta),
}
ENCRYPTED = {"chat", "replay", "ngram", "policy", "adapter"}


def _damage(path: Path, how: str, kind: str) -> None:
    data = path.read_bytes()
    if how == "garbage":  # ending a line, so the chart history's log does not read it as cut short
        path.write_bytes(os.urandom(max(len(data) - 1, 16)) + b"\n")
    elif how == "cut":
        path.write_bytes(data[: len(data) // 2])
    elif how == "wrong-shape":  # valid (and, where it should be, encrypted) JSON, not this kind
        shape = ["not", {"what": "this file holds"}]
        if kind == "history":
            path.write_bytes(b'{"reply": [1, 2]}\n')
        elif kind == "replay":
            from omnidraft.core.learning.replay_buffer import LOG_MAGIC

            record = _encrypted({"sample": shape})
            path.write_bytes(LOG_MAGIC + len(record).to_bytes(4, "big") + record)
        else:
            path.write_bytes(_encrypted(shape) if kind in ENCRYPTED else json.dumps(shape).encode())


@pytest.mark.parametrize("how", ["garbage", "cut", "wrong-shape"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_damaged_file_kind_is_set_aside_and_reported(home, kind, how):
    make, load = KINDS[kind]
    path = make()
    _damage(path, how, kind)
    damaged = path.read_bytes()
    warnings = load()
    if kind in ("replay", "history") and how == "cut":
        # A log cut short reads as a kill in the middle of its last append: the
        # records before it load, nothing is set aside.
        assert warnings == []
        return
    assert warnings and any("damaged" in w for w in warnings), warnings
    kept = [p for p in paths.data_dir().parent.rglob("*") if ".corrupt" in p.name]
    assert any(p.read_bytes() == damaged if p.is_file() else p.is_dir() for p in kept), kept
    assert load() == [], "reported once: the next start is clean"


def test_a_damaged_key_file_is_kept_and_a_new_key_made(home):
    from omnidraft.core.storage.secure_store import KeyStore

    first = _keys()
    first.key_path.write_bytes(b"not a key")
    again = KeyStore(paths.data_dir(), fail.Keyring())
    assert "damaged" in again.fallback_warning and again.key_fingerprint != first.key_fingerprint
    assert (paths.data_dir() / "key.corrupt").read_bytes() == b"not a key"


def test_an_added_model_damaged_later_is_refused_with_a_sentence_and_the_old_one_stays(home, target_dir, tmp_path):
    """A model file cut short after it was added (a sync tool, a full disk) is
    named at the next switch, the model loaded before keeps answering, and the
    entry can be taken off the list."""
    import queue

    from omnidraft.core.models.catalog import ModelCatalog, ModelError
    from omnidraft.core.worker.process import WorkerLoop
    from omnidraft.core.worker.protocol import CatalogChanged, ErrorEvent, RemoveModel, SwitchTarget

    from tests.test_faults_files import assert_sentence
    from tests.tiny import learning_engine, write_tiny_gguf

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    entry = ModelCatalog().add(gguf)
    gguf.write_bytes(gguf.read_bytes()[: gguf.stat().st_size // 2])
    engine = learning_engine(target_dir)
    old = engine.target
    events: queue.Queue = queue.Queue()
    loop = WorkerLoop(queue.Queue(), events, engine)
    loop._handle_safely(SwitchTarget(1, entry.id))
    (error,) = [e for e in events.queue if isinstance(e, ErrorEvent)]
    assert "incomplete" in error.message
    assert_sentence(error.message)
    assert engine.target is old
    loop._handle_safely(RemoveModel(2, entry.id))
    (changed,) = [e for e in events.queue if isinstance(e, CatalogChanged)]
    assert entry.id not in [e.id for e in changed.catalog]
    assert entry.id not in [e.id for e in ModelCatalog().entries()]
    with pytest.raises(ModelError):
        ModelCatalog().get(entry.id)


# ---------------------------------------------------------------- two apps, two engines

HOLDER = r"""
import sys, time
from omnidraft.core.storage.folder_lock import FolderLock
FolderLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_a_lock_of_a_killed_app_is_taken_over(home):
    from omnidraft.core.storage.folder_lock import INSTANCE_LOCK_NAME, FolderBusyError, FolderLock

    env = {**os.environ, "OMNIDRAFT_HOME": str(home)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, INSTANCE_LOCK_NAME], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderBusyError) as busy:
            FolderLock().acquire()
        assert busy.value.pid == holder.pid
    finally:
        holder.kill()
        holder.wait(30)
    with FolderLock() as lock:  # the kernel dropped the dead app's lock
        assert lock.held


def test_a_second_engine_on_the_same_folder_is_refused(home, tmp_path):
    from omnidraft.core.worker.process import ENGINE_LOCK_WAIT_S, WorkerHandle
    from omnidraft.core.worker.protocol import ErrorEvent, WorkerReady

    first = WorkerHandle(home=str(home), threads=1)
    second = WorkerHandle(home=str(home), threads=1)
    first.start()
    try:
        assert _wait(first, lambda e: isinstance(e, WorkerReady), 120)
        second.start()
        error = _wait(second, lambda e: isinstance(e, (ErrorEvent, WorkerReady)), ENGINE_LOCK_WAIT_S + 120)
        assert isinstance(error, ErrorEvent) and "did not start" in error.message
        second._proc.join(30)
        assert not second.is_alive()
    finally:
        second.stop()
        first.stop()


def _wait(handle, match, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in handle.poll(0.1):
            if match(event):
                return event
    return None


GUI = r"""
import sys, time
from omnidraft.core.worker.process import WorkerHandle
from omnidraft.core.worker.protocol import ChatRequest, ModelLoaded, SwitchTarget, TokenBatch
handle = WorkerHandle(home=sys.argv[1], threads=1)
handle.start()
handle.send(SwitchTarget(handle.next_id(), sys.argv[2]))
handle.send(ChatRequest(handle.next_id(), [{"role": "user", "content": "a long story"}],
                        max_new_tokens=100_000))
while True:
    if any(isinstance(e, TokenBatch) for e in handle.poll(0.1)):
        print(handle.pid, flush=True)
        break
time.sleep(600)
"""


def test_an_engine_whose_gui_was_killed_mid_reply_stops_and_frees_the_folder(home, tmp_path, smol_tok):
    """Before: the worker outlived its GUI and wrote its reply to max tokens, so a
    quick restart ran two engines on the same files."""
    from omnidraft.core.storage.folder_lock import ENGINE_LOCK_NAME, FolderLock

    from tests.fault_helpers import kill_gui_of_busy_worker

    worker = kill_gui_of_busy_worker(GUI, home, tmp_path, smol_tok)  # killed while writing the reply
    worker.wait(30)  # psutil.TimeoutExpired when the orphan goes on writing
    with FolderLock(ENGINE_LOCK_NAME) as lock:
        assert lock.held
