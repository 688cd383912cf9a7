"""A lean forward pass for Llama-architecture decoders (Llama, Qwen2): the drafter,
and Llama or Qwen2 targets.

Why: on this CPU a transformers eager forward is mostly Python and per-op
overhead: SmolLM2-135M costs ~67 ms for one token there, and the int8
Qwen2.5-Coder-1.5B target spends ~15 ms of an ~86 ms step outside its matrix
products. Here each layer is a handful of large ops (one attention call, fused
RMSNorm), the KV cache is one buffer grown on demand, and rolling back rejected
tokens just shortens the list of tokens it holds.

Two ways to hold the weights:
* the drafter's (LeanLlama(...)): fused QKV and gate/up projections copied from
  the model, in 4 bits, int8 (see DraftLinear) or dense, with a target's
  adapter (set_adapter); its LM head over the whole vocabulary, in the layers'
  precision;
* a target's (LeanLlama.sharing(model)): the model's own linear modules called as
  they are (its int8 layers from core/models/quantize.py), so no second copy of
  the weights exists and transformers' forward of the same model (the learner,
  the benchmark's `hf`) computes with the very same weights; activations and
  the KV cache in float32.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..kernels.build import amx_rows as kernels_amx_rows
from ..kernels.build import unavailable as kernels_unavailable
from ..kernels.layouts import Q4_1, Q4_K, fit_q4_k
from ..kernels.layouts import fit as fit_q4_1
from ..kernels.linear import QuantLinear, quant_mm
from ..kernels.linear import join as join_quant
from ..kernels.stack import DecoderStack, runs_in_stack
from ..stopping import ShouldStop, never
from . import huge_pages
from .quantize import int8_mm, pack_int8

ARCHITECTURES = ("llama", "qwen2")
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
# The drafter's 4-bit forms: Q4_1 (SmolLM2's file, read back exactly) or Q4_K
# (a coarser grid in fewer bytes; the bench's --draft q4k=1).
_FITS = {Q4_1: fit_q4_1, Q4_K: fit_q4_k}
_KV_GROWTH = 256  # tokens the KV buffer grows by at least (it doubles up to max_len)
# Rows per decoder-stack call: a long prompt goes in chunks, so the kernel's
# buffers stay a few tens of MB (rows are independent: the same results).
_STACK_ROWS = 256
# Blocks of up to this many rows (a verification's) attend row by row, each as a
# one-token step does, here and on transformers' forward (target_runtime.ROWWISE):
# SDPA's masked block kernel sums in another order, and the next int8 layers'
# rounding grew those last-bit differences into other tokens (Qwen2.5-Coder-0.5B:
# 21 of 40 replies unlike plain decoding's; git show 524cea4:docs/speed.md).
EXACT_ROWS = 16
ATT_PART = 256  # decoder_stack.c's softmax part: a window reads whole parts

Projection = Callable[[torch.Tensor], torch.Tensor]  # [n, in] -> [n, out]


def supports(config) -> str | None:
    """Why this model cannot run lean (None: it can): an architecture, attention or
    position scheme LeanLlama does not implement."""
    if config.model_type not in ARCHITECTURES:
        return f"architecture '{config.model_type}'"
    if getattr(config, "use_sliding_window", False) or any(
        t != "full_attention" for t in getattr(config, "layer_types", None) or []
    ):
        return "sliding-window attention"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation '{config.hidden_act}'"
    return None


class DraftLinear:
    """y = x W^T (+ b) for the drafter: dense in its dtype, or (int8) through the
    same row-scaled int8 GEMM as the target (core/models/quantize.py), or (int4)
    rounded to 4 bits through the target's kernels (core/kernels/) in
    `layout`'s form (Q4_1: SmolLM2's file stores these layers so already; Q4_K
    was measured and not taken, git show 524cea4:docs/drafter.md), both flat in the rows:
    the drafter's one-token steps and the few-token re-syncs after each
    verification cost about the same (git show 524cea4:docs/drafter.md).

    low_rank: a target's adapter, per part of a fused projection in output order,
    [(a [r, in], b [part's out, r])], W' = W + b @ a. At 4 bits it stays beside
    the weight, y += (x a^T) b^T: rounded into 4 bits with W it would be mostly
    lost (docs/learning.md); int8 and dense weights take it merged."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, int8: bool, int4: bool = False,
                 low_rank: list[tuple[torch.Tensor, torch.Tensor]] | None = None, layout: int = Q4_1):
        self.bias = bias
        four = _FITS[layout](weight) if int8 and int4 else None
        self.kind = layout
        if low_rank and four is None:
            weight = weight + torch.cat([b @ a for a, b in low_rank]).to(weight.dtype)
            low_rank = None
        self.out_features = weight.shape[0]
        self.packed4 = four.packed() if four else None  # a quantized layer keeps only its packed copy
        self.packed = pack_int8(weight) if int8 and four is None else None
        self.weight = None if int8 else weight
        # (a of every part stacked, b^T of every part side by side, where each
        # part's outputs end); fp16, as the kernel streams them
        self.low_rank = None
        if low_rank:
            ends = torch.tensor([b.shape[0] for _, b in low_rank]).cumsum(0)
            self.low_rank = (torch.cat([a for a, _ in low_rank]).half().contiguous(),
                             torch.cat([b for _, b in low_rank]).T.half().contiguous(), ends)

    @property
    def kernel_weights(self) -> tuple[torch.Tensor, int] | None:
        """(packed weights, layout) for DecoderStack; None: not 4-bit."""
        return None if self.packed4 is None else (self.packed4, self.kind)

    def place(self, packed: torch.Tensor) -> None:
        """Run from packed, a copy of the 4-bit weights (huge_pages.gather)."""
        self.packed4 = packed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed4 is not None:
            y = quant_mm(x, self.packed4, self.out_features, self.kind).to(x.dtype)
        elif self.packed is not None:
            y = int8_mm(x, self.packed).to(x.dtype)
        else:
            y = x @ self.weight.T
        if self.low_rank is not None:
            a, b, ends = self.low_rank
            t, rank = x.float() @ a.float().T, a.shape[0] // len(ends)
            starts = [0, *ends.tolist()[:-1]]
            parts = [t[:, p * rank:(p + 1) * rank] @ b[:, s:e].float()
                     for p, (s, e) in enumerate(zip(starts, ends.tolist()))]
            y = y + torch.cat(parts, dim=-1).to(y.dtype)
        return y if self.bias is None else y + self.bias


class _Joined:
    """Several of the model's own projections of one input, side by side (the
    target's q/k/v and gate/up, kept as the model holds them): the decoder stack
    runs them as parts."""

    def __init__(self, *parts: Projection):
        self.parts = parts

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)


class LeanLlama:
    def __init__(
        self,
        hf_model,
        num_layers: int | None = None,
        max_len: int = 4096,
        dtype: torch.dtype | None = None,
        int8: bool = False,
        adapter: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
        share: bool = False,
        int4: bool = False,
        layout: int = Q4_1,
        window: int = 0,
        head_rows: int | None = None,
    ):
        """The drafter's runtime (see the module docstring); share=True is the
        target's (use LeanLlama.sharing). adapter: a target's learned change to
        the projections, by module path (AdapterStore.low_rank_state). window: 0,
        or attention reads a query's first ATT_PART positions and the ATT_PART-
        position parts that hold its last `window` (a drafter's, whose bits decide
        nothing: see DraftSettings.window). head_rows: a drafter's LM head over its
        first head_rows token ids only (None: all; DraftSettings.head_tokens), so
        its logits are that long."""
        cfg = hf_model.config
        why = supports(cfg)
        if why:
            raise ValueError(f"LeanLlama cannot run this model: {why}")
        inner = hf_model.model
        self.share = share
        self.int8 = int8 and not share
        # int4: the drafter's projections in 4 bits where the kernel runs (else int8).
        self.int4 = self.int8 and int4 and kernels_unavailable() is None
        self.layout = layout  # the drafter's 4-bit form (_FITS)
        # An int8 drafter computes in float32 between its int8 products: the
        # kernel takes and returns float32, and casting to bf16 would only add ops.
        self.dtype = torch.float32 if self.int8 else dtype or next(hf_model.parameters()).dtype
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.eps = cfg.rms_norm_eps
        self._inner = inner
        self._n_layers = min(num_layers or len(inner.layers), len(inner.layers))
        # The target calls its embedding module, as transformers does (a forward
        # hook on it counts target forwards: the benchmark's step counter).
        if share:
            self.embed: Projection = inner.embed_tokens
        else:
            table = self._w(inner.embed_tokens.weight)
            self.embed = lambda ids: table[ids]
        self.layers = [self._layer(i, adapter or {}) for i in range(self._n_layers)]
        self.final_norm = self._w(inner.norm.weight)
        head = hf_model.get_output_embeddings()
        if share:
            self.head: Projection = self._own(head)
        else:  # 4 bits changes 1 argmax in 6, yet the cheaper drafted token wins end to end (git show 524cea4:docs/drafter.md)
            self.head = DraftLinear(self._w(head.weight[:head_rows]), None, self.int8, self.int4, layout=self.layout)
        huge_pages.gather(self._placeable(self.layers, self.head))
        self.stack = self._stack()
        self.max_len = max_len
        self.window = window
        # The one-call stack keeps keys and values in fp16 (decoder_stack.c: half
        # the bytes a long chat's step reads); the torch layers read the same
        # cache, widened, so the two ways still compute alike.
        self.kv_dtype = self.stack.kv_dtype if self.stack is not None else self.dtype
        self.kv = torch.zeros((self._n_layers, 2, self.n_kv, 0, self.head_dim), dtype=self.kv_dtype)
        self.cos = self.sin = torch.zeros(0, self.head_dim, dtype=self.dtype)
        self.ids: list[int] = []  # the tokens whose keys/values the buffer holds, in order
        # Where the 4-bit kernel runs products of many rows on AMX tiles (bf16) and
        # fewer in integers (core/kernels/build.py), a row's keys/values depend on the block it
        # ran in: a target's kept prefix leaves at least a block that large to
        # recompute (the drafter's rows only change its speed).
        low_bit = share and any(isinstance(m, QuantLinear) for m in inner.modules())
        self.fresh_rows = max(1, kernels_amx_rows()) if low_bit else 1

    @classmethod
    def sharing(cls, hf_model, max_len: int, dtype: torch.dtype = torch.float32) -> LeanLlama:
        """A target's runtime over the model's own linear modules (see the module docstring)."""
        return cls(hf_model, max_len=max_len, dtype=dtype, share=True)

    def _own(self, module) -> Projection:
        """One of the model's own projections, called from this runtime's activations:
        int8 layers take any dtype; a float layer (one too small to quantize) gets
        its own, and its output comes back in ours."""
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.dtype != self.dtype:
            return lambda x: module(x.to(weight.dtype)).to(self.dtype)
        return module

    def _joined(self, *modules) -> Projection:
        """The model's projections of one input side by side: each run of 4-, 6- or
        8-bit ones of one layout as one product (kernels.linear.join, sharing their weights),
        the others called as they are."""
        parts: list = []
        for m in modules:
            kernel = isinstance(m, QuantLinear) and self.dtype == torch.float32
            if kernel and parts and isinstance(parts[-1], list) and parts[-1][0].kind == m.kind:
                parts[-1].append(m)
            else:
                parts.append([m] if kernel else self._own(m))
        parts = [(join_quant(p) if len(p) > 1 else p[0]) if isinstance(p, list) else p for p in parts]
        return parts[0] if len(parts) == 1 else _Joined(*parts)

    def _w(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(self.dtype).contiguous()

    def _layer(self, i: int, adapter: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> tuple:
        """Layer i's (norm, qkv, o, norm, gate/up, down), with the adapter's change
        to its projections."""
        layer = self._inner.layers[i]
        attn, mlp = layer.self_attn, layer.mlp
        norms = self._w(layer.input_layernorm.weight), self._w(layer.post_attention_layernorm.weight)
        if self.share:
            own = self._own
            return (norms[0], self._joined(attn.q_proj, attn.k_proj, attn.v_proj), own(attn.o_proj),
                    norms[1], self._joined(mlp.gate_proj, mlp.up_proj), own(mlp.down_proj))

        def fused(*parts: str) -> DraftLinear:
            ws, bs, changes = [], [], []
            for part in parts:
                owner = "self_attn" if part in _ATTN else "mlp"
                module = getattr(attn if part in _ATTN else mlp, part)
                base = getattr(module, "base_layer", module)  # under a peft LoRA wrapper
                ws.append(self._w(base.weight))
                bs.append(base.bias)
                changes.append(adapter.get(f"model.layers.{i}.{owner}.{part}"))
            bias = None if all(b is None for b in bs) else torch.cat(
                [self._w(b) if b is not None else torch.zeros(w.shape[0], dtype=self.dtype) for b, w in zip(bs, ws)])
            low_rank = None
            if any(c is not None for c in changes):  # a part the adapter leaves alone gets a zero change
                rank = next(c for c in changes if c is not None)[0].shape[0]
                low_rank = [c if c is not None else (torch.zeros(rank, w.shape[1]), torch.zeros(w.shape[0], rank))
                            for c, w in zip(changes, ws)]
            return DraftLinear(torch.cat(ws), bias, self.int8, self.int4, low_rank, self.layout)

        return (norms[0], fused("q_proj", "k_proj", "v_proj"), fused("o_proj"),
                norms[1], fused("gate_proj", "up_proj"), fused("down_proj"))

    def set_adapter(self, adapter: dict[str, tuple[torch.Tensor, torch.Tensor]] | None,
                    should_stop: ShouldStop = never) -> bool:
        """Rebuild the projections with this adapter (None: the model's own),
        keeping the embeddings, head, KV buffer and RoPE tables. Layer by layer,
        checking should_stop() between layers; all layers change at once at the
        end, or none (returns False) when stopped. The context must be recomputed
        afterwards."""
        layers = []
        for i in range(self._n_layers):
            if should_stop():
                return False
            layers.append(self._layer(i, adapter or {}))
        huge_pages.gather(self._placeable(layers))
        self.layers = layers
        self.stack = self._stack()
        self.reset()
        return True

    @staticmethod
    def _placeable(layers: list[tuple], head=None) -> list:
        """The layers' (and head's) products whose packed weights can move onto 2 MB
        pages, in the order a forward reads them."""
        found = []
        for projection in [p for layer in layers for p in layer] + [head]:
            parts = projection.parts if isinstance(projection, _Joined) else [projection]
            found += [p for p in parts if hasattr(p, "place") and p.kernel_weights is not None]
        return found

    def _stack(self) -> DecoderStack | None:
        """The layers as one kernel call when every projection is 4-bit or 6-bit
        (the drafter's usual form, and a Q4_K_M target's): ~2.5x faster for the
        drafter than the same layers as torch ops (git show 524cea4:docs/speed.md has the target's)."""
        if self.dtype != torch.float32 or self.head_dim % 16 or self.head_dim > 256 or kernels_unavailable() is not None:
            return None
        def parts(p) -> list:
            return list(p.parts) if isinstance(p, _Joined) else [p]

        layers = [(n1, parts(qkv), o, n2, parts(gu), down) for n1, qkv, o, n2, gu, down in self.layers]
        if any(len(layer[1]) > 3 or len(layer[4]) > 2 for layer in layers):
            return None  # more parts than the kernel's layer struct holds
        if not all(runs_in_stack(layer[i]) for layer in layers for i in (1, 2, 4, 5)):
            return None
        return DecoderStack(layers, self.n_heads, self.n_kv, self.head_dim, self.eps, self.final_norm)

    @property
    def length(self) -> int:
        return len(self.ids)

    def reset(self) -> None:
        self.ids.clear()

    def rollback(self, length: int) -> None:
        """Forget everything after the first `length` positions."""
        del self.ids[max(0, length):]

    def reuse(self, ids: list[int], compute: int = 1) -> int:
        """Keep the longest prefix of ids the buffer already holds (a previous
        reply's prompt, a conversation's earlier turns), leaving at least the last
        `compute` ids to be run (at least fresh_rows); forget the rest. Returns
        how many ids are kept. A row's result does not depend on the rows beside
        it, only on whether its block was long enough for AMX; so a prompt run
        before (a regenerated reply, the benchmark's methods one after another)
        gives the first token a fresh run would. A previous reply's rows, run a
        few at a time, differ from a fresh prompt read's in rounding only."""
        common = common_prefix(self.ids, ids, len(ids) - max(compute, self.fresh_rows))
        self.rollback(common)
        return common

    def _reserve(self, end: int) -> None:
        """Room in the KV buffer and the RoPE tables for `end` positions: they grow
        as a context does (doubling), so a short chat holds a short cache."""
        if end > self.max_len:
            raise ValueError(f"context full ({self.max_len} tokens)")
        capacity = self.kv.shape[3]
        if end <= capacity:
            return
        capacity = min(self.max_len, max(end, 2 * capacity, _KV_GROWTH))
        kv = huge_pages.zeros((*self.kv.shape[:3], capacity, self.head_dim), self.kv_dtype)
        kv[:, :, :, : self.length] = self.kv[:, :, :, : self.length]
        self.kv = kv
        self.cos, self.sin = _rope_tables(self._inner, capacity, self.dtype)

    def _storable(self, t: torch.Tensor) -> torch.Tensor:
        """Keys or values as the cache can hold them: an fp16 cache saturates, as the
        stack's does (decoder_stack.c's fp16_range), rather than store infinities."""
        top = torch.finfo(torch.float16).max  # 65504
        return t.clamp(-top, top) if self.kv_dtype == torch.float16 else t

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def _window_mask(self, start: int, n: int) -> torch.Tensor:
        """The positions each new row reads with a window, as decoder_stack.c's
        first_recent picks them: the first ATT_PART, and the parts of ATT_PART
        that hold the row's last `window` positions."""
        seen = torch.arange(start + 1, start + n + 1)[:, None]
        pos = torch.arange(start + n)[None, :]
        recent = torch.clamp((seen - self.window) // ATT_PART, min=1) * ATT_PART
        return (pos < seen) & ((pos < ATT_PART) | (pos >= recent))

    def _attend(self, q, k, v, mask):
        """Grouped-query attention. The query heads that share a key/value head are
        stacked as rows of one query (head-major, the causal mask repeated per
        head), so keys/values are never copied per query head: SDPA's enable_gqa
        path copies them and, with a mask, ran ~4x slower here (0.87 vs 0.22 ms
        for 5 new tokens over 400 in Qwen2.5-1.5B's shape). mask: the causal mask
        already repeated per query head of a group (built once per forward)."""
        hq, n, d = q.shape
        hk = k.shape[0]
        k, v = k.to(q.dtype), v.to(q.dtype)  # an fp16 cache (the stack's), widened
        group = hq // hk
        stacked = q.reshape(1, hk, group * n, d)
        out = F.scaled_dot_product_attention(stacked, k[None], v[None], attn_mask=mask)
        return out.view(hq, n, d)

    @torch.inference_mode()
    def forward(self, ids: list[int] | torch.Tensor, last: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ids; returns (logits, final hidden states) of the new positions, or
        of only the last `last` ones (a prompt needs one row of a 152k-word head)."""
        ids = torch.as_tensor(ids, dtype=torch.long).view(-1)
        n, start = ids.numel(), self.length
        new = ids.tolist()
        end = start + n
        self._reserve(end)
        x = self.embed(ids).to(self.dtype)
        cos, sin = self.cos[start:end], self.sin[start:end]
        hq, hk, d = self.n_heads, self.n_kv, self.head_dim
        if self.stack is not None:
            x = x.contiguous()
            for first in range(0, n, _STACK_ROWS):
                rows = min(_STACK_ROWS, n - first)
                # The rows whose output _finish reads; the rest need only their keys and values.
                needed = rows if not last else rows - max(0, n - last - first)
                self.stack(x[first : first + rows], start + first, self.kv, self.cos, self.sin, needed, self.window)
            return self._finish(x, new, last, normed=True)
        mask = None
        # Past window + ATT_PART positions a window hides some (decoder_stack.c's
        # first_recent): every row through one masked call then, as a drafter's bits
        # need not be its one-token steps'.
        windowed = self.window > 0 and end > self.window + ATT_PART
        if windowed:
            mask = self._window_mask(start, n).repeat(hq // hk, 1)
        elif n > EXACT_ROWS:  # causal within the new block, everything before it visible; once per query head of a group
            mask = torch.ones(n, end, dtype=torch.bool).tril(diagonal=start).repeat(hq // hk, 1)
        for layer, (ln1, qkv_proj, o_proj, ln2, gate_up_proj, down_proj) in enumerate(self.layers):
            qkv = qkv_proj(self._norm(x, ln1))
            qk, v = qkv.split([(hq + hk) * d, hk * d], dim=-1)
            # Queries and keys rotated as one tensor: half the small ops of two calls.
            qk = self._rope(qk.view(n, hq + hk, d).transpose(0, 1), cos, sin)
            q, k = qk[:hq], qk[hq:]
            cache = self.kv[layer]
            cache[0, :, start:end] = self._storable(k)
            cache[1, :, start:end] = self._storable(v.view(n, hk, d).transpose(0, 1))
            if 1 < n <= EXACT_ROWS and not windowed:
                att = torch.cat([self._attend(q[:, i : i + 1], cache[0, :, : start + i + 1],
                                              cache[1, :, : start + i + 1], None) for i in range(n)], dim=1)
            else:
                att = self._attend(q, cache[0, :, :end], cache[1, :, :end], mask)
            x = x + o_proj(att.transpose(0, 1).reshape(n, hq * d))
            gate, up = gate_up_proj(self._norm(x, ln2)).chunk(2, dim=-1)
            x = x + down_proj(F.silu(gate) * up)
        return self._finish(x, new, last)

    def _finish(self, x: torch.Tensor, new: list[int], last: int, normed: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """normed: the stack gave the rows read through the final norm already."""
        self.ids += new
        if last:
            x = x[-last:]
        h = x if normed else self._norm(x, self.final_norm)
        return self.head(h), h


def common_prefix(held: list[int], ids: list[int], limit: int) -> int:
    """How many leading ids a cache holding `held` already has, at most limit."""
    limit = min(len(held), limit)
    common = 0
    while common < limit and held[common] == ids[common]:
        common += 1
    return common


def _rope_tables(inner, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for positions 0..length-1 from the model's own rotary embedding,
    so every RoPE variant transformers implements (Llama 3's scaled one included)
    comes out as the model computes it."""
    probe = torch.zeros(1, dtype=torch.float32)
    with torch.no_grad():
        cos, sin = inner.rotary_emb(probe, torch.arange(length)[None])
    return cos[0].to(dtype), sin[0].to(dtype)
