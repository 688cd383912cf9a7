"""Linear layers whose weights stay in a GGUF quantized layout (layouts.py) and run
through the kernels' product (quant_mm), whose cost stays near one row's for the
k+1 rows a verification feeds it.

Why a kernel of our own (csrc/quant_gemm.c): the bytes a forward streams decide
the speed of decoding here, and an int8 target streams 1.5 GB per forward for
Qwen2.5-Coder-1.5B against ~1 GB in llama.cpp's Q4_K_M. torch 2.13's int4 kernel
(`_weight_int4pack_mm_for_cpu`) grows with the rows, and torchao's PyPI wheel
(0.18) ships CUDA kernels only, so no library gives a 4-bit product flat in the
rows on a desktop CPU (docs/performance.md).

QuantLinear is the module; its subclasses name the layout their weights are in
(Q4_1Linear, Q4_KLinear, Q6_KLinear, Q8_0Linear) and quant_linear() picks one for
a form. join() runs several layers of one input as one product.
"""

from __future__ import annotations

import torch

from .build import KernelUnavailable, library
from .layouts import Q4, Q4_1, Q4_K, Q4K, Q6, Q6_K, Q8, Q8_0


def quant_mm(rows: torch.Tensor, packed: torch.Tensor, out_features: int, kind: int,
             isa: str | None = None) -> torch.Tensor:
    """rows [m, k] @ W^T in float32, each row quantized to int8 on its own scale;
    W packed in layout `kind` (Q4_1, Q4_K, Q6_K or Q8_0: the form's .kind). isa: the
    kernel build to use, default the one in use (build.library)."""
    lib = library(isa)
    if isinstance(lib, KernelUnavailable):
        raise lib
    x = rows.float().contiguous()
    m, k = x.shape
    y = torch.empty(m, out_features, dtype=torch.float32)
    if lib.quant_gemm(kind, x.data_ptr(), m, k, packed.data_ptr(), out_features, y.data_ptr(), out_features,
                      torch.get_num_threads()):
        raise MemoryError("out of memory in the 4-bit kernel")
    return y


class QuantLinear(torch.nn.Module):
    """y = x W^T + b with W kept in a kernel layout (kind: Q4_1, Q4_K, Q6_K or Q8_0;
    bits: 4, 6 or 8 a weight); the subclasses name the layout."""

    layout: int | None = None  # a subclass's layout; it refuses a form of another

    def __init__(self, linear: torch.nn.Linear, quantized: Q4 | Q4K | Q6 | Q8):
        super().__init__()
        if self.layout is not None and quantized.kind != self.layout:
            raise TypeError(f"{type(self).__name__} takes layout {self.layout}, not {quantized.kind}")
        self._packed, self.kind, self.bits = quantized.packed(), quantized.kind, quantized.bits
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_count = linear.weight.numel()
        self.streamed = self._packed.numel()  # bytes one product reads
        bias = linear.bias
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().float(), requires_grad=False)

    @property
    def kernel_weights(self) -> tuple[torch.Tensor, int]:
        """(packed weights, layout): what stack.DecoderStack runs."""
        return self._packed, self.kind

    def place(self, packed: torch.Tensor) -> None:
        """Run from packed, a copy of the weights (huge_pages.gather)."""
        self._packed = packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = quant_mm(x.reshape(-1, self.in_features), self._packed, self.out_features, self.kind)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int{self.bits}"


class Q4_1Linear(QuantLinear):
    """W in 4 bits per group of 32 with an fp16 scale and offset (Q4_1's form: fit's,
    the drafter's)."""

    layout = Q4_1


class Q4_KLinear(QuantLinear):
    """W as a Q4_K tensor holds it (Q4K): 4 bits, 6-bit scales and mins per 32,
    fp16 d and dmin per 256."""

    layout = Q4_K


class Q6_KLinear(QuantLinear):
    """W in 6 bits as a Q6_K tensor holds it (Q6); a Q5_0 tensor's weights come here
    too, exactly (layouts.read_q5_0)."""

    layout = Q6_K


class Q8_0Linear(QuantLinear):
    """W in 8 bits per group of 32, as a Q8_0 tensor holds it (Q8): unlike
    quantize.Int8Linear's per-channel int8, the file's own weights, and a layer the
    decoder stack runs."""

    layout = Q8_0


_BY_LAYOUT = {cls.layout: cls for cls in (Q4_1Linear, Q4_KLinear, Q6_KLinear, Q8_0Linear)}


def quant_linear(linear: torch.nn.Linear, quantized: Q4 | Q4K | Q6 | Q8) -> QuantLinear:
    """The linear layer with the weights read from its file or rounded (layouts.fit),
    as its layout's QuantLinear."""
    return _BY_LAYOUT[quantized.kind](linear, quantized)


def join(layers: list[QuantLinear]):
    """One product for several quantized layers of the same input and layout (a
    target's q/k/v, its gate/up): their packed weights laid end to end, each layer keeping a view
    of its part, so no second copy exists. Output channels are computed
    independently from the same int8 rows, so each part of the result is, bit for
    bit, what its layer computes alone; one call instead of several saves the
    activations' quantization and a kernel launch per layer."""
    packed = torch.cat([layer._packed for layer in layers])
    start = 0
    for layer in layers:
        rows = layer._packed.shape[0]
        layer._packed = packed[start : start + rows]
        start += rows
    biases = [layer.bias for layer in layers]
    bias = None if all(b is None for b in biases) else torch.cat(
        [b.detach() if b is not None else torch.zeros(layer.out_features) for b, layer in zip(biases, layers)])
    if len({layer.kind for layer in layers}) > 1:
        raise ValueError("join takes layers of one layout")
    return Joined(packed, layers[0].kind, layers[0].in_features, sum(layer.out_features for layer in layers), bias,
                  layers)


class Joined:
    """Several quantized layers of one input as one product (join); members: the
    layers, each viewing its part of packed."""

    def __init__(self, packed: torch.Tensor, kind: int, in_features: int, out_features: int,
                 bias: torch.Tensor | None, members: list[QuantLinear] = ()):
        self.kernel_weights = packed, kind
        self.in_features, self.out_features, self.bias = in_features, out_features, bias
        self.members = list(members)

    def place(self, packed: torch.Tensor) -> None:
        """Run from packed, a copy of the weights (huge_pages.gather); the members
        view their parts of it."""
        self.kernel_weights = packed, self.kernel_weights[1]
        start = 0
        for layer in self.members:
            rows = layer._packed.shape[0]
            layer.place(packed[start : start + rows])
            start += rows

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        packed, kind = self.kernel_weights
        y = quant_mm(x.reshape(-1, self.in_features), packed, self.out_features, kind)
        return y if self.bias is None else y + self.bias
