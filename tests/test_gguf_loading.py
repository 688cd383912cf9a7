"""GGUF files load straight from their blocks (core/models/gguf_model.py): the
drafter's float weights are transformers' own de-quantization, a target's layers
stay in the file's blocks and reply as plain decoding does, a load stops when
asked, and the converted copies an older version kept are removed."""

from __future__ import annotations

import pytest
import torch
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine
from omnidraft.core.events import TurnFinished
from omnidraft.core.learning.online import LearnSettings
from omnidraft.core.models import loader
from omnidraft.core.models.catalog import BUNDLED, SMOLLM2_ID, bundled_path
from omnidraft.core.models.gguf_model import QuantEmbedding, gguf_config_dict
from omnidraft.core.storage import paths


def test_the_drafter_loads_as_transformers_dequantizes_its_file():
    """No converted copy: each tensor from the file, the same values, config and tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf = bundled_path(SMOLLM2_ID)
    loaded = loader.load(BUNDLED[SMOLLM2_ID], torch.bfloat16)
    assert not loader.converted_copies().exists()
    theirs = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
    ours, want = loaded.model.state_dict(), theirs.state_dict()
    assert set(ours) == set(want)
    assert all(torch.equal(ours[k], want[k]) for k in want)
    assert gguf_config_dict(gguf) == load_gguf_checkpoint(str(gguf), return_tensors=False)["config"]
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    assert loaded.tokenizer.chat_template == tokenizer.chat_template
    assert loaded.tokenizer.get_vocab() == tokenizer.get_vocab()
    assert loaded.model.get_output_embeddings().weight is loaded.model.get_input_embeddings().weight  # tied


def test_a_gguf_target_keeps_its_blocks_and_replies_as_plain_decoding():
    engine = Engine(drafter_id=SMOLLM2_ID, learn_settings=LearnSettings(enabled=False))
    engine.load_target(SMOLLM2_ID, measure_baseline=False)
    model = engine.target.model
    embed = model.get_input_embeddings()
    assert isinstance(embed, QuantEmbedding)  # the token table in its Q8_0 blocks, not a float table
    assert not any(p.dtype == torch.float32 and p.numel() >= 1 << 16 for p in model.parameters())
    # A looked-up row is the file's row, de-quantized.
    from transformers import AutoModelForCausalLM

    gguf = bundled_path(SMOLLM2_ID)
    table = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name).get_input_embeddings()
    ids = torch.tensor([[0, 17, 49151]])
    assert torch.equal(embed(ids).float(), table(ids).to(embed.dtype).float())
    cfg = GenerationConfig(max_new_tokens=16)
    for prompt in ("def add(a, b):\n    return a + b\n\ndef mul(a, b):\n", "The capital of France is"):
        plain = next(e for e in engine.complete(prompt, cfg) if isinstance(e, TurnFinished))
        spec = next(e for e in engine.complete(prompt, cfg, speculative=True) if isinstance(e, TurnFinished))
        assert spec.token_ids == plain.token_ids and plain.token_ids


@pytest.mark.parametrize("after", [0, 1, 40])
def test_a_load_stops_when_asked(after):
    """Checked between tensors: a load asked to stop raises LoadCancelled (a
    ModelError with a sentence), however far it got."""
    calls = []

    def should_stop() -> bool:
        calls.append(1)
        return len(calls) > after

    with pytest.raises(loader.LoadCancelled) as caught:
        loader.load(BUNDLED[SMOLLM2_ID], int8=True, should_stop=should_stop)
    assert isinstance(caught.value, loader.ModelError)
    assert str(caught.value) == f"Loading {BUNDLED[SMOLLM2_ID].name} was cancelled."
    assert len(calls) == after + 1  # stopped at the first check that said so


def test_a_converted_copy_left_by_an_older_version_is_removed_once(home):
    old = paths.cache_dir() / "models" / "qwen2.5-coder-1.5b-instruct-ac704a204b3d"
    old.mkdir(parents=True)
    (old / "model.safetensors").write_bytes(b"\0" * 4096)
    (old / "omnidraft-converted.json").write_text("{}")
    stages = []
    loader.load(BUNDLED[SMOLLM2_ID], torch.bfloat16, progress=lambda stage, fraction: stages.append(stage))
    assert not (paths.cache_dir() / "models").exists()
    assert any("Removed the converted model copies" in s for s in stages)
    stages.clear()
    loader.load(BUNDLED[SMOLLM2_ID], torch.bfloat16, progress=lambda stage, fraction: stages.append(stage))
    assert not any("Removed" in s for s in stages)  # once: nothing is left to remove
