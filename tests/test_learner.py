"""The online learner on a tiny cross-vocabulary pair (SmolLM2 vocab -> Gemma vocab)."""

import sys
from dataclasses import replace

import pytest
import torch
from keyring.backends import fail
from omnidraft.core.learning.adapters import AdapterStore
from omnidraft.core.learning.learner import Learner
from omnidraft.core.learning.replay_buffer import ReplayBuffer
from omnidraft.core.storage.secure_store import KeyStore

from tests.distill_helpers import PROMPT, REPLIES, cross_bridge, learnable_drafter, make_sample
from tests.tiny import tiny_gemma3

TARGET = "tiny-gemma"


@pytest.fixture(scope="module")
def target(gemma_tok):
    return tiny_gemma3(len(gemma_tok), seed=3)


@pytest.fixture
def parts(tmp_path, smol_tok, gemma_tok, target):
    """(learner factory, buffer, adapter store, samples) with a fresh drafter."""
    keys = KeyStore(tmp_path / "keys", backend=fail.Keyring())
    buffer = ReplayBuffer(tmp_path / "buffer.bin", keys=keys)
    drafter = learnable_drafter(len(smol_tok))
    store = AdapterStore(tmp_path / "adapters", drafter, rank=8, alpha=16)
    bridge = cross_bridge(smol_tok, gemma_tok)
    samples = [make_sample(smol_tok, gemma_tok, PROMPT, r) for r in REPLIES]

    def make(**kw):
        return Learner(drafter, target, bridge, buffer, store, TARGET, **kw)

    return make, buffer, store, samples


def _fill(buffer, samples):
    for s in samples:
        buffer.add(replace(s))  # a copy: the buffer numbers what it holds


def _eval_loss(learner, store, samples) -> float:
    model = store.activate(TARGET)
    with torch.no_grad():
        return sum(float(learner.sample_loss(model, s)[0]) for s in samples) / len(samples)


def test_steps_reduce_the_loss(parts):
    make, buffer, store, samples = parts
    samples = samples[:2]
    learner = make(lr=1e-2, batch_size=2)
    before = _eval_loss(learner, store, samples)
    threads = torch.get_num_threads()
    results = []
    for _ in range(4):  # four passes over the same two turns
        _fill(buffer, samples)
        results.append(learner.step())
        assert results[-1]["pass_done"] and len(buffer) == 0
    assert torch.get_num_threads() == threads
    after = _eval_loss(learner, store, samples)
    assert after < 0.8 * before
    assert results[-1]["loss"] < results[0]["loss"]
    assert results[-1]["steps"] == 4 and results[-1]["samples"] == 8
    assert results[-1]["acceptance_estimate"] > results[0]["acceptance_estimate"]
    assert learner.step() is None  # nothing buffered


def test_one_pass_then_clear_and_save(parts, smol_tok, gemma_tok):
    make, buffer, store, samples = parts
    learner = make(batch_size=2)
    _fill(buffer, samples[:3])
    first = learner.step()
    assert not first["pass_done"] and len(buffer) == 3 and first["buffered"] == 1
    buffer.add(replace(samples[3]))  # a turn served mid-pass waits for the next pass
    second = learner.step()
    assert second["pass_done"] and [s.seq for s in buffer.samples()] == [3]
    assert store.has_saved(TARGET) and store.meta(TARGET)["steps"] == 2
    assert len(ReplayBuffer.load(buffer.path, keys=buffer.keys)) == 1  # saved cleared
    third = learner.step()
    assert third["pass_done"] and third["samples"] == 4 and len(buffer) == 0
    assert learner.step() is None
    # A restarted learner continues the counters.
    assert make().steps == 3


def test_a_round_replays_learned_turns_beside_the_new_ones(parts):
    make, buffer, _store, samples = parts
    learner = make(batch_size=2, reviews=2)
    _fill(buffer, samples[:2])
    first = learner.step()  # nothing learned yet to replay
    assert first["pass_done"] and first["samples"] == 2 and first["buffered"] == 0
    assert len(buffer) == 2 and not buffer.new_samples()  # kept, marked learned
    assert learner.step() is None  # no new turn: the learner rests
    buffer.add(replace(samples[2]))
    trained = []
    original = learner._accumulate
    learner._accumulate = lambda model, batch, first, check, partial=None: (
        trained.append([s.seq for s in batch]) or original(model, batch, first, check, partial))
    second = learner.step()  # the new turn first, then one of the two learned ones
    third = learner.step()  # ... and the other: twice the new turns, each at most once
    assert trained[0][0] == 2 and sorted(trained[0][1:] + trained[1]) == [0, 1]
    assert not second["pass_done"] and third["pass_done"] and third["samples"] == 5
    assert learner.step() is None
    # The marks are saved: a restarted learner has nothing new to learn.
    loaded = ReplayBuffer.load(buffer.path, keys=buffer.keys)
    assert len(loaded) == 3 and not loaded.new_samples()


