"""Loading catalog entries into (model, tokenizer).

A GGUF file loads straight from its own blocks (core/models/gguf_model.py): no
de-quantized copy on disk, no full-precision model in memory. A target's large
linear layers go into the kernels' layouts from the file (int8 for the types
the kernels do not take), its token table stays in the file's blocks, and only
the small tensors are de-quantized, one at a time. The drafter (int8=False) is
materialised in float one tensor at a time, for the learner's LoRA training. A
Hugging Face folder loads with transformers, then (int8) its layers are
quantized.

Earlier versions kept a de-quantized bf16 copy of each GGUF file in
cache/models; the first load removes that folder (remove_converted_copies).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ..kernels import layouts
from ..kernels.build import unavailable as kernels_unavailable
from ..stopping import ShouldStop, never
from ..storage import paths
from ..storage.persistence import DiskFullError, disk_full_message, is_disk_full
from .bundled_models import Progress, no_progress
from .catalog import ModelEntry, ModelError, bundled_path, inspect_path
from .lean_llama import supports as lean_supports
from .quantize import FourBit, k_quant_reader, quantize_int8
from .target_runtime import TargetRunner

log = logging.getLogger(__name__)


class LoadCancelled(ModelError):
    """load() stopped because its should_stop() said so. A ModelError, so a caller
    that only handles those still shows a sentence; one that asked for the stop
    catches this first and says nothing (it was not a failure). Nothing of the
    half-loaded model is kept."""

    def __init__(self, name: str):
        super().__init__(f"Loading {name} was cancelled.")


@dataclass
class LoadedModel:
    entry: ModelEntry
    model: torch.nn.Module
    tokenizer: object  # a transformers PreTrainedTokenizerBase
    load_seconds: float
    int8: bool = False  # linear layers quantized (core/models/quantize.py)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @functools.cached_property
    def runner(self) -> TargetRunner:
        """How the decode loops run it as a target (core/models/target_runtime.py)."""
        return TargetRunner(self.model)


def source_path(entry: ModelEntry, progress: Progress = no_progress) -> Path:
    if entry.bundled:
        progress("Preparing bundled model file", 0.0)
        return bundled_path(entry.id, progress)
    return Path(entry.path)


def converted_copies() -> Path:
    """Where earlier versions kept de-quantized copies of GGUF files."""
    return paths.cache_dir() / "models"


def remove_converted_copies() -> bool:
    """Delete the de-quantized copies an earlier version left (3.6 GB for the
    default target); True when there were some. Nothing reads them any more."""
    folder = converted_copies()
    if not folder.exists() and not folder.is_symlink():
        return False
    if folder.is_symlink() or not folder.is_dir():
        folder.unlink()
    else:
        shutil.rmtree(folder, ignore_errors=True)
    log.info("removed the converted model copies in %s", folder)
    return True


def kernel_readers(config, int4: bool = True) -> dict:
    """The GGUF types a target's layers are read as, into the kernels' layouts
    (quantize.k_quant_reader says why these): Q4_K and Q6_K, and Q5_0 and Q8_0 for
    a model that runs lean (Llama, Qwen2); none where the kernels do not run."""
    if not int4 or kernels_unavailable() is not None:
        return {}
    readers = {layouts.Q4_K: layouts.read_q4_k, layouts.Q6_K: layouts.read_q6_k}
    if lean_supports(config) is None:
        readers |= {layouts.Q5_0: layouts.read_q5_0, layouts.Q8_0: layouts.read_q8_0}
    return readers


def _four_bit(entry: ModelEntry, model) -> FourBit | None:
    """A Hugging Face folder's layers have no file blocks to read: int8. (Tests
    hand a reader here to build 4-bit targets from folders.)"""
    src = source_path(entry)
    if src.suffix.lower() != ".gguf" or kernels_unavailable() is not None:
        return None
    return k_quant_reader(src, stack=lean_supports(model.config) is None)


def load(
    entry: ModelEntry,
    dtype: torch.dtype = torch.bfloat16,
    progress: Progress = no_progress,
    int8: bool = False,
    int4: bool = True,
    should_stop: ShouldStop = never,
) -> LoadedModel:
    """Load a catalog entry for inference. int8: a target, its linear layers in
    the kernels' layouts (a GGUF file's Q4_K/Q6_K/... blocks, int4) or int8;
    otherwise every weight in `dtype` (the drafter, which learning trains).
    should_stop() is checked between tensors: LoadCancelled when it says so.
    Raises ModelError with a readable message."""
    start = time.perf_counter()

    def check() -> None:
        if should_stop():
            raise LoadCancelled(entry.name)

    check()
    src = source_path(entry, progress)
    if not entry.bundled:
        inspect_path(src)  # the file may have changed or vanished since it was added
    if remove_converted_copies():
        progress("Removed the converted model copies an earlier version kept", 0.3)
    check()
    progress(f"Loading {entry.name}", 0.5)
    try:
        if src.suffix.lower() == ".gguf":
            model, tokenizer = _load_gguf(src, dtype, int8, int4, check)
        else:
            model, tokenizer = _load_folder(entry, src, dtype, int8, int4, check)
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"{entry.name} could not be loaded: {exc}") from exc
    _give_back_freed_memory()
    # Not 1.0: the engine still loads the drafter and measures the target after this.
    progress(f"{entry.name} loaded", 0.965)
    return LoadedModel(entry, model, tokenizer, time.perf_counter() - start, int8)


def _give_back_freed_memory() -> None:
    """Return the load's freed temporaries (blocks read, weights de-quantized one
    at a time) to the system: glibc keeps freed heap pages in the process, where
    they count as its memory until something reuses them."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, Windows, musl): nothing to do
        pass


def _load_gguf(src: Path, dtype: torch.dtype, int8: bool, int4: bool, check) -> tuple:
    from .gguf_model import build

    return build(src, dtype, int8, lambda config: kernel_readers(config, int4), check)


def _load_folder(entry: ModelEntry, folder: Path, dtype: torch.dtype, int8: bool, int4: bool, check) -> tuple:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True)
    model.eval()
    check()
    if int8:
        quantize_int8(model, _four_bit(entry, model) if int4 else None)
    return model, tokenizer


def load_failure(entry: ModelEntry, exc: BaseException) -> str:
    """What a person reads when a model does not load: a full disk with the space
    the load writes, a damaged model with what to do about it."""
    if is_disk_full(exc):
        failed = next((e for e in _chain(exc) if isinstance(e, DiskFullError)), None)
        folder = failed.path.parent if failed else paths.cache_dir()
        return disk_full_message(f"loading {entry.name}", folder, failed.needed if failed else _file_bytes(entry),
                                 "The model loaded before stays; free some space and choose it again.")
    if isinstance(exc, ModelError) and exc.__cause__ is None:
        return str(exc)  # written for people already
    advice = ("Reinstalling the app restores its bundled models." if entry.bundled else
              "Remove it from the model list, or add a fresh copy of it.")
    return (f"{entry.name} could not be loaded: its files are damaged or in a form this app "
            f"cannot read. {advice}")


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    for _ in range(16):  # a failure and what it was raised from
        if exc is None:
            return
        yield exc
        exc = exc.__cause__ or exc.__context__


def _file_bytes(entry: ModelEntry) -> int:
    """What a load may write beside the model (prepared tokenizer and kernel files)
    is at most about the size of its file: the figure a full disk is told of."""
    try:
        return entry.size_bytes or os.path.getsize(entry.path)
    except OSError:
        return 0
