"""A converted model copy is sealed when written and checked before each load: a
copy cut short or with changed bytes is removed and converted again, with a
message (core/models/converted_cache.py). The end-to-end rebuild of a real
converted model is in the fault tier (tests/test_faults.py)."""

from __future__ import annotations

import json
import os

import pytest
from omnidraft.core.models import converted_cache
from omnidraft.core.models.converted_cache import MARKER, check, seal, usable


@pytest.fixture
def copy(tmp_path):
    folder = tmp_path / "model-abc"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(os.urandom(64 * 1024))
    (folder / "config.json").write_text('{"model_type": "llama"}')
    seal(folder, tmp_path / "model.gguf", 1)
    return folder


def test_a_sealed_copy_records_every_file_and_loads(copy):
    record = json.loads((copy / MARKER).read_text())
    assert set(record["files"]) == {"model.safetensors", "config.json"}
    assert record["files"]["model.safetensors"]["size"] == 64 * 1024
    assert check(copy) is None and usable(copy, "model.gguf")


def test_a_copy_cut_short_is_removed_with_a_message(copy):
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: 32 * 1024])
    assert "32,768 bytes instead of 65,536" in check(copy)
    said = []
    assert not usable(copy, "model.gguf", lambda stage, fraction: said.append(stage))
    assert not copy.exists(), "removed, so the caller converts again"
    assert said and "model.gguf is damaged" in said[0] and "converting it again" in said[0]


def test_changed_bytes_are_found_by_their_checksum(copy):
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[1000:1008] = bytes(b ^ 0xFF for b in data[1000:1008])
    weights.write_bytes(bytes(data))  # same size
    assert check(copy) == "model.safetensors has changed since it was converted"


def test_a_missing_file_or_unreadable_record_is_damage(copy):
    (copy / "config.json").unlink()
    assert check(copy) == "config.json is missing"
    (copy / MARKER).write_text('{"files": {"x": 3}}')
    assert "unreadable" in check(copy)
    (copy / MARKER).write_bytes(b"\xff\x00")
    assert not usable(copy, "model.gguf") and not copy.exists()


def test_the_same_bytes_rewritten_are_hashed_once_then_trusted(copy, monkeypatch):
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes())  # a new signature (mtime, ctime), same content
    assert check(copy) is None
    hashed = []
    monkeypatch.setattr(converted_cache, "_sha256", lambda path: hashed.append(path) or "")
    assert check(copy) is None and hashed == [], "the new signature was recorded"


def test_a_copy_sealed_by_an_older_version_is_sealed_on_first_check(copy):
    (copy / MARKER).write_text(json.dumps({"source": "model.gguf", "format": 1}))
    assert check(copy) is None
    assert "files" in json.loads((copy / MARKER).read_text())
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:10])
    assert "bytes instead of" in check(copy)


def _sealed(folder, data: bytes):
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(data)
    seal(folder, folder.parent / "model.gguf", 1)
    return folder


def test_a_copy_another_process_put_in_place_first_is_kept(tmp_path):
    theirs = _sealed(tmp_path / "model-abc", b"theirs" * 1000)
    ours = _sealed(tmp_path / "model-abc.partial-1", b"ours" * 1000)
    converted_cache.publish(ours, theirs, "model.gguf")
    assert not ours.exists() and usable(theirs, "model.gguf")
    assert (theirs / "model.safetensors").read_bytes() == b"theirs" * 1000


def test_a_damaged_copy_in_the_way_is_replaced_by_ours(tmp_path):
    theirs = _sealed(tmp_path / "model-abc", b"theirs" * 1000)
    (theirs / "model.safetensors").write_bytes(b"cut")
    ours = _sealed(tmp_path / "model-abc.partial-1", b"ours" * 1000)
    converted_cache.publish(ours, theirs, "model.gguf")
    assert not ours.exists() and (theirs / "model.safetensors").read_bytes() == b"ours" * 1000
