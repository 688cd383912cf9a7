"""The model catalog: bundled targets plus the local models a user adds.

Every path a user offers is validated before it enters the catalog; each way
it can be unusable raises ModelError with a message a person can act on.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from ..storage import paths
from ..storage.persistence import CorruptStateError, atomic_write_json, read_json
from .bundled_models import (
    QWEN_CODER_05B,
    QWEN_CODER_15B,
    BundledFileError,
    Progress,
    gemma_gguf,
    no_progress,
    smollm2_gguf,
)
from .context import config_kv_shape
from .gguf_header import kv_shape, read_header

SMOLLM2_ID = "smollm2-135m-instruct"
GEMMA_ID = "gemma-3-270m"
QWEN15_ID = "qwen2.5-coder-1.5b-instruct"
QWEN05_ID = "qwen2.5-coder-0.5b-instruct"
DEFAULT_TARGET = QWEN15_ID
# Memory a target needs beyond its file and its KV cache: Python, torch and
# transformers, activations, the drafter (in float, for learning: float32 on a
# CPU without native bf16) and its own KV cache. The default target's RSS after
# a first reply less its file's size was 1.13 GiB on an AVX2 CPU (python -m
# omnidraft.tools.load_footprint), rounded up.
RUNTIME_BYTES = 5 << 28  # 1.25 GiB
# Bytes per key or value element: fp16 in the decoder stack (decoder_stack.c), the
# activations' bf16 on transformers' forward (HeldCache's DynamicCache).
KV_ELEMENT_BYTES = 2
# The context a window is counted at when the model's header gives none.
_DEFAULT_WINDOW = 4096


class ModelError(Exception):
    """A model path or entry that cannot be used; str(error) is shown to the user."""


@dataclass(frozen=True)
class ModelEntry:
    id: str
    name: str
    path: str  # a .gguf file or a Hugging Face model folder ("" until a bundled file is assembled)
    bundled: bool = False
    # "gemma-turns" for base Gemma files without a chat template; "template" otherwise.
    chat_format: str = "template"
    description: str = ""  # a few words for the Targets menu
    size_bytes: int = 0  # of the model file, for the Targets menu (0: not known)

    @property
    def is_gguf(self) -> bool:
        return self.path.endswith(".gguf")


BUNDLED: dict[str, ModelEntry] = {
    e.id: e
    for e in (
        ModelEntry(
            QWEN15_ID, "Qwen2.5-Coder-1.5B-Instruct", "", bundled=True,
            description="chat and code; the default",
            size_bytes=QWEN_CODER_15B.size,
        ),
        ModelEntry(
            QWEN05_ID, "Qwen2.5-Coder-0.5B-Instruct", "", bundled=True,
            description="smaller chat and code model",
            size_bytes=QWEN_CODER_05B.size,
        ),
        ModelEntry(
            GEMMA_ID, "Gemma-3-270M (base)", "", bundled=True, chat_format="gemma-turns",
            description="base model: continues text, does not chat",
            size_bytes=253_113_024,
        ),
        ModelEntry(
            SMOLLM2_ID, "SmolLM2-135M-Instruct", "", bundled=True,
            description="the drafter's own family (same tokenizer)",
            size_bytes=98_362_432,
        ),
    )
}
_BUNDLED_FILES = {
    QWEN15_ID: QWEN_CODER_15B.path,
    QWEN05_ID: QWEN_CODER_05B.path,
    GEMMA_ID: gemma_gguf,
    SMOLLM2_ID: smollm2_gguf,
}


def bundled_path(entry_id: str, progress: Progress = no_progress) -> Path:
    """The bundled entry's GGUF file, assembled and verified on first use."""
    try:
        return _BUNDLED_FILES[entry_id](progress)
    except BundledFileError as exc:
        raise ModelError(str(exc)) from exc


# --------------------------------------------------------------------------- validation

def memory_needed(file_bytes: int, kv_bytes_per_token: int, context: int) -> int:
    """Bytes of memory a model needs here: its file (a GGUF file's blocks run as
    they are), its KV cache at `context` tokens, and the runtime (RUNTIME_BYTES)."""
    return file_bytes + kv_bytes_per_token * context + RUNTIME_BYTES


def chosen_context(window: int) -> int:
    """The context the memory check counts: the user's context length
    (Settings), else the model's own window."""
    from ..storage.settings import load_settings

    try:
        tokens = int(load_settings()[0].context_tokens)
    except Exception:  # noqa: BLE001 - unreadable settings: count the model's window
        tokens = 0
    window = window or _DEFAULT_WINDOW
    return min(tokens, window) if tokens else window


