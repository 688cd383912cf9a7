"""The catalog lists the bundled targets and turns bad paths into clear messages."""

import json

import pytest
from omnidraft.core.models.catalog import (
    BUNDLED,
    GEMMA_ID,
    QWEN05_ID,
    QWEN15_ID,
    SMOLLM2_ID,
    ModelCatalog,
    ModelError,
)


def test_bundled_entries_are_listed(home):
    ids = [e.id for e in ModelCatalog().entries()]
    assert ids == [QWEN15_ID, QWEN05_ID, GEMMA_ID, SMOLLM2_ID]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "nope", "does not exist"),
        (lambda d: _write(d / "notes.txt", b"hello"), "is not a model"),
        (lambda d: _write(d / "broken.gguf", b"GGUF\x03\x00\x00\x00garbage"), "not a readable GGUF"),
        (lambda d: _write(d / "fake.gguf", b"PK\x03\x04zip"), "not a GGUF file"),
        (lambda d: _mkdir(d / "empty"), "no config.json"),
        (lambda d: _hf_dir(d / "vit", {"model_type": "vit"}), "not a supported"),
        (lambda d: _hf_dir(d / "noweights", {"model_type": "llama"}), "no weights"),
        (lambda d: _link_loop(d / "loop.gguf"), "symbolic link that leads back to itself"),
    ],
)
def test_bad_paths_are_rejected_with_a_clear_message(home, tmp_path, make, message):
    path = make(tmp_path)
    catalog = ModelCatalog()
    with pytest.raises(ModelError, match=message):
        catalog.add(path)
    assert len(catalog.entries()) == len(BUNDLED)  # nothing half-added
    with pytest.raises(ModelError, match=message):  # opened by path, as --target does
        catalog.get(str(path))


def test_user_entries_persist_and_can_be_removed(home, tmp_path, smol_tok):
    from tests.tiny import tiny_smol_target

    folder = tmp_path / "my-model"
    tiny_smol_target(folder, smol_tok)
    entry = ModelCatalog().add(folder)
    assert ModelCatalog().get(entry.id).path == str(folder.resolve())
    assert ModelCatalog().add(folder).id == entry.id  # adding twice keeps one entry
    ModelCatalog().remove(entry.id)
    assert [e.id for e in ModelCatalog().entries()] == list(BUNDLED)


def test_too_large_for_memory(home, tmp_path, smol_tok, monkeypatch):
    import omnidraft.core.models.catalog as catalog_mod

    folder = tmp_path / "big"
    _hf_dir(folder, {"model_type": "llama"})
    _write(folder / "model.safetensors", b"\0" * 4096)
    smol_tok.save_pretrained(folder)
    monkeypatch.setattr(catalog_mod.psutil, "virtual_memory", lambda: type("M", (), {"available": 1000})())
    with pytest.raises(ModelError, match="too large for the free memory"):
        ModelCatalog().add(folder)


def test_corrupt_catalog_is_kept_aside_and_reported(home):
    catalog = ModelCatalog()
    catalog.store.write_text("{not json")
    reopened = ModelCatalog()
    assert "damaged" in reopened.load_warning
    assert len(reopened.entries()) == len(BUNDLED)
    assert list(catalog.store.parent.glob("catalog.json.corrupt*"))


def _write(path, data):
    path.write_bytes(data)
    return path


def _link_loop(path):
    other = path.with_name("other.gguf")
    path.symlink_to(other)
    other.symlink_to(path)
    return path


def _mkdir(path):
    path.mkdir()
    return path


def _hf_dir(path, config):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


def _sparse_qwen2_7b(path):
    """A GGUF file shaped as Qwen2.5-7B in Q4_K (28 layers, 4 KV heads of 128,
    a 32768-token window), its weights a hole in a sparse file: the header is what
    the memory check reads."""
    import os

    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
    from omnidraft.core.models.gguf_header import read_header

    q4k = GGMLQuantizationType.Q4_K
    writer = GGUFWriter(path, "qwen2")
    writer.add_name("Qwen2.5 7B shaped")
    writer.add_block_count(28)
    writer.add_context_length(32768)
    writer.add_embedding_length(3584)
    writer.add_feed_forward_length(18944)
    writer.add_head_count(28)
    writer.add_head_count_kv(4)
    writer.add_token_list(["a", "b"])
    shapes = {"token_embd.weight": (152064, 3584), "output.weight": (152064, 3584)}
    for i in range(28):
        shapes |= {f"blk.{i}.attn_q.weight": (3584, 3584), f"blk.{i}.attn_k.weight": (512, 3584),
                   f"blk.{i}.attn_v.weight": (512, 3584), f"blk.{i}.attn_output.weight": (3584, 3584),
                   f"blk.{i}.ffn_gate.weight": (18944, 3584), f"blk.{i}.ffn_up.weight": (18944, 3584),
                   f"blk.{i}.ffn_down.weight": (3584, 18944)}
    block, size = GGML_QUANT_SIZES[q4k]
    for name, (n, k) in shapes.items():
        writer.add_tensor_info(name, (n, k // block * size), np.dtype(np.uint8), n * k // block * size, raw_dtype=q4k)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    header = read_header(path)
    os.truncate(path, max(t.offset + t.n_elements // block * size for t in header.tensors))


def test_a_7b_q4_k_m_fits_a_16_gb_machine_and_the_check_counts_file_and_kv_cache(home, tmp_path, monkeypatch):
    """Counted as bf16 weights (parameters x 2 x 1.3) a 7B needed 19.8 GB and was
    refused on a 16 GB laptop; its weights run as the file holds them."""
    import dataclasses

    import omnidraft.core.models.catalog as catalog_mod
    from omnidraft.core.storage.settings import load_settings, save_settings

    path = tmp_path / "qwen2.5-7b-q4_k.gguf"
    _sparse_qwen2_7b(path)
    size = path.stat().st_size
    assert 4.0e9 < size < 4.5e9
    free = {"available": 14 * 2**30}  # a 16 GB machine with a desktop running
    monkeypatch.setattr(catalog_mod.psutil, "virtual_memory", lambda: type("M", (), free)())
    entry = ModelCatalog().add(path)
    info = catalog_mod.inspect_gguf(path)
    kv_per_token = 2 * 28 * 4 * 128 * 2  # keys and values, fp16
    assert info["kv_per_token"] == kv_per_token and info["window"] == 32768
    assert catalog_mod.model_memory(info) == size + kv_per_token * 32768 + catalog_mod.RUNTIME_BYTES
    assert catalog_mod.model_memory(info) < 8 * 2**30
    # The chosen context length counts, not the model's whole window.
    save_settings(dataclasses.replace(load_settings()[0], context_tokens=4096))
    assert catalog_mod.model_memory(info) == size + kv_per_token * 4096 + catalog_mod.RUNTIME_BYTES
    ModelCatalog().remove(entry.id)
    free["available"] = 4 * 2**30
    with pytest.raises(ModelError, match=r"too large for the free memory: it needs about 5\.\d GiB and 4\.0 GiB"):
        ModelCatalog().add(path)
