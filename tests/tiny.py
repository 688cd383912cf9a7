"""Tiny randomly initialised models that share the real tokenizers' vocabularies.

They make the fast tier exercise real tokenization (BPE with 'Ġ', SentencePiece
with '▁', byte fallback, special tokens) at a fraction of the real models' cost.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Qwen2Config


def tiny_llama(vocab_size: int, seed: int = 0, layers: int = 2, dtype=torch.float32):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    return AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()


def tiny_gemma3(vocab_size: int, seed: int = 0, dtype=torch.float32):
    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=2048,
        sliding_window=64,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
    )
    return AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()


def tiny_qwen2(vocab_size: int, seed: int = 0, dtype=torch.float32):
    """Shaped like the bundled Qwen2.5-Coder targets (biased q/k/v). Untied: a tied
    random Qwen2 this small repeats one token whatever the prompt."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=151643,
        eos_token_id=151645,
    )
    return AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()


def write_tiny_gguf(
    path: Path, name: str = "Tiny Downloaded", file_type: str | None = "MOSTLY_Q8_0"
) -> Path:
    """A small but real GGUF model file (Llama architecture, a tokenizer, ~1 MB of
    weights: a 100x2560 F32 embedding and a 64x256 Q8_0 matrix), enough for the
    catalog to accept it. file_type: the gguf.LlamaFileType it declares, or none."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    if file_type:
        writer.add_file_type(gguf.LlamaFileType[file_type])
    writer.add_context_length(2048)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"tok{i}" for i in range(100)])
    rng = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", rng.standard_normal((100, 2560), dtype=np.float32))
    weights = rng.standard_normal((64, 256)).astype(np.float32)
    writer.add_tensor(
        "blk.0.attn_q.weight",
        gguf.quants.quantize(weights, gguf.GGMLQuantizationType.Q8_0),
        raw_dtype=gguf.GGMLQuantizationType.Q8_0,
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tiny_engine(folder: Path, model, tokenizer):
    """An Engine (float32, learning off) with `model` saved to `folder` as its target;
    it drafts with the tiny drafter conftest sets up."""
    from omnidraft.core.engine import Engine, LearnSettings
    from omnidraft.core.models.catalog import ModelCatalog

    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    engine = Engine(ModelCatalog(), dtype=torch.float32, learn_settings=LearnSettings(enabled=False))
    engine.load_target(str(folder), measure_baseline=False)
    return engine
