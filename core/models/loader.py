"""Loading catalog entries into (model, tokenizer), via a cached safetensors copy.

transformers de-quantizes a GGUF file in 30-90 s here; we do it once and keep a
bf16 safetensors copy in the user cache dir, which later loads in well under 5 s.
A copy is written into a temporary folder and renamed into place only when
complete, so a conversion killed half-way is never mistaken for a good cache.
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..kernels.build import unavailable as kernels_unavailable
from ..storage import paths
from ..storage.persistence import partial_path, remove_stale_partials
from . import converted_cache
from .bundled_models import Progress, gemma_terms_files, no_progress
from .catalog import GEMMA_ID, ModelEntry, ModelError, bundled_path, inspect_path
from .lean_llama import supports as lean_supports
from .quantize import FourBit, k_quant_reader, quantize_int8
from .target_runtime import TargetRunner

_COMPLETE = converted_cache.MARKER
CONVERTED_FORMAT = 1


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


def _cache_key(gguf: Path) -> str:
    st = gguf.stat()
    token = f"{gguf.resolve()}|{st.st_size}|{int(st.st_mtime)}|{CONVERTED_FORMAT}"
    return hashlib.sha1(token.encode()).hexdigest()[:12]


def converted_dir(entry: ModelEntry, gguf: Path) -> Path:
    return paths.cache_dir() / "models" / f"{entry.id}-{_cache_key(gguf)}"


def is_complete(folder: Path) -> bool:
    return (folder / _COMPLETE).exists()


def convert_gguf(entry: ModelEntry, gguf: Path, progress: Progress = no_progress) -> Path:
    """De-quantize a GGUF file once into a bf16 safetensors folder; returns the folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    dest = converted_dir(entry, gguf)
    if converted_cache.usable(dest, gguf.name, progress):  # a damaged copy is removed
        return dest
    # Anything here without the completion marker is a half-written cache: rebuild it.
    shutil.rmtree(dest, ignore_errors=True)
    remove_stale_partials(dest)  # this process's own earlier attempt included
    tmp = partial_path(dest)
    progress(f"Converting {gguf.name} (first use only)", 0.35)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        progress("De-quantizing weights", 0.45)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent),
            gguf_file=gguf.name,
            dtype=torch.bfloat16,
            quantization_config=GgufConfig(dequantize=True),
        )
    except Exception as exc:
        raise ModelError(f"{gguf.name} could not be loaded as a model: {exc}") from exc
    progress("Saving converted copy", 0.85)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if entry.id == GEMMA_ID:
        for terms in gemma_terms_files():
            shutil.copy2(terms, tmp / terms.name)
    converted_cache.seal(tmp, gguf, CONVERTED_FORMAT)
    converted_cache.publish(tmp, dest, gguf.name)
    progress("Converted", 0.95)
    return dest


def weights_folder(entry: ModelEntry, progress: Progress = no_progress) -> Path:
    src = source_path(entry, progress)
    if not entry.bundled:
        inspect_path(src)  # the file may have changed or vanished since it was added
    if src.suffix.lower() == ".gguf":
        return convert_gguf(entry, src, progress)
    return src


def _four_bit(entry: ModelEntry, model) -> FourBit | None:
    """Where the target's 4-, 6- and 8-bit layers come from: its GGUF file's
    K-quant tensors (and Q5_0 and Q8_0 ones for a Llama or Qwen2 model), when
    the kernels run on this machine (core/kernels/)."""
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
) -> LoadedModel:
    """Load a catalog entry for inference, its linear layers in int8 if asked, and
    then (int4) a GGUF file's Q4_K ones in 4 bits where this machine runs the
    4-bit kernel. Raises ModelError with a readable message."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    folder = weights_folder(entry, progress)
    progress(f"Loading {entry.name}", 0.96)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True)
    except Exception as exc:
        raise ModelError(f"{entry.name} could not be loaded: {exc}") from exc
    model.eval()
    if int8:
        progress(f"Quantizing {entry.name}", 0.962)
        quantize_int8(model, _four_bit(entry, model) if int4 else None)
    # Not 1.0: the engine still loads the drafter and measures the target after this.
    progress(f"{entry.name} loaded", 0.965)
    return LoadedModel(entry, model, tokenizer, time.perf_counter() - start, int8)