def test_should_stop_interrupts_quickly_without_changes(parts):
    make, buffer, store, samples = parts
    learner = make(batch_size=4)
    _fill(buffer, samples)
    snapshot = learner.snapshot()
    calls = {"n": 0}

    def stop_in_the_forward():
        calls["n"] += 1
        return calls["n"] >= 3  # 1: before the first sample, 2-3: target layers

    result = learner.step(stop_in_the_forward)
    assert result["interrupted"] and not result["pass_done"]
    assert calls["n"] == 3  # it gave way at the first "stop", asking nothing more
    assert not learner.lora_params_changed(snapshot) and learner.updates == 0
    assert all(p.grad is None for p in store.parameters(TARGET))
    assert len(buffer) == 4
    # The next step trains the same samples.
    assert not learner.step()["interrupted"] and learner.lora_params_changed(snapshot)


def test_a_step_cut_off_mid_batch_keeps_the_finished_samples_and_resumes(parts):
    """Idle windows shorter than a step add up: a step stopped in its third sample
    keeps the first two samples' gradients; the next step reads only the last two,
    and its update is the uninterrupted batch's (the mean of the four gradients)."""
    make, buffer, store, samples = parts
    learner = make(batch_size=4)
    _fill(buffer, samples[:4])
    model = store.activate(TARGET)
    params = store.parameters(TARGET)
    for s in buffer.samples():  # the batch's mean gradient, computed directly
        learner.sample_loss(model, s)[0].backward()
    expected = [p.grad / 4 for p in params]
    for p in params:
        p.grad = None

    read, applied = [], []
    forward = learner.forward
    learner.forward = lambda model, sample, check=lambda: None: read.append(sample.seq) or forward(model, sample, check)
    optimizer = learner._optimizer_for_adapter()
    step = optimizer.step
    optimizer.step = lambda *a, **kw: applied.append([p.grad.clone() for p in params]) or step(*a, **kw)

    cut = learner.step(lambda: len(read) == 3)  # gives way once the third sample is being read
    assert cut["interrupted"] and read == [0, 1, 2] and learner.updates == 0 and not applied
    assert all(p.grad is None for p in params)
    done = learner.step()
    assert not done["interrupted"] and done["pass_done"] and read == [0, 1, 2, 2, 3]
    assert done["samples"] == 4 and len(applied) == 1
    for got, want in zip(applied[0], expected, strict=True):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-7)


def test_a_kept_partial_step_is_dropped_when_its_batch_changes(parts):
    """A batch the buffer no longer holds whole (turns dropped by its cap, forgotten)
    starts over: the kept gradients belong to samples that are gone."""
    make, buffer, _store, samples = parts
    learner = make(batch_size=4)
    _fill(buffer, samples[:4])
    read = []
    forward = learner.forward
    learner.forward = lambda model, sample, check=lambda: None: read.append(sample.seq) or forward(model, sample, check)
    assert learner.step(lambda: len(read) == 3)["interrupted"]
    buffer.remove({0})
    read.clear()
    assert not learner.step()["interrupted"] and read == [1, 2, 3]


def test_should_stop_is_asked_inside_each_layer_not_only_between_layers(parts):
    """A target layer over a long prompt runs for longer than a reply may wait:
    should_stop is asked after each of a layer's projections too."""
    make, buffer, _, samples = parts
    learner = make(batch_size=1)
    asked = {"n": 0}

    def should_stop():
        asked["n"] += 1
        return False

    _fill(buffer, samples[:1])
    learner.step(should_stop)
    layers = len(learner_layers(learner.target_model)) + len(learner_layers(learner.drafter_model))
    assert asked["n"] >= 7 * layers  # q, k, v, o, gate, up, down at least


def learner_layers(model):
    from omnidraft.core.learning.learner import _decoder_layers

    return _decoder_layers(model)


def test_should_stop_interrupts_the_backward(parts):
    make, buffer, store, samples = parts
    learner = make(batch_size=1)
    seen = {"checks": 0, "in_backward": []}

    def count(stop_at=None):
        def should_stop():
            seen["checks"] += 1
            seen["in_backward"].append(_in_backward())
            return stop_at is not None and seen["checks"] >= stop_at
        return should_stop

    _fill(buffer, samples[:1])
    learner.step(count())  # one whole step: how many checks, and where
    total, where = seen["checks"], seen["in_backward"]
    assert where[-1] and sum(where) >= 3  # the gradient hooks check too
    snapshot = learner.snapshot()
    _fill(buffer, samples[:1])
    seen.update(checks=0, in_backward=[])
    result = learner.step(count(stop_at=total))  # the last check: inside the backward
    assert result["interrupted"] and seen["in_backward"][-1]
    assert not learner.lora_params_changed(snapshot)
    assert all(p.grad is None for p in store.parameters(TARGET))


