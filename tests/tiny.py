"""Tiny randomly initialised models that share the real tokenizers' vocabularies,
and the small helpers tests build on them (drafters, engines, prompts).

They make the fast tier exercise real tokenization (BPE with 'Ġ', SentencePiece
with '▁', byte fallback, special tokens) at a fraction of the real models' cost.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Qwen2Config

# Converted bundled models, kept between test runs (re-creatable, git-ignored).
TEST_CACHE = Path(os.environ.get("OMNIDRAFT_TEST_CACHE", Path(__file__).resolve().parent.parent / ".test-cache"))

# Decoding prompts: one repeats itself (lookups find it), one has a word a
# tokenizer splits ('snowflake'), one non-ASCII text and a control-token look-alike.
PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "The snowflake fell. The snowflake fell. The",
    "Ünïcödé ✓ 123 <end_of_turn> text",
]
# Turns an engine serves and then learns from.
LEARN_PROMPTS = ["def add(a, b):\n    return", "The cat sat on the", "for i in range(10):\n    print("]


def tiny_llama(vocab_size: int, seed: int = 0, layers: int = 2, dtype=torch.float32, kv_heads: int = 2,
               head_dim: int = 16):
    """Two query heads of head_dim a key/value head (kv_heads=3: SmolLM2's grouping;
    head_dim 64: SmolLM2's, which attention's bf16 path takes)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=2 * head_dim * kv_heads,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=2 * kv_heads,
        num_key_value_heads=kv_heads,
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


def lean_drafter(model, tokenizer, **settings):
    """A Drafter on `model` in float32 that drafts whatever its confidence (tests
    set what they need: k, min_confidence, gamma), over its whole vocabulary: the
    shipped head's cut (DraftSettings.head_tokens) follows SmolLM2's BPE order,
    which a random model's likeliest tokens do not."""
    from omnidraft.core.decoding.drafter import Drafter, DraftSettings
    from omnidraft.core.models.catalog import ModelEntry
    from omnidraft.core.models.loader import LoadedModel

    loaded = LoadedModel(ModelEntry("tiny", "tiny drafter", ""), model, tokenizer, 0.0)
    return Drafter(loaded, DraftSettings(**{"int8": False, "min_confidence": 0.0, "head_tokens": None, **settings}), max_len=512)


def drafter_prediction(engine):
    """What the engine's drafter predicts after a fixed context: it changes when,
    and only when, the weights it drafts with change."""
    return engine.drafter.score(list(range(5, 25)))


def run_plain(model, tokenizer, prompt: str, cfg):
    """Plain decoding's TurnFinished for a raw prompt: the reference output."""
    from omnidraft.core.decoding.plain import generate_plain
    from omnidraft.core.models.target_runtime import TargetRunner

    ids = tokenizer(prompt)["input_ids"]
    return list(generate_plain(TargetRunner(model), tokenizer, ids, cfg, set()))[-1]


def tiny_smol_target(folder: Path, smol_tok) -> Path:
    """A tiny random Llama target with SmolLM2's real tokenizer, saved in folder."""
    tiny_llama(len(smol_tok)).save_pretrained(folder)
    smol_tok.save_pretrained(folder)
    return folder


def tiny_gemma_target(folder: Path, gemma_tok) -> Path:
    """A tiny random Gemma-3 target with the real Gemma tokenizer, saved in folder."""
    tiny_gemma3(len(gemma_tok), seed=1).save_pretrained(folder)
    gemma_tok.save_pretrained(folder)
    return folder


def learning_engine(target_dir: Path):
    """An Engine (float32) serving the target in target_dir, learning in small, fast batches."""
    from omnidraft.core.engine import Engine, LearnSettings
    from omnidraft.core.models.catalog import ModelCatalog

    engine = Engine(ModelCatalog(), dtype=torch.float32, learn_settings=LearnSettings(batch_size=2, lr=1e-3))
    engine.load_target(str(target_dir), measure_baseline=False)
    return engine
