"""Quantized target weights: int8 linear layers whose cost stays flat in the rows verified.

Why this format (python -m omnidraft.tools.speed_floor; git show 524cea4:docs/results/speed-floor.json; 2 threads
here): per 220 MB of bf16-equivalent weight, fbgemm's int8 GEMM with dynamically
quantized activations costs 3.5 / 2.9 / 3.0 / 3.0 / 3.3 ms for 1 / 2 / 3 / 5 / 8
rows, against 10.3-11.9 ms in bf16 and, for weight-only int4, 3.1 ms for one row
but 10.7 ms for five. It is the only kernel both ~3x cheaper than bf16 and flat in
the k+1 rows a speculative verification feeds it, which is what the method needs.

Rows stay independent: fbgemm quantizes its whole input with one scale, so a
verified token's result would depend on the other tokens verified beside it, and
speculative decoding would drift from plain decoding of the same weights. Each row
is divided by its own absolute maximum (so every row lies in [-1, 1]) and one
anchor row holding -1 and +1 is appended, so the input's range, hence its
quantization, is always exactly [-1, 1] whatever else is in the batch; the integer
products are exact, so a row's output no longer depends on its neighbours.
"""

from __future__ import annotations

import functools
import mmap
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from ..kernels import layouts
from ..kernels.linear import QuantLinear, quant_linear
from .gguf_header import read_header

# Linear layers below this size stay as they are: for them the per-call work of
# quantizing the activations costs more than the bytes saved.
MIN_WEIGHTS = 1 << 16


def pack_int8(weight: torch.Tensor):
    """A [out, in] float weight as fbgemm's packed per-output-channel symmetric int8."""
    w = weight.detach().float()
    scales = (w.abs().amax(1) / 127).clamp(min=1e-12).double()
    zeros = torch.zeros(w.shape[0], dtype=torch.int64)
    with warnings.catch_warnings():  # torch 2.13 marks quantized tensors deprecated
        warnings.simplefilter("ignore", UserWarning)
        qweight = torch.quantize_per_channel(w, scales, zeros, axis=0, dtype=torch.qint8)
    return torch.ops.quantized.linear_prepack(qweight, None)


@functools.cache
def _anchor(width: int) -> torch.Tensor:
    """The row that pins the quantizer's range to exactly [-1, 1]."""
    anchor = torch.zeros(1, width)
    anchor[0, 0], anchor[0, -1] = -1.0, 1.0
    return anchor


def int8_mm(rows: torch.Tensor, packed) -> torch.Tensor:
    """rows [n, in] @ W^T in float32, each row quantized on its own scale (see above)."""
    rows = rows.float()
    scale = rows.abs().amax(1, keepdim=True).clamp(min=1e-30)
    # reduce_range: 7-bit activations, which cannot overflow AVX2's 16-bit pair sums.
    return torch.ops.quantized.linear_dynamic(torch.cat([rows / scale, _anchor(rows.shape[-1])]), packed, True)[:-1] * scale


class Int8Linear(torch.nn.Module):
    """y = x W^T + b with W stored as per-output-channel symmetric int8."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self._packed = pack_int8(linear.weight)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_count = linear.weight.numel()  # one byte each once packed
        bias = linear.bias
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = int8_mm(x.reshape(-1, self.in_features), self._packed)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


FourBit = Callable[[str, torch.Tensor], "tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None"]


def quantize_int8(model: torch.nn.Module, four_bit: FourBit | None = None) -> int:
    """Replace the model's large linear layers (its LM head included) in place;
    returns how many were replaced. The float weights are freed as each goes.
    four_bit(module name, weight): a layer's 4-, 6- or 8-bit form (kernels.linear.quant_linear), or
    None for int8 (see k_quant_reader)."""
    replaced = 0
    for prefix, module in list(model.named_modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear and child.weight.numel() >= MIN_WEIGHTS:
                four = four_bit(f"{prefix}.{name}" if prefix else name, child.weight) if four_bit else None
                setattr(module, name, quant_linear(child, four) if four else Int8Linear(child))
                replaced += 1
    if getattr(model.config, "tie_word_embeddings", False):
        # The input embeddings keep their float table; the head now has its own int8 copy.
        model.config.tie_word_embeddings = False
    return replaced


def k_quant_reader(gguf: Path, stack: bool = False) -> FourBit:
    """The layers of the model loaded from this GGUF file that it stores as Q4_K or
    Q6_K, in the kernels' form (kernels.layouts); None for the others, and for a tensor not
    stored as the loaded weight (see layouts.matches).
    stack: the model's layers can run as one kernel call (a Llama or Qwen2 model,
    LeanLlama's). Then Q5_0 layers take the 6-bit form too (exactly) and Q8_0
    ones (a Q5_0 file's v projections and LM head) their own 8-bit form, so the
    whole stack runs as one call rather than on torch ops: Qwen2.5-Coder-0.5B
    ~2x faster (git show 524cea4:docs/speed.md). A model on transformers' forward (Gemma 3) keeps
    int8 for them: its plain steps got 7-11% faster with Q5_0 in 6 bits, but its
    drafted replies' tokens/s fell 4-6% on the changed replies' acceptance."""
    tensors = {t.name: t for t in read_header(gguf).tensors}
    with open(gguf, "rb") as f:
        buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    readers = {layouts.Q4_K: layouts.read_q4_k, layouts.Q6_K: layouts.read_q6_k}
    if stack:
        readers |= {layouts.Q5_0: layouts.read_q5_0, layouts.Q8_0: layouts.read_q8_0}

    def read(module_name: str, weight: torch.Tensor):
        tensor = tensors.get(layouts.gguf_name(module_name) or "")
        if tensor is None or tensor.ggml_type not in readers or len(tensor.dims) != 2:
            return None
        k, n = tensor.dims
        if n % layouts.CHANNELS:
            return None
        quantized = readers[tensor.ggml_type](buffer, tensor.offset, n, k)
        return quantized if layouts.matches(weight, quantized) else None

    return read


def streamed_bytes(model: torch.nn.Module) -> int:
    """Weight bytes one forward reads: every linear layer's (int8 ones at one byte a
    weight), not the embedding table, of which a forward reads a few rows. Divided
    by the memory bandwidth (python -m omnidraft.tools.speed_floor) it is the forward's floor."""
    total = 0
    for m in model.modules():
        if isinstance(m, QuantLinear):
            total += m.streamed
        elif isinstance(m, Int8Linear):
            total += m.weight_count
        elif isinstance(m, torch.nn.Linear):
            total += m.weight.numel() * m.weight.element_size()
    return total


def parameter_count(model: torch.nn.Module) -> int:
    """Weights of the model as published: its parameters plus the packed ones (int8
    and kernel layers, a token table kept in its GGUF blocks: weight_count)."""
    packed = sum(getattr(m, "weight_count", 0) for m in model.modules())
    return packed + sum(p.numel() for p in model.parameters())


def is_quantized(model: torch.nn.Module) -> bool:
    return any(isinstance(m, (Int8Linear, QuantLinear)) for m in model.modules())


def quant_layer_count(model: torch.nn.Module, bits: int = 4) -> int:
    """How many linear layers hold weights in a kernel layout of `bits` bits (4, 6, 8)."""
    return sum(isinstance(m, QuantLinear) and m.bits == bits for m in model.modules())
