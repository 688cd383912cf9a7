"""More models: a curated list of instruct GGUF files on Hugging Face, and their
download (progress, cancel, resume after a restart, checked before use).

Qt-free and blocking: the GUI runs download() on a thread of its own and adds the
finished file to the catalog like any local GGUF (catalog.ModelCatalog.add).

huggingface_hub does the Hub's part: the file's address (hf_hub_url, HF_ENDPOINT
honoured), what the Hub says of it (get_hf_file_metadata: size, the sha256 it
publishes as the LFS ETag, the commit, the redirect to the storage host), the
user's token for gated repositories (build_hf_headers), its HTTP session and its
error types. The transfer loop is ours because hf_hub_download (2.x) writes to a
process-unique temporary file that it deletes when a download fails or is
stopped, so nothing survives a restart, and it reads 10 MiB between progress
reports, each a chance to cancel. Here the bytes go to `<file>.download`, kept
with the ETag it belongs to in `<file>.download.json`; a later download asks for
the rest with a Range header. The sha256 is computed as the bytes arrive (after
re-reading what an earlier session fetched) and a file that does not match the
Hub's size and checksum never gets its final name.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ..stopping import ShouldStop, never
from ..storage import paths
from .catalog import KV_ELEMENT_BYTES, chosen_context, memory_needed
from .gguf_header import KVShape

# (bytes of the file on disk so far, its full size). Called for every piece received.
Progress = Callable[[int, int], None]
_READ_CHUNK = 8 << 20  # re-reading a partial file for its checksum
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def no_progress(done: int, total: int) -> None:
    pass


class DownloadError(Exception):
    """A download that could not finish; str(error) is shown to the user as is."""


class DownloadCancelled(Exception):
    """The user stopped the download; what arrived is kept for a later resume."""


@dataclass(frozen=True)
class Offer:
    """A model a user can download: one GGUF file in a Hugging Face repository."""

    id: str
    name: str
    repo_id: str
    filename: str
    size_bytes: int  # of the file, as listed for it (the download checks the Hub's own figure)
    params: int
    description: str
    license: str
    revision: str = "main"
    # Its KV cache's bytes per token (2 x layers x KV heads x head_dim x 2 bytes,
    # from the model's published config) and its context window.
    kv_per_token: int = 0
    window: int = 0

    @property
    def memory_bytes(self) -> int:
        """What running it here takes (the catalog's rule: the file, its KV cache
        at the chosen context length, the runtime)."""
        return memory_needed(self.size_bytes, self.kv_per_token, chosen_context(self.window))

    @property
    def page(self) -> str:
        return f"https://huggingface.co/{self.repo_id}"


def _kv(layers: int, kv_heads: int, head_dim: int) -> int:
    return KVShape(layers, kv_heads, head_dim, 0).bytes_per_token(KV_ELEMENT_BYTES)


# Q4_K_M files of instruct models whose architectures transformers loads from GGUF.
# Repository ids, file names and sizes come from public listings read while writing
# this (the same listing gives the bundled Qwen2.5-Coder-1.5B file's exact size and
# sha256); they could not be checked against the Hub from here (no network). The
# download never relies on them: it checks the size and sha256 the Hub publishes.
CURATED: tuple[Offer, ...] = (
    Offer("qwen2.5-coder-3b-instruct-q4km", "Qwen2.5-Coder-3B-Instruct",
          "Qwen/Qwen2.5-Coder-3B-Instruct-GGUF", "qwen2.5-coder-3b-instruct-q4_k_m.gguf",
          2_104_932_800, 3_090_000_000, "code and chat, a step up from the bundled 1.5B",
          "Qwen Research License", kv_per_token=_kv(36, 2, 128), window=32768),
    Offer("qwen2.5-coder-7b-instruct-q4km", "Qwen2.5-Coder-7B-Instruct",
          "Qwen/Qwen2.5-Coder-7B-Instruct-GGUF", "qwen2.5-coder-7b-instruct-q4_k_m.gguf",
          4_683_073_536, 7_620_000_000, "strong code model; needs a lot of memory",
          "Apache-2.0", kv_per_token=_kv(28, 4, 128), window=32768),
    Offer("llama-3.2-1b-instruct-q4km", "Llama-3.2-1B-Instruct",
          "bartowski/Llama-3.2-1B-Instruct-GGUF", "Llama-3.2-1B-Instruct-Q4_K_M.gguf",
          807_694_464, 1_240_000_000, "small, quick general chat",
          "Llama 3.2 Community License", kv_per_token=_kv(16, 8, 64), window=131072),
    Offer("llama-3.2-3b-instruct-q4km", "Llama-3.2-3B-Instruct",
          "unsloth/Llama-3.2-3B-Instruct-GGUF", "Llama-3.2-3B-Instruct-Q4_K_M.gguf",
          2_019_377_600, 3_210_000_000, "general chat, writing, summaries",
          "Llama 3.2 Community License", kv_per_token=_kv(28, 8, 128), window=131072),
    Offer("gemma-3-1b-it-q4km", "Gemma-3-1B-it",
          "bartowski/google_gemma-3-1b-it-GGUF", "google_gemma-3-1b-it-Q4_K_M.gguf",
          806_058_496, 1_000_000_000, "small general chat, many languages",
          "Gemma Terms of Use", kv_per_token=_kv(26, 1, 256), window=32768),
    Offer("gemma-3-4b-it-q4km", "Gemma-3-4B-it",
          "bartowski/google_gemma-3-4b-it-GGUF", "google_gemma-3-4b-it-Q4_K_M.gguf",
          2_489_758_112, 3_880_000_000, "general chat, many languages (text only here)",
          "Gemma Terms of Use", kv_per_token=_kv(34, 4, 256), window=131072),
    Offer("phi-4-mini-instruct-q4km", "Phi-4-mini-instruct",
          "unsloth/Phi-4-mini-instruct-GGUF", "Phi-4-mini-instruct-Q4_K_M.gguf",
          2_491_874_272, 3_840_000_000, "reasoning, maths and code",
          "MIT", kv_per_token=_kv(32, 8, 128), window=131072),
)


# --------------------------------------------------------------------------- where files go

def models_dir() -> Path:
    """Downloaded models. In the cache folder, as huggingface_hub keeps its own
    downloads: they can be fetched again (checked), and Clear all data, which is
    about what you typed and what was learned from it, leaves these gigabytes."""
    return paths.private_dir(paths.cache_dir() / "downloads")


def final_path(offer: Offer) -> Path:
    return models_dir() / offer.filename


def partial_path(offer: Offer) -> Path:
    final = final_path(offer)
    return final.with_name(final.name + ".download")


def _record_path(part: Path) -> Path:
    return part.with_name(part.name + ".json")


@dataclass(frozen=True)
class LocalState:
    path: Path | None  # the finished file, None until there is one
    partial_bytes: int = 0  # what an unfinished download left to resume from
    total_bytes: int = 0  # the whole file's size as the Hub gave it (0: not asked yet)

    @property
    def fraction(self) -> float:
        return self.partial_bytes / self.total_bytes if self.total_bytes else 0.0


def local_state(offer: Offer) -> LocalState:
    final = final_path(offer)
    if final.exists():
        return LocalState(final)
    part = partial_path(offer)
    if not part.exists():
        return LocalState(None)
    try:
        total = int(json.loads(_record_path(part).read_text()).get("size", 0))
    except (OSError, ValueError, AttributeError, TypeError):
        total = 0
    return LocalState(None, part.stat().st_size, total or offer.size_bytes)


# --------------------------------------------------------------------------- the Hub's side

@dataclass(frozen=True)
class _Remote:
    url: str  # where the bytes are (the storage host the Hub redirects to, or the Hub itself)
    size: int
    sha256: str
    commit: str
    resolve_url: str  # the Hub address asked


def _endpoint() -> str | None:
    # huggingface_hub reads HF_ENDPOINT once, at import; read it at each download.
    return os.environ.get("HF_ENDPOINT") or None


def _host(url: str) -> str:
    return urlsplit(url).netloc


def _offline_message(offer: Offer, url: str) -> str:
    return (
        f"Could not reach Hugging Face ({_host(url)}) to download {offer.name}: this "
        "computer seems to be offline. Try again when you are online (a download "
        "already begun goes on from where it stopped)."
    )


def _resolve(offer: Offer) -> _Remote:
    """Ask the Hub for the file's size, checksum and location (one HEAD request)."""
    import httpx2
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = _endpoint()
    url = hf_hub_url(offer.repo_id, offer.filename, revision=offer.revision, endpoint=endpoint)
    try:
        meta = get_hf_file_metadata(url, endpoint=endpoint)
    except OfflineModeIsEnabled as exc:
        raise DownloadError("Downloads are turned off here (HF_HUB_OFFLINE is set).") from exc
    except GatedRepoError as exc:
        raise DownloadError(
            f"{offer.repo_id} asks you to accept its license first: open {offer.page}, accept "
            "it, and log in on this computer (`hf auth login`)."
        ) from exc
    except (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError) as exc:
        raise DownloadError(f"{offer.filename} is no longer in {offer.repo_id} on Hugging Face.") from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise DownloadError(f"Hugging Face refused the download of {offer.name} (HTTP {status}).") from exc
    except (httpx2.TransportError, OSError) as exc:
        raise DownloadError(_offline_message(offer, url)) from exc
    if not meta.commit_hash:  # every Hub answer names the commit; a portal or proxy page does not
        raise DownloadError(
            f"{_host(url)} did not answer like Hugging Face when asked for {offer.name} (a "
            "proxy or a network login page in the way?); nothing was downloaded."
        )
    sha256 = (meta.etag or "").lower()
    if meta.size is None or not _SHA256.match(sha256):
        raise DownloadError(
            f"Hugging Face did not give the size and checksum of {offer.filename}, so it could "
            "not be checked; nothing was downloaded."
        )
    return _Remote(meta.location or url, meta.size, sha256, meta.commit_hash, url)


