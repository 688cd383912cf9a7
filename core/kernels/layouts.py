"""The GGUF quantized layouts the kernels run (Q4_1's form, Q4_K, Q6_K, Q8_0, and
Q5_0 read onto Q6_K's grid), read from a file's bytes or fitted to any weight, and
packed into the kernels' column layout (csrc/quant_gemm.c).

Which tensors: a target's layers its GGUF file stores as Q4_K or Q6_K, read from
the file and checked against the loaded weight (read_q4_k, read_q6_k, matches),
and for a Llama or Qwen2 model its Q5_0 and Q8_0 ones too (read_q5_0: 5 bits sit
exactly on the 6-bit grid; read_q8_0), so a Q5_0 file's layers run as one call;
anything else (float models, other formats) stays int8, so these formats never
cost a target accuracy the file did not already have. Q6_K tensors (half the
layers' v and down projections and the LM head of a Q4_K_M file) take the 6-bit
kernel, so a Q4_K_M target's decoder stack runs as one kernel call as the
drafter's does (stack.DecoderStack) instead of torch ops between products. The
drafter's projections are rounded to 4 bits (fit), where only acceptance depends
on the rounding.

Each form (Q4: Q4_1's scale and offset per 32, fit's; Q4K; Q6; Q8) packs itself
into its kernel layout and names it by its GGML type (kind). Q4_K keeps the
file's superblocks (fp16 d and dmin per 256 inputs, 6-bit sc and m per 32) rather
than an fp16 scale per group: exact, 7.5% fewer bytes, and one float step per 256
inputs instead of per 32 in the kernel. What each layout costs a forward:
docs/performance.md.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

GROUP = 32  # inputs per 4-bit sub-scale and min
SUPER = 256  # inputs per superblock: one fp16 d and dmin (a Q4_K block)
CHANNELS = 16  # output channels per block
Q6_PART = 16  # inputs per 6-bit scale

# The kernels' layouts, numbered as gguf.GGMLQuantizationType numbers the
# quantization each holds (quant_gemm.h): Q4_1's form (4 bits in groups of 32 with
# an fp16 scale and offset: fit's, and so the drafter's), Q4_K's, Q6_K's and
# Q8_0's; Q5_0 is a file's type only, read into Q6_K's layout (read_q5_0).
Q4_1 = 3
Q5_0 = 6
Q8_0 = 8
Q4_K = 12
Q6_K = 14
_Q5_0_BLOCK = 22  # bytes per 32 weights: d (fp16), 32 high bits, 16 bytes of low nibbles
_Q8_0_BLOCK = 34  # bytes per 32 weights: d (fp16), 32 int8
_Q4_K_BLOCK = 144  # bytes per 256 weights: d, dmin (fp16), 12 bytes of 6-bit scales/mins, 128 of nibbles
_Q6_K_BLOCK = 210  # bytes per 256 weights: 128 of low nibbles, 64 of high bit pairs, 16 int8 scales, d (fp16)
# Module names of a Llama-family decoder layer and their GGUF tensor names.
GGUF_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
              "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def gguf_name(module_name: str) -> str | None:
    """model.layers.3.mlp.down_proj -> blk.3.ffn_down.weight, lm_head -> output.weight
    (None: neither)."""
    if module_name == "lm_head":
        return "output.weight"
    parts = module_name.split(".")
    if len(parts) < 4 or parts[-4] != "layers" or parts[-1] not in GGUF_NAMES:
        return None
    return f"blk.{parts[-3]}.{GGUF_NAMES[parts[-1]]}.weight"


def read_q4_k(buffer, offset: int, n: int, k: int) -> Q4K:
    """A Q4_K tensor [n, k] from a GGUF file's bytes, exactly (llama.cpp's
    ggml-quants.c; gguf.quants.Q4_K reads it the same way): per 256 weights d and
    dmin, per 32 a 6-bit sc and m, w = d * sc * q - dmin * m."""
    import numpy as np
    from gguf.quants import Q4_K as GGUF_Q4_K

    blocks = np.frombuffer(buffer, dtype=np.uint8, count=n * k // 256 * _Q4_K_BLOCK, offset=offset)
    blocks = blocks.reshape(-1, _Q4_K_BLOCK)
    d = blocks[:, 0:2].copy().view(np.float16)
    dmin = blocks[:, 2:4].copy().view(np.float16)
    sc, m = GGUF_Q4_K.get_scale_min(blocks[:, 4:16].copy())
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (qs & np.uint8(0x0F)).reshape(n, k)
    return Q4K(torch.from_numpy(q.copy()), torch.from_numpy(d.reshape(n, -1).copy()),
              torch.from_numpy(dmin.reshape(n, -1).copy()), torch.from_numpy(sc.reshape(n, -1).astype(np.uint8)),
              torch.from_numpy(m.reshape(n, -1).astype(np.uint8)))


def read_q6_k(buffer, offset: int, n: int, k: int) -> Q6:
    """A Q6_K tensor [n, k] from a GGUF file's bytes (gguf.quants.Q6_K reads it the
    same way): per 256 weights d and, per 16, an int8 sc; w = d * sc * (q - 32).
    d * sc is rounded to fp16 (2^-11 relative, finer than the bf16 copy loaded)."""
    import numpy as np

    blocks = np.frombuffer(buffer, dtype=np.uint8, count=n * k // 256 * _Q6_K_BLOCK, offset=offset)
    blocks = blocks.reshape(-1, _Q6_K_BLOCK)
    low = blocks[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    high = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    q = (low & np.uint8(0x0F)).reshape(-1, 256) | ((high & np.uint8(0x03)).reshape(-1, 256) << np.uint8(4))
    d = blocks[:, 208:210].copy().view(np.float16).astype(np.float32)
    scale = d * blocks[:, 192:208].copy().view(np.int8).astype(np.float32)
    return Q6(torch.from_numpy(q.reshape(n, k).copy()), torch.from_numpy(scale.reshape(n, -1)).half())


def read_q5_0(buffer, offset: int, n: int, k: int) -> Q6:
    """A Q5_0 tensor [n, k] (w = d * (q - 16), q 0..31, d fp16 per 32 inputs) in the
    6-bit form, exactly: q + 16 on Q6_K's grid, d as both of its 16-input scales.
    (A 5-bit layout of its own would stream 21% fewer bytes; this one needs no
    kernel of its own and lets a Q5_0 model's layers run as one call.)"""
    import numpy as np

    blocks = np.frombuffer(buffer, dtype=np.uint8, count=n * k // 32 * _Q5_0_BLOCK, offset=offset)
    blocks = blocks.reshape(-1, _Q5_0_BLOCK)
    d = blocks[:, 0:2].copy().view(np.float16)
    high = blocks[:, 2:6].copy().view(np.uint32) >> np.arange(32, dtype=np.uint32)
    low = blocks[:, 6:].reshape(-1, 1, 16) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)
    q = (low & np.uint8(0x0F)).reshape(-1, 32) | ((high & np.uint32(1)).astype(np.uint8) << np.uint8(4))
    scale = np.repeat(d, 2, axis=1)  # [blocks, 2]: one per 16 inputs
    return Q6(torch.from_numpy((q + np.uint8(16)).reshape(n, k)), torch.from_numpy(scale.reshape(n, -1).copy()))


def read_q8_0(buffer, offset: int, n: int, k: int) -> Q8:
    """A Q8_0 tensor [n, k]: w = d * q, q int8, d fp16 per 32 inputs."""
    import numpy as np

    blocks = np.frombuffer(buffer, dtype=np.uint8, count=n * k // 32 * _Q8_0_BLOCK, offset=offset)
    blocks = blocks.reshape(-1, _Q8_0_BLOCK)
    d = blocks[:, 0:2].copy().view(np.float16)
    q = blocks[:, 2:].copy().view(np.int8)
    return Q8(torch.from_numpy(q.reshape(n, k)), torch.from_numpy(d.reshape(n, -1)))


# Bytes a row of n weights takes in a file's layout, per weight type: (weights, bytes) a block.
_FILE_BLOCKS = {Q4_K: (256, _Q4_K_BLOCK), Q6_K: (256, _Q6_K_BLOCK), Q5_0: (32, _Q5_0_BLOCK), Q8_0: (32, _Q8_0_BLOCK)}
# Weights read and packed at a time (read_packed), in whole rows: unpacking a 7B's
# whole output matrix (545M weights) held ~2.5 GB of temporaries at once, its load's peak.
PACK_WEIGHTS = 1 << 25


class Packed(NamedTuple):
    """Weights already in the kernel's layout (read_packed); a form like the others
    to QuantLinear."""

    data: torch.Tensor
    kind: int
    bits: int

    def packed(self) -> torch.Tensor:
        return self.data


def read_packed(read, file_type: int, buffer, offset: int, n: int, k: int) -> Packed:
    """read(buffer, offset, n, k) a slice of about PACK_WEIGHTS weights at a time, each slice
    packed into its place in the result (the layout keeps each 16 output channels'
    bytes apart, so slices pack on their own): the same bytes as
    read(...).packed(), with one slice's temporaries alive instead of the tensor's."""
    weights, block = _FILE_BLOCKS[file_type]
    row_bytes = k // weights * block
    step = max(CHANNELS, PACK_WEIGHTS // k // CHANNELS * CHANNELS)  # rows a slice
    out = None
    for start in range(0, n, step):
        rows = min(step, n - start)
        form = read(buffer, offset + start * row_bytes, rows, k)
        part = form.packed()
        if out is None:
            out = torch.empty((n // CHANNELS, *part.shape[1:]), dtype=part.dtype)
            kind, bits = form.kind, form.bits
        out[start // CHANNELS: (start + rows) // CHANNELS] = part
    return Packed(out, kind, bits)


def fit6(weight: torch.Tensor) -> Q6 | None:
    """Any weight rounded onto the 6-bit grid per 16 inputs (symmetric, as Q6_K):
    tests build 6-bit layers from it. None when the shape does not fit the kernel."""
    n, k = weight.shape
    if n % CHANNELS or k % GROUP:
        return None
    w = weight.detach().float().view(n, k // Q6_PART, Q6_PART)
    scale = (w.abs().amax(-1) / 31).half()
    q = (w / scale.float().clamp(min=1e-8)[..., None]).round().clamp(-32, 31) + 32
    return Q6(q.to(torch.uint8).view(n, k), scale)


def _per_superblock(t: torch.Tensor) -> torch.Tensor:
    """[n, groups] -> [n, superblocks, 8], the last superblock padded with zeros."""
    n, groups = t.shape
    per = SUPER // GROUP
    return torch.nn.functional.pad(t, (0, -groups % per)).view(n, -1, per)


def fit(weight: torch.Tensor) -> Q4 | None:
    """Any weight rounded onto a 4-bit grid per group of 32 inputs (from its least to
    its largest value): the drafter's form, where only acceptance depends on the
    rounding (SmolLM2's file stores its layers so, as Q4_1: read back exactly). None
    when the shape does not fit the kernel."""
    n, k = weight.shape
    if n % CHANNELS or k % GROUP:
        return None
    w = weight.detach().float().view(n, k // GROUP, GROUP)
    lo, hi = w.amin(-1), w.amax(-1)
    scale, offset = ((hi - lo) / 15).half(), lo.half()
    q = ((w - offset.float()[..., None]) / scale.float().clamp(min=1e-8)[..., None]).round().clamp(0, 15)
    return Q4(q.to(torch.uint8).view(n, k), scale, offset)


def fit_q4_k(weight: torch.Tensor) -> Q4K | None:
    """Any weight rounded onto Q4_K's grid, more coarsely than llama.cpp's quantizer
    (tests build Q4_K_M-like targets from it): per group of 32 inputs the range
    from min(least, 0) to the largest value in 15 steps, the steps and the mins
    then rounded up onto their superblock's 6-bit grids (up, so the group's range
    stays covered). None when the shape does not fit the kernel."""
    n, k = weight.shape
    if n % CHANNELS or k % GROUP:
        return None
    groups = k // GROUP
    w = weight.detach().float().view(n, groups, GROUP)
    lo, hi = w.amin(-1).clamp(max=0), w.amax(-1)

    def six_bit(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """values [n, groups] >= 0 as (unit fp16 [n, superblocks], 0..63 [n, groups])."""
        per = _per_superblock(values)
        unit = (per.amax(-1) / 63).half()
        steps = (per / unit.float().clamp(min=1e-30)[..., None]).ceil().clamp(0, 63)
        return unit, steps.view(n, -1)[:, :groups].to(torch.uint8)

    dmin, m = six_bit(-lo)
    offset = -_per_group(dmin, groups) * m
    d, sc = six_bit((hi - offset) / 15)
    scale = _per_group(d, groups) * sc
    q = ((w - offset[..., None]) / scale.clamp(min=1e-30)[..., None]).round().clamp(0, 15)
    return Q4K(q.to(torch.uint8).view(n, k), d, dmin, sc, m)


def matches(weight: torch.Tensor, quantized: Q4 | Q4K | Q6 | Q8) -> bool:
    """Whether the 4-, 6- or 8-bit tensor is the loaded weight (up to the bf16
    rounding of the loaded copy): a reader that finds a tensor stored in another
    order (a loader that permutes it, another architecture's layout) falls back to
    int8."""
    if tuple(weight.shape) != tuple(quantized.q.shape):
        return False
    rows = slice(0, 64)  # enough to tell a permuted tensor; the whole one costs seconds
    w = weight[rows].detach().float()
    part = type(quantized)(*(t[rows] for t in quantized))
    error = (part.weight() - w).abs()
    return bool((error <= w.abs() * 2.0**-7 + part.steps() * 0.02).all())


def _nibbles(q: torch.Tensor) -> torch.Tensor:
    """The low nibbles of q [n, k] in the kernels' layout: [n/16, k/32, 256]."""
    n, k = q.shape
    cols, groups = n // CHANNELS, k // GROUP
    # [col, j, g, (h, t, b)] -> [col, g, t, j, b, h]: input 16h + 4t + b of channel j
    nib = (q & 0x0F).view(cols, CHANNELS, groups, 2, 4, 4).permute(0, 2, 4, 1, 5, 3)
    return (nib[..., 0] | (nib[..., 1] << 4)).reshape(cols, groups, 256)


def _per_block(t: torch.Tensor) -> torch.Tensor:
    """[n, x] values -> [n/16, x, the 16 channels' bytes]: a block's values side by side."""
    return t.view(t.shape[0] // CHANNELS, CHANNELS, -1).transpose(1, 2).contiguous().view(torch.uint8)


def _per_group(values: torch.Tensor, groups: int) -> torch.Tensor:
    """Per-superblock values [n, superblocks] as float32 per group [n, groups]."""
    return values.float().repeat_interleave(SUPER // GROUP, 1)[:, :groups]


class Q4(NamedTuple):
    """4 bits a weight in groups of 32 inputs, w = scale * q + offset, q uint8 0..15,
    scale and offset fp16 [n, k/32] (Q4_1's form: fit's)."""

    q: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    kind = Q4_1
    bits = 4

    def packed(self) -> torch.Tensor:
        """The kernel's layout (quant_gemm.c): blocks of 16 channels x 32 inputs."""
        return torch.cat([_nibbles(self.q), _per_block(self.scale), _per_block(self.offset)], dim=-1).contiguous()

    def weight(self) -> torch.Tensor:
        """The float weight it stands for (tests and the reference path)."""
        n, k = self.q.shape
        w = self.q.float().view(n, k // GROUP, GROUP) * self.scale.float()[..., None] + self.offset.float()[..., None]
        return w.view(n, k)

    def steps(self) -> torch.Tensor:
        """The grid's step at each weight [n, k]."""
        return self.scale.float().abs().repeat_interleave(GROUP, 1)


class Q4K(NamedTuple):
    """A 4-bit tensor as a Q4_K tensor holds it: per group of 32 inputs
    w = d * sc * q - dmin * m, q uint8 0..15, sc and m uint8 0..63 [n, k/32], d and
    dmin fp16 per superblock of 256 inputs [n, ceil(k/256)] (a row's last
    superblock is shorter where k is not a multiple of 256)."""

    q: torch.Tensor
    d: torch.Tensor
    dmin: torch.Tensor
    sc: torch.Tensor
    m: torch.Tensor
    kind = Q4_K
    bits = 4

    def packed(self) -> torch.Tensor:
        """The kernel's layout (quant_gemm.c): per 16 channels, superblock after
        superblock, its d and dmin, then per group the nibbles, sc and m."""
        cols, per = self.q.shape[0] // CHANNELS, SUPER // GROUP
        heads = torch.cat([_per_block(self.d), _per_block(self.dmin)], dim=-1)  # [cols, superblocks, 64]
        body = torch.cat([_nibbles(self.q), _per_block(self.sc), _per_block(self.m)], dim=-1)  # [cols, groups, 288]
        parts = []
        for s in range(heads.shape[1]):
            parts += [heads[:, s], body[:, s * per : (s + 1) * per].reshape(cols, -1)]
        return torch.cat(parts, dim=-1).contiguous()

    def group_scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each group's (scale, offset) [n, k/32] in float32: w = scale * q + offset."""
        groups = self.sc.shape[1]
        return _per_group(self.d, groups) * self.sc.float(), -_per_group(self.dmin, groups) * self.m.float()

    def weight(self) -> torch.Tensor:
        n, k = self.q.shape
        scale, offset = self.group_scales()
        return (self.q.float().view(n, k // GROUP, GROUP) * scale[..., None] + offset[..., None]).view(n, k)

    def steps(self) -> torch.Tensor:
        return self.group_scales()[0].abs().repeat_interleave(GROUP, 1)


class Q6(NamedTuple):
    """A 6-bit tensor [n, k] as a Q6_K tensor holds it: w = scale * (q - 32), q uint8
    0..63, scale fp16 per 16 inputs."""

    q: torch.Tensor
    scale: torch.Tensor
    kind = Q6_K
    bits = 6

    def packed(self) -> torch.Tensor:
        """The kernel's layout (quant_gemm.c): blocks of 16 channels x 32 inputs."""
        n, k = self.q.shape
        cols, groups = n // CHANNELS, k // GROUP
        # high bit pairs: [col, (h, jj), g, (s, f, b)] -> [col, g, s, h, jj, b, f]
        high = (self.q >> 4).view(cols, 2, 8, groups, 2, 4, 4).permute(0, 3, 4, 1, 2, 6, 5)
        high = (high[..., 0] | (high[..., 1] << 2) | (high[..., 2] << 4) | (high[..., 3] << 6)).reshape(
            cols, groups, 128)
        scales = self.scale.view(cols, CHANNELS, groups, 2).permute(0, 2, 3, 1).contiguous().view(torch.uint8)
        return torch.cat([_nibbles(self.q), high, scales.reshape(cols, groups, 64)], dim=-1).contiguous()

    def weight(self) -> torch.Tensor:
        n, k = self.q.shape
        return ((self.q.float() - 32).view(n, k // Q6_PART, Q6_PART) * self.scale.float()[..., None]).view(n, k)

    def steps(self) -> torch.Tensor:
        return self.scale.float().abs().repeat_interleave(Q6_PART, 1)


class Q8(NamedTuple):
    """An 8-bit tensor as a Q8_0 tensor holds it: w = scale * q, q int8, scale fp16
    per 32 inputs."""

    q: torch.Tensor
    scale: torch.Tensor
    kind = Q8_0
    bits = 8

    def packed(self) -> torch.Tensor:
        """The kernel's layout (quant_gemm.c): per 16 channels and 32 inputs, q + 128
        as unsigned bytes in the nibbles' order, then the 16 scales."""
        n, k = self.q.shape
        cols, groups = n // CHANNELS, k // GROUP
        # [col, j, g, (t, b)] -> [col, g, t, j, b]: input 4t + b of channel j
        u = (self.q.to(torch.int16) + 128).to(torch.uint8).view(cols, CHANNELS, groups, 8, 4)
        return torch.cat([u.permute(0, 2, 3, 1, 4).reshape(cols, groups, 512), _per_block(self.scale)],
                         dim=-1).contiguous()

    def weight(self) -> torch.Tensor:
        n, k = self.q.shape
        return (self.q.float().view(n, k // GROUP, GROUP) * self.scale.float()[..., None]).view(n, k)

    def steps(self) -> torch.Tensor:
        return self.scale.float().abs().repeat_interleave(GROUP, 1)