def model_memory(info: dict) -> int:
    """memory_needed for what inspect_gguf / inspect_hf_folder found. A folder's
    weights load in bf16 (2 bytes a parameter)."""
    size = info.get("size") or info["params"] * 2
    return memory_needed(size, info.get("kv_per_token", 0), chosen_context(info.get("window", 0)))


def _check_memory(info: dict, where: Path) -> None:
    need = model_memory(info)
    free = psutil.virtual_memory().available
    if need > free:
        raise ModelError(
            f"{where.name} is too large for the free memory: it needs about "
            f"{need / 2**30:.1f} GiB and {free / 2**30:.1f} GiB is free."
        )


def _supported_gguf_arch(arch: str) -> bool:
    try:
        from transformers.integrations.gguf.utils import is_gguf_arch_supported

        if is_gguf_arch_supported(arch):
            return True
    except ImportError:
        pass
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    return arch in GGUF_CONFIG_MAPPING


def inspect_gguf(path: Path) -> dict:
    """Architecture, name and parameter count from a GGUF header, without loading weights."""
    try:
        header = read_header(path)
    except (ValueError, OSError) as exc:
        raise ModelError(f"{path.name} is not a readable GGUF model file: its header is damaged "
                         "or cut short.") from exc
    arch = header.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelError(f"{path.name} has no model architecture in its header; it is not a model.")
    if not _supported_gguf_arch(arch):
        raise ModelError(f"{path.name} uses the architecture '{arch}', which is not supported.")
    if "tokenizer.ggml.tokens" not in header.metadata:
        raise ModelError(f"{path.name} carries no tokenizer, so it cannot be used for chat.")
    _check_gguf_data(path, header.tensors)
    n_params = sum(t.n_elements for t in header.tensors)
    name = header.metadata.get("general.name")
    shape = kv_shape(header)
    return {"arch": arch, "name": name if isinstance(name, str) and name else path.stem, "params": n_params,
            "size": path.stat().st_size, "window": shape.window if shape else 0,
            "kv_per_token": shape.bytes_per_token(KV_ELEMENT_BYTES) if shape else 0}


def _check_gguf_data(path: Path, tensors) -> None:
    """Every tensor's data lies inside the file: a download or copy cut short
    otherwise passes the header checks and fails at every load."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    end = 0
    for tensor in tensors:
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(tensor.ggml_type)]
        except (ValueError, KeyError) as exc:
            raise ModelError(f"{path.name} holds tensors of a kind this app does not know "
                             f"(type {tensor.ggml_type}); it cannot be used.") from exc
        end = max(end, tensor.offset + tensor.n_elements // block * block_bytes)
    size = path.stat().st_size
    if end > size:
        raise ModelError(
            f"{path.name} is incomplete: its header describes {_amount(end)} of weights but the "
            f"file holds {_amount(size)}. Download or copy it again."
        )


def _amount(n: int) -> str:
    return f"{n / 2**20:,.0f} MB" if n >= 2**20 else f"{n / 2**10:,.0f} KB"


def _check_safetensors(path: Path) -> None:
    """A .safetensors file whose header reads and whose tensors lie inside it."""
    import json
    import struct

    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > min(size - 8, 100 * 2**20):
                raise ValueError("header length")
            header = json.loads(f.read(length))
        ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
    except (OSError, ValueError, struct.error, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise ModelError(f"{path.parent.name}/{path.name} is not a readable weights file "
                         "(its header is damaged); the model cannot be used.") from exc
    if 8 + length + max(ends, default=0) > size:
        raise ModelError(f"{path.parent.name}/{path.name} is incomplete: it is shorter than the weights "
                         "its header describes. Download or copy it again.")


def _check_tokenizer(path: Path) -> None:
    """tokenizer.json, where there is one, parses as a tokenizer."""
    file = path / "tokenizer.json"
    if not file.exists():
        return
    from tokenizers import Tokenizer

    try:
        Tokenizer.from_file(str(file))
    except Exception as exc:  # the library raises plain Exception for a bad file
        raise ModelError(f"{path.name}/tokenizer.json is damaged or not a tokenizer, so the "
                         "model cannot be used for chat.") from exc


def inspect_hf_folder(path: Path) -> dict:
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if not (path / "config.json").exists():
        raise ModelError(f"{path} is not a model folder: it has no config.json.")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # transformers raises many kinds for a bad file
        raise ModelError(f"{path.name}/config.json could not be read; it is damaged or not a "
                         "model's configuration.") from exc
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelError(
            f"{path.name} is a '{config.model_type}' model, which is not a supported "
            "text-generation (causal LM) architecture."
        )
    weights = list(path.glob("*.safetensors")) + list(path.glob("pytorch_model*.bin"))
    if not weights:
        raise ModelError(f"{path.name} has a config but no weights (*.safetensors) in it.")
    tokenizer_files = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
    if not any((path / f).exists() for f in tokenizer_files):
        raise ModelError(f"{path.name} has no tokenizer files, so it cannot be used for chat.")
    size = sum(w.stat().st_size for w in weights)
    dtype_bytes = 4 if "float32" in str(getattr(config, "torch_dtype", "")) else 2
    shape = config_kv_shape(config)
    return {"arch": config.model_type, "name": path.name, "params": size // dtype_bytes, "size": size,
            "kv_per_token": shape.bytes_per_token(KV_ELEMENT_BYTES), "window": shape.window}


def resolved(path: str | Path) -> Path:
    """The absolute path with links followed; ModelError for a link loop (Python's
    RuntimeError would reach the person as 'something went wrong in the engine')."""
    path = Path(path).expanduser()
    try:
        return path.resolve()
    except (RuntimeError, OSError) as exc:
        raise ModelError(
            f"{path} is a symbolic link that leads back to itself; choose the model file "
            "or folder it was meant to point to."
        ) from exc


def inspect_path(path: str | Path) -> dict:
    """Validate a user-offered model path; raises ModelError naming the problem."""
    path = Path(path).expanduser()
    resolved(path)  # a link loop is named as such, not as a missing file
    if not path.exists():
        raise ModelError(f"{path} does not exist.")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelError(
                f"{path.name} is not a model: choose a .gguf file or a Hugging Face model folder."
            )
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ModelError(f"{path.name} is not a GGUF file (its header is wrong or damaged).")
        info = inspect_gguf(path)
        info["size"] = path.stat().st_size
    else:
        info = inspect_hf_folder(path)
    _check_memory(info, path)
    if path.is_dir():  # read what the folder's files hold: damaged ones never reach the menu
        for file in sorted(path.glob("*.safetensors")):
            _check_safetensors(file)
        _check_tokenizer(path)
    return info


# --------------------------------------------------------------------------- catalog

def _entries(raw: object, path: Path) -> list[ModelEntry]:
    """The user's entries in a saved catalog; CorruptStateError for a wrong shape."""
    user = raw.get("user") if isinstance(raw, dict) else None
    if not isinstance(user, list):
        raise CorruptStateError(path, "it does not hold a list of models")
    try:
        entries = [ModelEntry(**e) for e in user]
    except TypeError as exc:  # not a record, or not an entry's fields
        raise CorruptStateError(path, f"an entry is not a model ({exc})") from exc
    if not all(isinstance(e.id, str) and isinstance(e.path, str) and isinstance(e.name, str) for e in entries):
        raise CorruptStateError(path, "an entry's id, name or path is not text")
    return entries


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "model"