# --------------------------------------------------------------------------- the download

def download(offer: Offer, progress: Progress = no_progress, should_stop: ShouldStop = never) -> Path:
    """The offer's file in models_dir(), downloaded (or finished) now and checked
    against the Hub's size and sha256. Raises DownloadCancelled when should_stop()
    turns true (what arrived is kept) and DownloadError with a message for people."""
    final = final_path(offer)
    if final.exists():
        return final
    remote = _resolve(offer)
    part = partial_path(offer)
    record = _record_path(part)
    digest = hashlib.sha256()
    have = _resume_point(part, record, remote)
    if have == 0:
        part.write_bytes(b"")
        record.write_text(json.dumps({
            "repo_id": offer.repo_id, "filename": offer.filename, "commit": remote.commit,
            "sha256": remote.sha256, "size": remote.size,
        }))
    _check_disk(offer, remote.size - have)
    _hash_existing(part, have, digest, should_stop)
    progress(have, remote.size)
    if have < remote.size:
        have, digest = _fetch(offer, remote, part, have, digest, progress, should_stop)
    if have != remote.size or digest.hexdigest() != remote.sha256:
        part.unlink(missing_ok=True)
        record.unlink(missing_ok=True)
        raise DownloadError(
            f"{offer.filename} arrived damaged: it does not match the size and checksum "
            "Hugging Face publishes for it. It was deleted; download it again."
        )
    os.replace(part, final)  # only a complete, checked file ever has the final name
    record.unlink(missing_ok=True)
    return final


