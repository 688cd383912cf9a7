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
    from tests.tiny import tiny_llama

    folder = tmp_path / "my-model"
    tiny_llama(len(smol_tok)).save_pretrained(folder)
    smol_tok.save_pretrained(folder)
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