class ModelCatalog:
    """Bundled entries first, then user-added ones (persisted in catalog.json)."""

    def __init__(self, store: Path | None = None):
        self.store = store or paths.data_dir() / "catalog.json"
        self.load_warning: str | None = None
        try:
            self._user = _entries(read_json(self.store, {"user": []}), self.store)
        except CorruptStateError as exc:
            # Set aside, never overwritten by the next save: it names the user's models.
            kept = exc.quarantine()
            self.load_warning = f"The model list was damaged; it was kept as {kept.name}."
            self._user = []

    def entries(self) -> list[ModelEntry]:
        return list(BUNDLED.values()) + list(self._user)

    def get(self, id_or_path: str) -> ModelEntry:
        for entry in self.entries():
            if entry.id == id_or_path:
                return entry
        candidate = Path(id_or_path).expanduser()
        if candidate.exists() or os.sep in id_or_path or id_or_path.endswith(".gguf"):
            for entry in self._user:
                if Path(entry.path) == resolved(candidate):
                    return entry
            return self.add(candidate, persist=False)
        known = ", ".join(e.id for e in self.entries())
        raise ModelError(f"No model '{id_or_path}' in the catalog (known: {known}).")

    def add(self, path: str | Path, persist: bool = True) -> ModelEntry:
        path = resolved(path)
        info = inspect_path(path)
        for entry in self._user:
            if Path(entry.path) == path:
                return entry
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
        entry = ModelEntry(
            id=f"{_slug(info['name'])}-{digest}", name=info["name"], path=str(path),
            description=f"local {info['arch']} model", size_bytes=info["size"],
        )
        if persist:
            self._user.append(entry)
            self._save()
        return entry

    def remove(self, entry_id: str) -> None:
        if entry_id in BUNDLED:
            raise ModelError("Bundled models cannot be removed.")
        self._user = [e for e in self._user if e.id != entry_id]
        self._save()

    def _save(self) -> None:
        atomic_write_json(self.store, {"user": [asdict(e) for e in self._user]})