def _resume_point(part: Path, record: Path, remote: _Remote) -> int:
    """Bytes of an earlier download of this very file (same sha256) to continue from."""
    if not part.exists() or not record.exists():
        return 0
    try:
        earlier = json.loads(record.read_text())
    except (OSError, ValueError):
        return 0
    size = part.stat().st_size
    if not isinstance(earlier, dict) or earlier.get("sha256") != remote.sha256 or size > remote.size:
        return 0  # the file changed on the Hub since, or the record is not ours: start over
    return size


def _check_disk(offer: Offer, remaining: int) -> None:
    free = shutil.disk_usage(models_dir()).free
    if remaining > free:
        raise DownloadError(
            f"Not enough disk space for {offer.name}: it needs {remaining / 1e9:.1f} GB more "
            f"and {free / 1e9:.1f} GB is free in {models_dir()}."
        )


def _hash_existing(part: Path, have: int, digest, should_stop: ShouldStop) -> None:
    with open(part, "rb") as f:
        left = have
        while left > 0:
            if should_stop():
                raise DownloadCancelled()
            chunk = f.read(min(_READ_CHUNK, left))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)


def _fetch(
    offer: Offer, remote: _Remote, part: Path, have: int, digest, progress: Progress,
    should_stop: ShouldStop,
) -> tuple[int, object]:
    """Append the rest of the file to `part`; returns the bytes on disk at the end
    and the sha256 of all of them."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    headers = build_hf_headers()
    headers["Accept-Encoding"] = "identity"  # the bytes as published, or the checksum cannot match
    if _host(remote.url) != _host(remote.resolve_url):
        headers.pop("authorization", None)  # a signed storage address: the token stays with the Hub
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        with get_session().stream(
            "GET", remote.url, headers=headers, follow_redirects=True,
            timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
        ) as response:
            hf_raise_for_status(response)
            if have and not _continues_at(response, have):
                have = 0  # the server sent the whole file: start over with it
                digest = hashlib.sha256()
            with open(part, "r+b") as f:
                f.seek(have)
                f.truncate()
                for chunk in response.iter_bytes():
                    if should_stop():
                        raise DownloadCancelled()
                    f.write(chunk)
                    digest.update(chunk)
                    have += len(chunk)
                    progress(have, remote.size)
                    if have > remote.size:
                        break  # more than the Hub announced: refused below
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise DownloadError(f"The download of {offer.name} was refused (HTTP {status}); try again later.") from exc
    except httpx2.TransportError as exc:
        if should_stop():  # stopped while the connection stalled: the read timed out first
            raise DownloadCancelled() from exc
        raise DownloadError(
            f"The connection broke off while downloading {offer.name} "
            f"({have / remote.size:.0%} done). What arrived is kept: resume to continue."
        ) from exc
    if have < remote.size:
        raise DownloadError(
            f"The download of {offer.name} ended early ({have / remote.size:.0%} done). "
            "What arrived is kept: resume to continue."
        )
    return have, digest


def _continues_at(response, offset: int) -> bool:
    """True when the server answered the Range request with the bytes from `offset` on."""
    if response.status_code != 206:
        return False
    match = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", ""))
    return bool(match) and int(match.group(1)) == offset
