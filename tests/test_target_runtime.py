"""The target's runtime: Llama and Qwen2 targets run lean over the model's own
(int8) layers and compute what transformers computes; other architectures run on
transformers."""

import pytest
import torch
from omnidraft.core.models import quantize
from omnidraft.core.models.quantize import quantize_int8
from omnidraft.core.models.target_runtime import TargetRunner

from tests.tiny import tiny_gemma3, tiny_llama, tiny_qwen2

VOCAB = 300
IDS = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(3)).tolist()


def _steps(session) -> torch.Tensor:
    """A prefill, a one-token step, a verification of 4 that keeps 1, then 6 more:
    every row's logits, as a decode loop sees them."""
    rows = [session.forward(IDS[:20]), session.forward(IDS[20:21])]
    rows.append(session.forward(IDS[21:25])[:1])
    session.crop(3)
    rows.append(session.forward(IDS[22:28]))
    return torch.cat(rows)


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
def test_lean_target_computes_what_transformers_computes(make):
    model = make(VOCAB, seed=1)
    lean = TargetRunner(model)
    assert lean.kind == "lean"
    reference = TargetRunner(model, lean=False)
    assert reference.kind == "transformers"
    torch.testing.assert_close(_steps(lean.session()), _steps(reference.session()), atol=1e-4, rtol=1e-4)


@pytest.fixture
def int8_qwen2(monkeypatch):
    monkeypatch.setattr(quantize, "MIN_WEIGHTS", 0)  # every linear layer of the tiny model
    model = tiny_qwen2(VOCAB, seed=1)
    assert quantize_int8(model) == 2 * 7 + 1
    return model


