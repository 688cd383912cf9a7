"""A Llama-family decoder stack run as one kernel call (csrc/decoder_stack.c): the
drafter's forward and a GGUF target's, without torch's per-op overhead between the
products (what that overhead costs a token: docs/performance.md).

The call takes one StackParams struct, laid out as decoder_stack.c's, whose abi
field is build.KERNEL_ABI; the library refuses a struct of another version, and
build.bind refuses a library of another version at load.
"""

from __future__ import annotations

import ctypes

import torch

from .build import KERNEL_ABI, KernelABIMismatch, KernelUnavailable, library

# decoder_stack's return code for a StackParams of another interface version
# (csrc/quant_gemm.h's STACK_WRONG_ABI); -1: out of memory.
_WRONG_ABI = -2


class _Projection(ctypes.Structure):
    _fields_ = [("packed", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("out", ctypes.c_int64),
                ("kind", ctypes.c_int64), ("lora_a", ctypes.c_void_p), ("lora_b", ctypes.c_void_p),
                ("part_end", ctypes.c_void_p), ("parts", ctypes.c_int64), ("rank", ctypes.c_int64)]


class _Layer(ctypes.Structure):
    _fields_ = [("norm1", ctypes.c_void_p), ("norm2", ctypes.c_void_p), ("qkv", _Projection * 3),
                ("o", _Projection), ("gate_up", _Projection * 2), ("down", _Projection)]


class _StackParams(ctypes.Structure):
    """decoder_stack.c's StackParams: the call's arguments, abi first."""

    _fields_ = [("abi", ctypes.c_int64), ("x", ctypes.c_void_p), ("n", ctypes.c_int64), ("needed", ctypes.c_int64),
                ("start", ctypes.c_int64), ("layers", ctypes.c_void_p), ("n_layers", ctypes.c_int64),
                ("kv", ctypes.c_void_p), ("capacity", ctypes.c_int64), ("cos", ctypes.c_void_p),
                ("sin", ctypes.c_void_p), ("hidden", ctypes.c_int64), ("n_heads", ctypes.c_int64),
                ("n_kv", ctypes.c_int64), ("head_dim", ctypes.c_int64), ("inter", ctypes.c_int64),
                ("eps", ctypes.c_float), ("final_norm", ctypes.c_void_p), ("threads", ctypes.c_int),
                ("window", ctypes.c_int64)]


def runs_in_stack(projection) -> bool:
    """Whether DecoderStack can run this projection (a list: parts side by side)."""
    parts = projection if isinstance(projection, list | tuple) else [projection]
    return all(getattr(p, "kernel_weights", None) is not None for p in parts)


class DecoderStack:
    """A Llama-family decoder stack whose projections are all in kernel layouts
    (linear.QuantLinear's, linear.Joined's), run as one kernel call
    (decoder_stack.c). layers: per layer (norm1, qkv, o, norm2, gate_up, down); qkv
    may be a list of up to 3 parts side by side, gate_up of up to 2. Each part has .kernel_weights ((packed weights, layout), as
    linear.QuantLinear's), .bias (or None), .out_features and optionally .low_rank (a
    learned adapter beside the weight: a [parts*r, in], b^T [r, out], both fp16,
    each part's end among the outputs); final_norm: the model's, applied to the
    rows read. The tensors are used in place, not copied."""

    kv_dtype = torch.float16  # the cache's (decoder_stack.c)

    def __init__(self, layers: list[tuple], n_heads: int, n_kv: int, head_dim: int, eps: float,
                 final_norm: torch.Tensor | None = None):
        self.n_heads, self.n_kv, self.head_dim, self.eps = n_heads, n_kv, head_dim, eps
        self._keep = []  # the tensors the structs point into

        def ptr(t: torch.Tensor | None) -> int | None:
            if t is None:
                return None
            t = t.detach().contiguous()
            self._keep.append(t)
            return t.data_ptr()

        def projection(p) -> _Projection:
            packed, kind = p.kernel_weights
            bias = None if p.bias is None else p.bias.float()
            low_rank = getattr(p, "low_rank", None)
            if low_rank is None:
                return _Projection(ptr(packed), ptr(bias), p.out_features, kind)
            a, b, ends = low_rank
            return _Projection(ptr(packed), ptr(bias), p.out_features, kind, ptr(a), ptr(b),
                               ptr(ends.to(torch.int64)), len(ends), b.shape[0])

        def parts(p, most: int):
            p = list(p) if isinstance(p, list | tuple) else [p]
            if len(p) > most:
                raise ValueError(f"a projection in more than {most} parts")
            return (_Projection * most)(*map(projection, p))

        self._final_norm = ptr(None if final_norm is None else final_norm.float())
        self._layers = (_Layer * len(layers))(*[
            _Layer(ptr(n1.float()), ptr(n2.float()), parts(qkv, 3), projection(o), parts(gu, 2), projection(down))
            for n1, qkv, o, n2, gu, down in layers])
        self._layers_at = ctypes.addressof(self._layers)
        self.hidden = layers[0][0].numel()
        gate_up = layers[0][4] if isinstance(layers[0][4], list | tuple) else [layers[0][4]]
        self.inter = sum(p.out_features for p in gate_up) // 2

    def __call__(self, x: torch.Tensor, start: int, kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 needed: int | None = None, window: int = 0) -> None:
        """x [n, hidden] float32 (the embeddings of positions start..) becomes, in
        place, the last layer's residual stream in its last `needed` rows (None: all;
        the other rows are left partway), through the final norm where the stack was
        given one; the new keys and values of every row go into kv [layers, 2, kv
        heads, capacity, head_dim] (fp16, contiguous). window: 0, or a query reads
        only the first 256 positions and the 256-position parts holding its last
        `window` (LeanLlama.window)."""
        lib = library()
        if isinstance(lib, KernelUnavailable):
            raise lib
        # The kernel reads raw memory: any other dtype would be read as garbage.
        if not all(t.dtype == torch.float32 and t.is_contiguous() for t in (x, cos, sin)) or \
                kv.dtype != self.kv_dtype or not kv.is_contiguous():
            raise TypeError("the decoder stack takes contiguous float32 tensors and an fp16 cache")
        if cos.shape[0] < kv.shape[3] or x.shape[1] != self.hidden:
            raise ValueError("the decoder stack got tensors of the wrong shape")
        n = x.shape[0]
        needed = n if needed is None else min(max(needed, 0), n)
        params = _StackParams(KERNEL_ABI, x.data_ptr(), n, needed, start,
                              self._layers_at, len(self._layers), kv.data_ptr(),
                              kv.shape[3], cos.data_ptr(), sin.data_ptr(), self.hidden, self.n_heads, self.n_kv,
                              self.head_dim, self.inter, self.eps, self._final_norm, torch.get_num_threads(),
                              window)
        done = lib.decoder_stack(ctypes.byref(params))
        if done == _WRONG_ABI:
            raise KernelABIMismatch(f"the kernel library refused the decoder stack's arguments of interface "
                                    f"version {KERNEL_ABI}")
        if done:
            raise MemoryError("out of memory in the 4-bit decoder stack")
