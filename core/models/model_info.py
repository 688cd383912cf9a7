"""What a loaded target is (Targets → Model info…): architecture, size, how its
file is quantized, its context, its tokenizer, and how the drafter's vocabulary
maps onto it (the direct map of docs/method.md §1).

Imported by the GUI process too (the worker protocol carries ModelInfo): torch and
the loader are only imported inside describe(), which runs in the worker.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..kernels import build as kernels
from .gguf_header import read_header

if TYPE_CHECKING:
    from ..decoding.vocab_bridge import VocabBridge
    from .loader import LoadedModel


@dataclass(frozen=True)
class ModelInfo:
    model_id: str
    name: str
    architecture: str  # the model type, e.g. "qwen2"
    parameters: int
    quantization: str  # how the weights are stored on disk, e.g. "Q4_K_M GGUF file (weights 76% Q4_K, ...)"
    runs_as: str  # the weights' type in memory here, e.g. "bfloat16"
    context_length: int | None  # the model's own window (None: its config does not say)
    context_used: int  # the most tokens of a chat the app gives it (Engine.context_limit)
    tokenizer_size: int
    drafter: str | None = None  # the drafter's name; None while drafting is off
    drafter_vocab: int = 0
    same_vocabulary: bool = False
    direct_mapped: int = 0  # drafter tokens spelled like some target token (direct map)
    ngram_entries: int = 0  # learned drafter-run -> target-run entries (n-gram cache)

    @property
    def direct_share(self) -> float:
        """Share of the drafter's tokens that map directly onto a target token."""
        return self.direct_mapped / self.drafter_vocab if self.drafter_vocab else 0.0


def gguf_quantization(path: Path) -> str:
    """What a GGUF file declares (general.file_type, e.g. Q4_K_M) and what its
    weights are stored as: a Q4_K_M file keeps some tensors in other types (whole
    ones where a row is not a multiple of 256: most of Qwen2.5-0.5B is Q5_0)."""
    import gguf

    header = read_header(path)
    weight = Counter()
    for tensor in header.tensors:
        weight[gguf.GGMLQuantizationType(tensor.ggml_type).name] += tensor.n_elements
    total = sum(weight.values()) or 1
    shares = ", ".join(f"{n / total:.0%} {name}" for name, n in weight.most_common() if n / total >= 0.01)
    try:
        declared = gguf.LlamaFileType(int(header.metadata["general.file_type"])).name
        declared = declared.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (KeyError, ValueError, TypeError):
        declared = None
    label = f"{declared} GGUF file" if declared and declared != "GUESSED" else "GGUF file"
    return f"{label} (weights {shares})" if shares else label


def _stored_as(target: LoadedModel) -> str:
    """How the target's weights are stored where it was loaded from."""
    from .loader import source_path

    source = source_path(target.entry)
    if source.suffix.lower() == ".gguf":
        return gguf_quantization(source)
    config = target.model.config
    quantized = getattr(config, "quantization_config", None)
    if quantized:
        method = quantized.get("quant_method") if isinstance(quantized, dict) else quantized.quant_method
        return f"{method} (quantized safetensors)"
    dtype = getattr(config, "torch_dtype", None) or getattr(config, "dtype", None)
    return f"{str(dtype).removeprefix('torch.')} (not quantized)" if dtype else "not quantized"


def describe(
    target: LoadedModel, context_used: int, drafter: LoadedModel | None = None,
    bridge: VocabBridge | None = None,
) -> ModelInfo:
    """The loaded target, and its relation to the drafter when drafting is on (a
    drafter and the bridge built for this target)."""
    from .quantize import parameter_count

    model = target.model
    runtime = target.runner.net  # the lean runtime computes in its own dtype
    computes_in = str(runtime.dtype if runtime is not None else target.dtype).removeprefix("torch.")
    info = ModelInfo(
        model_id=target.entry.id,
        name=target.entry.name,
        architecture=model.config.model_type,
        parameters=parameter_count(model),
        quantization=_stored_as(target),
        runs_as=_runs_as(target, computes_in),
        context_length=getattr(model.config, "max_position_embeddings", None),
        context_used=context_used,
        tokenizer_size=len(target.tokenizer),
    )
    if drafter is None or bridge is None:
        return info
    return replace(
        info,
        drafter=drafter.entry.name,
        drafter_vocab=len(bridge.direct.drafter_bytes),
        same_vocabulary=bridge.same_vocab,
        direct_mapped=int((bridge.direct.to_target >= 0).sum()),
        ngram_entries=len(bridge.cache),
    )


def _runs_as(target: LoadedModel, computes_in: str) -> str:
    from .quantize import Int8Linear, quant_layer_count

    if not target.int8:
        return computes_in
    four, six, eight = (quant_layer_count(target.model, bits=bits) for bits in (4, 6, 8))
    if four or six or eight:
        sizes = ", ".join(f"{bits}-bit in {n}" for bits, n in ((6, six), (8, eight)) if n)
        sizes = f"4-bit weights in {four} layers" + (f", {sizes}" if sizes else "")
        rest = ", int8 in the rest" if any(isinstance(m, Int8Linear) for m in target.model.modules()) else ""
        return f"{sizes} (as in the file; {kernels.kernel_isa()} kernel){rest}, {computes_in} activations"
    why = kernels.unavailable() if target.entry.is_gguf else None
    return f"int8 weights, {computes_in} activations" + (f" ({why})" if why else "")
