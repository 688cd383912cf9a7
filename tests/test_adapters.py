"""Per-target LoRA adapters on one shared tiny drafter."""

import json
import time

import pytest
import torch
from omnidraft.core.learning.adapters import (
    CONFIG_FILE,
    DRAFT_MAX_RANK,
    LEGACY_META_FILE,
    LEGACY_WEIGHTS_FILE,
    META_FILE,
    WEIGHTS_FILE,
    AdapterStore,
    adapter_name,
    compact_low_rank,
    folder_name,
)
from omnidraft.core.storage.secure_store import MAGIC, default_keystore
from safetensors.torch import save as safetensors_bytes

from tests.tiny import tiny_llama

VOCAB = 512
IDS = torch.tensor([[5, 17, 33, 250, 7, 99]])


def _base(dtype=torch.float32):
    return tiny_llama(VOCAB, seed=11, dtype=dtype)


def _forward(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS, use_cache=False).logits[0].float()


def _perturb(store: AdapterStore, target_id: str, seed: int) -> None:
    """Stand-in for training: random non-zero LoRA weights (B starts at zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in store.parameters(target_id):
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)


@pytest.fixture
def store(tmp_path):
    return AdapterStore(tmp_path / "adapters", _base(), rank=4, alpha=8)


def test_adapters_are_independent(store):
    plain = _forward(_base())
    a = _forward(store.activate("gemma-3-270m"))
    assert torch.allclose(a, plain, atol=1e-6)  # a new adapter starts as the identity
    _perturb(store, "gemma-3-270m", seed=1)
    a = _forward(store.activate("gemma-3-270m"))
    b = _forward(store.activate("qwen"))
    assert not torch.allclose(a, plain, atol=1e-3)
    assert torch.allclose(b, plain, atol=1e-6)
    _perturb(store, "qwen", seed=2)
    b = _forward(store.activate("qwen"))
    assert torch.allclose(_forward(store.activate("gemma-3-270m")), a, atol=1e-6)
    assert not torch.allclose(a, b, atol=1e-3)
    # Only the active adapter trains.
    trainable = {n for n, p in store.peft.named_parameters() if p.requires_grad}
    assert trainable == {n for n, p in store.peft.named_parameters() if f".{adapter_name('gemma-3-270m')}." in n}


def test_save_restore_roundtrip(tmp_path, store):
    store.activate("gemma-3-270m")
    _perturb(store, "gemma-3-270m", seed=3)
    before = store.lora_state("gemma-3-270m")
    out = _forward(store.peft)
    store.save("gemma-3-270m", {"steps": 7})
    assert not list((tmp_path / "adapters").glob(".*"))  # no temporary or old copy left
    fresh = AdapterStore(tmp_path / "adapters", _base(), rank=4, alpha=8)
    assert fresh.has_saved("gemma-3-270m") and fresh.meta("gemma-3-270m")["steps"] == 7
    model = fresh.activate("gemma-3-270m")
    after = fresh.lora_state("gemma-3-270m")
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert torch.allclose(_forward(model), out, atol=1e-6)
    store.save("gemma-3-270m")  # saving over an existing adapter
    assert store.meta("gemma-3-270m")["steps"] == 7  # counters kept unless given


def test_crash_between_renames_keeps_the_old_adapter(tmp_path, store):
    root = tmp_path / "adapters"
    store.activate("t")
    _perturb(store, "t", seed=4)
    store.save("t", {"steps": 7})
    saved = store.lora_state("t")
    (root / "t").rename(root / ".t.old")  # as if the process died mid-save
    (root / ".t.x.tmp").mkdir()  # and an unfinished temporary folder
    fresh = AdapterStore(root, _base(), rank=4, alpha=8)
    assert not (root / ".t.x.tmp").exists()
    # Before anything activates it: the engine asks has_saved and the learner meta.
    assert fresh.has_saved("t") and fresh.meta("t")["steps"] == 7
    fresh.activate("t")
    assert all(torch.equal(fresh.lora_state("t")[k], saved[k]) for k in saved)
    assert (root / "t").is_dir() and not (root / ".t.old").exists()


def test_a_stale_old_copy_beside_the_new_one_is_dropped(tmp_path, store):
    root = tmp_path / "adapters"
    store.activate("t")
    store.save("t", {"steps": 1})
    store.save("t", {"steps": 2})
    (root / ".t.old").mkdir()  # killed after both renames, before the clean-up
    fresh = AdapterStore(root, _base(), rank=4, alpha=8)
    assert fresh.meta("t")["steps"] == 2 and not (root / ".t.old").exists()


def test_damaged_adapter_starts_over(tmp_path, store):
    root = tmp_path / "adapters"
    store.activate("t")
    store.save("t")
    (root / "t" / WEIGHTS_FILE).write_bytes(b"garbage")
    fresh = AdapterStore(root, _base(), rank=4, alpha=8)
    model = fresh.activate("t")
    assert fresh.warnings and "t.corrupt" in fresh.warnings[0]
    assert (root / "t.corrupt").exists()
    assert torch.allclose(_forward(model), _forward(_base()), atol=1e-6)


def test_reset_deletes(tmp_path, store):
    store.activate("t")
    _perturb(store, "t", seed=5)
    store.save("t")
    store.reset("t")
    assert not store.has_saved("t") and not store.is_loaded("t")
    assert not (tmp_path / "adapters" / "t").exists()
    # The next use starts from scratch: the identity again, and trainable.
    assert torch.allclose(_forward(store.activate("t")), _forward(_base()), atol=1e-6)
    params = store.parameters("t")
    assert params and all(p.requires_grad for p in params)


def test_the_low_rank_state_is_the_adapters_change(store):
    store.activate("other")
    _perturb(store, "other", seed=6)
    store.activate("t")
    _perturb(store, "t", seed=7)
    base_before = {k: v.clone() for k, v in _base().state_dict().items()}
    expected = _forward(store.activate("t"))
    low_rank = store.low_rank_state("t", keep=1.0, max_rank=None)
    assert len(low_rank) == 7 * 2  # q/k/v/o/gate/up/down of both layers
    rebuilt = _base()
    params = dict(rebuilt.named_parameters())
    with torch.no_grad():
        for path, (a, b) in low_rank.items():
            assert a.dtype == b.dtype == torch.float32
            params[f"{path}.weight"] += (b @ a).to(params[f"{path}.weight"].dtype)
    assert torch.allclose(_forward(rebuilt), expected, atol=1e-5)
    # Nothing changed in place: the base weights and the active adapter.
    wrapped = store.peft.base_model.model
    for path in low_rank:
        assert torch.equal(wrapped.get_parameter(f"{path}.base_layer.weight"), base_before[f"{path}.weight"])
    assert store.active == "t" and store.peft.active_adapter == adapter_name("t")
    assert torch.allclose(_forward(store.peft), expected)


def test_drafting_gets_the_change_at_the_rank_it_uses():
    """A rank-16 adapter whose change lies mostly in 3 directions (as a short
    training leaves it): the drafter gets it at rank 3, every projection's change
    within the energy it keeps; a change with no such structure keeps its rank."""
    gen = torch.Generator().manual_seed(3)

    def change(out: int, inp: int, strong: int) -> tuple[torch.Tensor, torch.Tensor]:
        b = torch.randn(out, 16, generator=gen)
        a = torch.randn(16, inp, generator=gen) * torch.tensor([1.0] * strong + [0.01] * (16 - strong))[:, None]
        return a, b

    state = {"q": change(64, 48, 2), "k": change(32, 48, 3), "down": change(48, 96, 1)}
    small = compact_low_rank(state, keep=0.98)
    assert {a.shape[0] for a, _ in small.values()} == {3}
    for path, (a, b) in state.items():
        a2, b2 = small[path]
        assert b2.shape == (b.shape[0], 3) and a2.shape == (3, a.shape[1])
        full = b @ a
        assert torch.linalg.norm(full - b2 @ a2) ** 2 <= 0.02 * torch.linalg.norm(full) ** 2
    exact = compact_low_rank(state, keep=1.0)
    assert all(torch.equal(exact[p][0], state[p][0]) for p in state)
    spread = {"v": (torch.randn(8, 40, generator=gen), torch.randn(40, 8, generator=gen))}
    assert compact_low_rank(spread)["v"][0].shape[0] == 8
    # A cap keeps the strongest directions: the best rank-2 approximation.
    capped = compact_low_rank(spread, keep=1.0, max_rank=2)["v"]
    full = spread["v"][1] @ spread["v"][0]
    u, s, vh = torch.linalg.svd(full)
    assert capped[0].shape[0] == 2
    assert torch.allclose(capped[1] @ capped[0], (u[:, :2] * s[:2]) @ vh[:2], atol=1e-4)


def test_the_drafter_streams_a_trained_adapter_at_its_rank_cap(tmp_path):
    store = AdapterStore(tmp_path / "a", _base(), rank=16, alpha=32)
    store.activate("t")
    _perturb(store, "t", seed=5)
    assert {a.shape[0] for a, _ in store.low_rank_state("t").values()} == {DRAFT_MAX_RANK}
    assert {a.shape[0] for a, _ in store.low_rank_state("t", keep=1.0, max_rank=None).values()} == {16}


def test_bf16_base_trains_fp32_lora(tmp_path):
    store = AdapterStore(tmp_path / "a", _base(torch.bfloat16), rank=4, alpha=8)
    store.activate("t")
    assert all(p.dtype == torch.float32 for p in store.parameters("t"))
    assert all(a.dtype == b.dtype == torch.float32 for a, b in store.low_rank_state("t").values())


@pytest.mark.bench
def test_switching_is_fast(store):
    for t in ("a", "b", "c"):
        store.activate(t)
    start = time.perf_counter()
    for _ in range(10):
        for t in ("a", "b", "c"):
            store.activate(t)
    per_switch = (time.perf_counter() - start) / 30
    assert per_switch < 0.05


def test_odd_target_ids(tmp_path, store):
    assert folder_name("gemma-3-270m") == "gemma-3-270m"
    odd = folder_name("/home/me/models/My.Model v2.gguf")
    assert "/" not in odd and "." not in odd and " " not in odd
    assert odd != folder_name("/home/me/models/My_Model v2.gguf")
    # 'a' is inside peft's parameter prefix 'lora_'; the prefixed name keeps it safe.
    for target in ("a", "/home/me/models/My.Model v2.gguf"):
        store.activate(target)
        _perturb(store, target, seed=8)
        store.save(target)
        saved = store.lora_state(target)
        fresh = AdapterStore(tmp_path / "adapters", _base(), rank=4, alpha=8)
        fresh.activate(target)
        assert all(torch.equal(fresh.lora_state(target)[k], saved[k]) for k in saved)


def test_saved_weights_and_counters_are_encrypted(tmp_path, store):
    store.activate("t")
    _perturb(store, "t", seed=9)
    store.save("t", {"steps": 3, "samples": 12})
    folder = tmp_path / "adapters" / "t"
    assert sorted(p.name for p in folder.iterdir()) == sorted([WEIGHTS_FILE, META_FILE, CONFIG_FILE])
    for name in (WEIGHTS_FILE, META_FILE):
        assert (folder / name).read_bytes().startswith(MAGIC)
    assert b"lora_A" not in (folder / WEIGHTS_FILE).read_bytes()  # safetensors' header names
    assert b"samples" not in (folder / META_FILE).read_bytes()


def test_a_plaintext_adapter_from_an_older_version_is_migrated(tmp_path, store):
    store.activate("t")
    _perturb(store, "t", seed=10)
    saved = store.lora_state("t")
    legacy = tmp_path / "old" / "t"
    legacy.mkdir(parents=True)
    # What versions before encryption wrote: peft's file names, plaintext.
    (legacy / LEGACY_WEIGHTS_FILE).write_bytes(safetensors_bytes({k: v.contiguous() for k, v in saved.items()}))
    store.peft.peft_config[adapter_name("t")].save_pretrained(str(legacy))
    (legacy / LEGACY_META_FILE).write_text(json.dumps({"target_id": "t", "steps": 5, "samples": 20}))

    fresh = AdapterStore(tmp_path / "old", _base(), rank=4, alpha=8)
    assert fresh.has_saved("t") and fresh.meta("t")["steps"] == 5
    fresh.activate("t")
    assert all(torch.equal(fresh.lora_state("t")[k], saved[k]) for k in saved)
    assert not fresh.warnings
    names = {p.name for p in legacy.iterdir()}
    assert names == {WEIGHTS_FILE, META_FILE, CONFIG_FILE}  # the plaintext is gone
    assert fresh.meta("t") == {"target_id": "t", "steps": 5, "samples": 20}
    again = AdapterStore(tmp_path / "old", _base(), rank=4, alpha=8)
    again.activate("t")
    assert all(torch.equal(again.lora_state("t")[k], saved[k]) for k in saved)


@pytest.mark.parametrize("bad", [{"steps": "many"}, {"steps": -1}, {"samples": 1.5}, [3], "x"])
def test_damaged_counters_are_set_aside_and_the_weights_kept(tmp_path, store, bad):
    root = tmp_path / "adapters"
    store.activate("t")
    _perturb(store, "t", seed=11)
    store.save("t", {"steps": 4})
    saved = store.lora_state("t")
    meta = root / "t" / META_FILE
    meta.write_bytes(default_keystore().encrypt(json.dumps(bad).encode()))
    fresh = AdapterStore(root, _base(), rank=4, alpha=8)
    assert fresh.meta("t") == {}
    assert fresh.warnings and f"{META_FILE}.corrupt" in fresh.warnings[0]
    assert (root / "t" / f"{META_FILE}.corrupt").exists() and not meta.exists()
    fresh.activate("t")
    assert all(torch.equal(fresh.lora_state("t")[k], saved[k]) for k in saved)
    fresh.save("t", {"steps": 1})
    assert fresh.meta("t")["steps"] == 1


def test_an_adapter_under_another_key_is_left_untouched(tmp_path, store):
    from keyring.backends.fail import Keyring
    from omnidraft.core.storage.secure_store import KeyStore

    root = tmp_path / "adapters"
    store.activate("t")
    _perturb(store, "t", seed=12)
    store.save("t", {"steps": 4})
    before = {p.name: p.read_bytes() for p in (root / "t").iterdir()}
    other = AdapterStore(root, _base(), rank=4, alpha=8, keys=KeyStore(tmp_path / "elsewhere", Keyring()))
    model = other.activate("t")
    assert other.warnings and "key" in other.warnings[0]
    assert torch.allclose(_forward(model), _forward(_base()), atol=1e-6)  # starts afresh
    other.save("t", {"steps": 1})  # never overwrites what it cannot read
    assert {p.name: p.read_bytes() for p in (root / "t").iterdir()} == before