def test_interruption_points_change_no_number(parts, monkeypatch):
    from omnidraft.core.learning import distillation
    from omnidraft.core.learning import learner as learner_module

    make, _, store, samples = parts
    learner = make()
    model = store.activate(TARGET)
    with torch.no_grad():
        plain, plain_stats = learner.sample_loss(model, samples[0])
        monkeypatch.setattr(learner_module._SlicedHead, "ROWS", 3)
        monkeypatch.setattr(distillation, "ROWS_PER_SLICE", 2)
        check = lambda: None
        hooks = learner_module._stop_hooks(learner.drafter_model, check)
        hooks += learner_module._stop_hooks(learner.target_model, check)
        try:
            sliced, sliced_stats = learner.sample_loss(model, samples[0], check)
        finally:
            for h in hooks:
                h.remove()
    assert float(sliced) == pytest.approx(float(plain), rel=1e-5)
    assert sliced_stats["n_dm"] == plain_stats["n_dm"] > 2
    assert sliced_stats["greedy_match"] == plain_stats["greedy_match"]


def _in_backward() -> bool:
    """Whether the caller runs inside autograd's backward pass (a frame walk:
    inspect.stack() reads every frame's source, seconds over a step's checks)."""
    frame = sys._getframe(1)
    for _ in range(5):
        if frame is None:
            return False
        if frame.f_code.co_name == "check_grad":
            return True
        frame = frame.f_back
    return False


def test_learner_needs_the_stores_drafter(parts, smol_tok, target):
    _, buffer, store, _ = parts
    with pytest.raises(ValueError):
        Learner(learnable_drafter(len(smol_tok)), target, None, buffer, store, TARGET)


def test_a_foreign_sample_is_skipped_not_fatal(parts):
    make, buffer, _, samples = parts
    learner = make(batch_size=4)
    bad = replace(samples[0], target_ids=samples[0].target_ids + [10**7])
    _fill(buffer, [bad, samples[1]])
    result = learner.step()
    assert result["pass_done"] and result["samples"] == 2 and result["steps"] == 1


def test_the_drafter_meets_few_shapes_and_padding_changes_no_loss(parts, monkeypatch):
    """oneDNN keeps kernels for every shape it meets (memory the worker never got
    back): the learner pads the drafter's rows to a few lengths, and the padding
    changes no figure of the loss."""
    import omnidraft.core.learning.learner as learner_module

    make, _buffer, store, samples = parts
    learner = make()
    model = store.activate(TARGET)
    shapes = set()
    hook = learner.drafter_model.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.add(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    cuts = []
    with torch.no_grad():
        for s in samples[:2]:  # a sample's every length: enough lengths to pad
            for cut in range(s.drafter_prompt_len + 2, len(s.drafter_ids) + 1):
                cuts.append(replace(s, drafter_ids=s.drafter_ids[:cut]))
        padded = [learner.sample_loss(model, s) for s in cuts]
        hook.remove()
        step = learner_module.SHAPE_STEP
        monkeypatch.setattr(learner_module, "SHAPE_STEP", 1)
        exact = [learner.sample_loss(model, s) for s in cuts]
    lengths = {len(s.drafter_ids) for s in cuts}
    assert len(lengths) > 10 and step > 1 and all(n % step == 0 for _, n in shapes)
    assert len(shapes) <= len(lengths) // 4
    for (loss, stats), (ref, ref_stats) in zip(padded, exact, strict=True):
        assert torch.allclose(loss, ref, atol=1e-5)
        assert stats["n_dm"] == ref_stats["n_dm"] and stats["n_ngram"] == ref_stats["n_ngram"]


def test_the_drafter_trains_in_bf16_only_where_the_cpu_multiplies_it_natively():
    from omnidraft.core.learning.learner import training_dtype

    assert training_dtype(frozenset({"avx2", "fma", "avx512_bf16"})) == torch.bfloat16
    assert training_dtype(frozenset({"avx2", "amx_bf16"})) == torch.bfloat16
    assert training_dtype(frozenset({"avx2", "fma", "f16c", "avx512f"})) == torch.float32
    assert training_dtype(frozenset()) == torch.float32
