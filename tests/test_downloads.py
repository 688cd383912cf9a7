"""Getting a model: the real download code (huggingface_hub's metadata and session,
our resumable transfer) against a local server that answers like the Hub, serving
a small GGUF file written here."""

from __future__ import annotations

import socket

import pytest
from omnidraft.core.models import downloads
from omnidraft.core.models.catalog import ModelCatalog, memory_needed
from omnidraft.core.models.downloads import (
    CURATED,
    DownloadCancelled,
    DownloadError,
    Offer,
    download,
    local_state,
)
from omnidraft.core.storage import paths

from tests.tiny import write_tiny_gguf

OFFER = Offer("tiny-test", "Tiny Test", "test-org/Tiny-GGUF", "tiny-q8_0.gguf",
              1_000_000, 30_000, "a test model", "MIT")


@pytest.fixture
def gguf_bytes(tmp_path) -> bytes:
    return write_tiny_gguf(tmp_path / "source.gguf").read_bytes()


def test_download_reports_progress_and_the_file_joins_the_catalog(home, hub, gguf_bytes):
    hub.add(OFFER.repo_id, OFFER.filename, gguf_bytes)
    seen: list[tuple[int, int]] = []
    path = download(OFFER, progress=lambda done, total: seen.append((done, total)))
    assert path.read_bytes() == gguf_bytes
    assert path.parent == downloads.models_dir()
    assert len(seen) > 2, "progress is reported while the bytes arrive, not only at the end"
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert seen[-1] == (len(gguf_bytes), len(gguf_bytes))
    assert {t for _, t in seen} == {len(gguf_bytes)}
    assert local_state(OFFER).path == path
    assert not list(path.parent.glob("*.download*")), "no partial file is left behind"
    entry = ModelCatalog().add(path)
    assert entry.name == "Tiny Downloaded" and entry.path == str(path)
    assert entry.id in {e.id for e in ModelCatalog().entries()}  # persisted
    assert download(OFFER) == path  # already there: nothing is fetched again
    assert len(hub.files[f"{OFFER.repo_id}/{OFFER.filename}"].ranges) == 1
    paths.clear_data()  # Clear all data: what you typed and learned, not the gigabytes
    assert local_state(OFFER).path == path and path.exists()


def test_cancel_keeps_the_partial_file_and_a_later_download_resumes_it(home, hub, gguf_bytes):
    served = hub.add(OFFER.repo_id, OFFER.filename, gguf_bytes)
    seen: list[int] = []
    with pytest.raises(DownloadCancelled):
        download(OFFER, lambda done, total: seen.append(done), lambda: len(seen) > 2)  # (progress, stop when true)
    state = local_state(OFFER)
    assert state.path is None and not downloads.final_path(OFFER).exists()
    assert 0 < state.partial_bytes < len(gguf_bytes)
    assert downloads.partial_path(OFFER).read_bytes() == gguf_bytes[: state.partial_bytes]

    # After a restart (nothing shared but the files on disk), only the rest is asked for.
    resumed: list[int] = []
    path = download(OFFER, progress=lambda done, total: resumed.append(done))
    assert path.read_bytes() == gguf_bytes
    assert served.ranges[-1] == f"bytes={state.partial_bytes}-"
    assert served.sent[-1] == len(gguf_bytes) - state.partial_bytes
    assert resumed[0] == state.partial_bytes and resumed[-1] == len(gguf_bytes)


def test_a_server_that_ignores_the_range_still_gives_a_whole_checked_file(home, hub, gguf_bytes):
    hub.add(OFFER.repo_id, OFFER.filename, gguf_bytes)
    seen: list[int] = []
    with pytest.raises(DownloadCancelled):
        download(OFFER, lambda done, total: seen.append(done), lambda: len(seen) > 2)
    hub.ignore_range = True
    assert download(OFFER).read_bytes() == gguf_bytes


def test_a_file_changed_on_the_hub_since_is_started_over(home, hub, gguf_bytes, tmp_path):
    hub.add(OFFER.repo_id, OFFER.filename, gguf_bytes)
    seen: list[int] = []
    with pytest.raises(DownloadCancelled):
        download(OFFER, lambda done, total: seen.append(done), lambda: len(seen) > 2)
    newer = write_tiny_gguf(tmp_path / "newer.gguf", name="Tiny Newer").read_bytes()
    served = hub.add(OFFER.repo_id, OFFER.filename, newer)
    assert download(OFFER).read_bytes() == newer
    assert served.ranges == [None]  # the old part was not continued


def test_a_corrupt_file_is_refused_and_deleted(home, hub, gguf_bytes):
    hub.add(OFFER.repo_id, OFFER.filename, gguf_bytes).corrupt = True
    with pytest.raises(DownloadError, match="arrived damaged"):
        download(OFFER)
    assert local_state(OFFER) == downloads.LocalState(None, 0)
    assert not list(downloads.models_dir().iterdir())


def test_offline_gives_a_clear_message_and_writes_nothing(home, monkeypatch):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(DownloadError, match="seems to be offline") as error:
        download(OFFER)
    assert "Traceback" not in str(error.value) and OFFER.name in str(error.value)
    assert local_state(OFFER) == downloads.LocalState(None, 0)


def test_a_missing_file_a_stranger_server_and_too_little_disk_are_explained(
    home, hub, gguf_bytes, monkeypatch
):
    with pytest.raises(DownloadError, match="no longer in test-org/Tiny-GGUF"):
        download(OFFER)
    hub.add(OFFER.repo_id, OFFER.filename, gguf_bytes)
    hub.hub_headers = False
    with pytest.raises(DownloadError, match="did not answer like Hugging Face"):
        download(OFFER)
    hub.hub_headers = True
    monkeypatch.setattr(downloads.shutil, "disk_usage", lambda _p: type("U", (), {"free": 1000})())
    with pytest.raises(DownloadError, match="Not enough disk space"):
        download(OFFER)


def test_curated_offers_are_instruct_gguf_files_with_sizes():
    assert len(CURATED) >= 7 and len({o.id for o in CURATED}) == len(CURATED)
    for offer in CURATED:
        assert offer.filename.lower().endswith("q4_k_m.gguf"), offer
        assert "/" in offer.repo_id and offer.size_bytes > 500_000_000
        # A Q4_K_M file holds ~4.5-6 bits per weight.
        assert 4.0 < offer.size_bytes * 8 / offer.params < 7.0, offer
        assert offer.memory_bytes == memory_needed(offer.size_bytes, offer.kv_per_token, offer.window) > offer.size_bytes