def test_int8_lean_target_stays_close_to_transformers_on_the_same_weights(int8_qwen2):
    model = int8_qwen2
    lean, reference = _steps(TargetRunner(model).session()), _steps(TargetRunner(model, lean=False).session())
    # The same int8 products; only the activations' precision differs (float32 here,
    # the model's own dtype there, also float32 in this tiny model).
    torch.testing.assert_close(lean, reference, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("rows", [2, 5, 16])
def test_a_verified_tokens_logits_do_not_depend_on_the_tokens_beside_it(int8_qwen2, rows):
    """What makes int8 speculative decoding equal plain decoding of the same weights:
    a row verified among others gets the very bits it gets alone. Close is not
    enough: in a 24-layer model each int8 layer's rounding carried differences of
    ~1e-7 on into other tokens (Qwen2.5-Coder-0.5B: 21 of 40 replies differed)."""
    session = TargetRunner(int8_qwen2).session()
    session.forward(IDS[:20])
    together = session.forward(IDS[20 : 20 + rows])
    session.crop(rows)
    alone = torch.cat([session.forward([i]) for i in IDS[20 : 20 + rows]])
    assert torch.equal(together, alone)


@pytest.mark.parametrize("rows", [2, 5, 16])
def test_on_transformers_too_a_verified_tokens_logits_are_its_own(monkeypatch, rows):
    """Gemma 3 runs on transformers' forward (bf16 activations, sliding windows):
    attending over a masked block there gave 37 of 40 Gemma-3-270M replies other
    tokens than plain decoding's."""
    monkeypatch.setattr(quantize, "MIN_WEIGHTS", 0)
    model = tiny_gemma3(VOCAB, seed=1, dtype=torch.bfloat16)
    quantize_int8(model)
    ids = torch.randint(0, VOCAB, (100,), generator=torch.Generator().manual_seed(4)).tolist()
    runner = TargetRunner(model)
    assert runner.kind == "transformers"
    session = runner.session()
    session.forward(ids[:80])  # past the 64-token sliding window
    together = session.forward(ids[80 : 80 + rows])
    session.crop(rows)
    alone = torch.cat([session.forward([i]) for i in ids[80 : 80 + rows]])
    assert torch.equal(together, alone)
    assert model.config._attn_implementation == "sdpa"  # the model's other users keep theirs


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_only_a_target_on_sdpa_attends_row_by_row(monkeypatch, attention):
    """The row-by-row attention mimics sdpa; a model on another (eager, for Gemma 2's
    soft-capping) keeps its own."""
    from types import SimpleNamespace

    from omnidraft.core.models import target_runtime

    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    spy = SimpleNamespace(scaled_dot_product_attention=lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    monkeypatch.setattr(target_runtime, "F", spy)
    model = tiny_gemma3(VOCAB, seed=1)
    model.config._attn_implementation = attention
    session = TargetRunner(model).session()
    session.forward(IDS[:20])
    session.forward(IDS[20:24])
    assert bool(calls) == (attention == "sdpa")
    assert model.config._attn_implementation == attention


def test_gemma3_runs_on_transformers():
    assert TargetRunner(tiny_gemma3(VOCAB)).kind == "transformers"


def test_each_lean_forward_calls_the_embedding_module_once():
    """The benchmark counts target forwards with a hook on the input embeddings."""
    model = tiny_qwen2(VOCAB, seed=1)
    calls = []
    model.get_input_embeddings().register_forward_hook(lambda *_: calls.append(1))
    _steps(TargetRunner(model).session())
    assert len(calls) == 4


def test_the_kv_cache_grows_with_the_context_and_stops_at_the_window():
    model = tiny_llama(VOCAB, seed=1)
    model.config.max_position_embeddings = 600
    runner = TargetRunner(model)
    session = runner.session()
    session.forward(IDS)
    small = runner.net.kv.shape[3]
    assert small < 600  # a short context holds a short cache
    for _ in range(12):
        session.forward(IDS)
    assert runner.net.kv.shape[3] >= 13 * len(IDS)
    with pytest.raises(ValueError, match="context full"):
        session.forward(IDS * 3)
    # A new session starts from an empty context, reusing the buffer.
    assert runner.session().forward(IDS[:5]).shape == (5, VOCAB)


def test_a_target_with_some_layers_too_small_for_int8_runs_lean():
    """bf16 weights whose small projections stay bf16 beside int8 ones (the tiny
    models users and tests load): each layer gets its own dtype."""
    model = tiny_llama(20_000, seed=1, dtype=torch.bfloat16)
    assert 0 < quantize_int8(model) < 2 * 7 + 1  # the LM head, not the 64-wide projections
    lean, reference = TargetRunner(model), TargetRunner(model, lean=False)
    assert lean.kind == "lean"
    ids = IDS[:12]
    assert torch.equal(lean.session().forward(ids).argmax(-1), reference.session().forward(ids).float().argmax(-1))


def test_a_session_reads_only_past_the_prefix_the_last_one_left(int8_qwen2):
    """The chat template's system turn, a conversation's earlier turns: a new
    reply's prompt runs only past what the previous reply left in the cache, and
    gets the logits a fresh runner computes for the whole prompt."""
    runner = TargetRunner(int8_qwen2)
    first = runner.session()
    first.forward(IDS[:20], last=1)
    first.forward(IDS[20:25])
    first.crop(3)  # a verification that kept 2 of its 5 rows: the cache holds IDS[:22]
    prompt = IDS[:24] + IDS[30:36]
    second = runner.session()
    got = second.forward(prompt, last=1)
    assert second.reused == 22  # not the two cropped tokens, though the prompt has them
    fresh = TargetRunner(int8_qwen2).session().forward(prompt, last=1)
    assert torch.equal(got.argmax(-1), fresh.argmax(-1))
    torch.testing.assert_close(got, fresh, atol=1e-4, rtol=1e-4)
    again = runner.session()
    torch.testing.assert_close(again.forward(prompt, last=1), fresh, atol=1e-4, rtol=1e-4)
    assert again.reused == len(prompt) - 1  # the last token still runs: its logits pick the reply
    # A forward that wants every row's logits computes every row.
    every = runner.session()
    assert every.forward(prompt).shape == (len(prompt), VOCAB) and every.reused == 0


def test_a_transformers_target_reuses_its_cache_past_the_sliding_window_too():
    """Gemma 3 runs on transformers' forward: a new reply's prompt also runs only
    past what the previous reply left, with a conversation longer than the
    sliding window (64 positions here), and gets a fresh runner's logits."""
    model = tiny_gemma3(VOCAB, seed=2)
    long = torch.randint(0, VOCAB, (120,), generator=torch.Generator().manual_seed(5)).tolist()
    runner = TargetRunner(model)
    assert runner.kind == "transformers"
    first = runner.session()
    first.forward(long[:90], last=1)
    first.forward(long[90:95])
    first.crop(3)  # the cache holds long[:92]
    prompt = long[:94] + long[100:110]
    second = runner.session()
    got = second.forward(prompt, last=1)
    assert second.reused == 92
    fresh = TargetRunner(model).session().forward(prompt, last=1)
    torch.testing.assert_close(got, fresh, atol=1e-4, rtol=1e-4)
    # A prompt that leaves the conversation early keeps only what it shares.
    third = runner.session()
    torch.testing.assert_close(third.forward(long[:70] + long[5:9], last=1),
                               TargetRunner(model).session().forward(long[:70] + long[5:9], last=1),
                               atol=1e-4, rtol=1e-4)
    assert third.reused == 70
    runner.forget()
    assert runner.session().forward(prompt, last=1).shape == (1, VOCAB) and runner.cache.length == len(prompt)
