"""int8 target weights (core/models/quantize.py): close to the float layer, each
verified row independent of the rows beside it, and speculative decoding of an
int8 target still token-identical to plain decoding of the same int8 target."""

import torch
from omnidraft.core.engine import Engine, LearnSettings
from omnidraft.core.events import TurnFinished
from omnidraft.core.models import quantize
from omnidraft.core.models.catalog import ModelCatalog
from omnidraft.core.models.quantize import Int8Linear, is_quantized, quantize_int8

from tests.tiny import tiny_qwen2


def _linear(bias=True):
    torch.manual_seed(0)
    return torch.nn.Linear(256, 512, bias=bias)


def test_int8_layer_is_close_to_the_float_layer():
    lin = _linear()
    x = torch.randn(7, 256)
    with torch.no_grad():
        ref = lin(x)
    got = Int8Linear(lin)(x)
    assert got.shape == ref.shape
    assert float((got - ref).norm() / ref.norm()) < 0.02


def test_a_rows_result_does_not_depend_on_the_rows_verified_beside_it():
    """fbgemm quantizes its whole input with one scale; without per-row scaling a
    row with an outlier would change every other row's result."""
    q = Int8Linear(_linear())
    x = torch.randn(5, 256, dtype=torch.bfloat16)
    x[3] *= 300  # one token with huge activations
    batched = q(x)
    alone = torch.cat([q(x[i : i + 1]) for i in range(5)])
    assert torch.equal(batched, alone)
    assert batched.dtype == torch.bfloat16 and batched.shape == (5, 512)


def test_quantize_replaces_large_linears_and_keeps_small_ones(qwen_tok, monkeypatch):
    model = tiny_qwen2(len(qwen_tok))
    monkeypatch.setattr(quantize, "MIN_WEIGHTS", 64 * 64 + 1)  # the 64x64 projections stay
    n = quantize_int8(model)
    assert isinstance(model.lm_head, Int8Linear)
    assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert isinstance(model.model.layers[0].mlp.gate_proj, Int8Linear)  # 128x64
    assert n == 1 + 3 * len(model.model.layers) and is_quantized(model)


def test_speculative_decoding_of_an_int8_target_matches_its_plain_decoding(tmp_path, qwen_tok, monkeypatch):
    from omnidraft.core.decoding.sampling import GenerationConfig

    monkeypatch.setattr(quantize, "MIN_WEIGHTS", 0)  # every linear layer of the tiny target
    model = tiny_qwen2(len(qwen_tok), seed=1)
    model.save_pretrained(tmp_path)
    qwen_tok.save_pretrained(tmp_path)
    engine = Engine(ModelCatalog(), dtype=torch.float32, int8=True, learn_settings=LearnSettings(enabled=False))
    engine.load_target(str(tmp_path), measure_baseline=False)
    assert engine.target.int8 and is_quantized(engine.target.model)
    cfg = GenerationConfig(max_new_tokens=32)
    for prompt in ("def add(a, b):\n    return a + b\n\ndef add(a, b):\n", "The snowflake fell. The"):
        plain = next(e for e in engine.complete(prompt, cfg) if isinstance(e, TurnFinished))
        spec = next(e for e in engine.complete(prompt, cfg, speculative=True) if isinstance(e, TurnFinished))
        assert spec.token_ids == plain.token_ids
        assert spec.stats.proposed > 0  # drafts were verified several rows at a time
