"""Tiny randomly initialised models that share the real tokenizers' vocabularies.

They make the fast tier exercise real tokenization (BPE with 'Ġ', SentencePiece
with '▁', byte fallback, special tokens) at a fraction of the real models' cost.
"""

from __future__ import annotations

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
