"""A lean forward pass for Llama-architecture drafters.

Why: on this CPU a transformers eager forward of SmolLM2-135M costs ~67 ms for
one token, mostly Python and per-op overhead, about 0.8 of a Gemma-3-270M
step, which makes speculation slower than plain decoding. Here each layer is
a handful of large ops (fused QKV and gate/up projections, one SDPA call), the
KV cache is preallocated, and rolling back rejected drafts just moves a length
pointer. The LM head can be restricted to the token ids a target can use.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..stopping import ShouldStop, never


class LeanLlama:
    def __init__(
        self,
        hf_model,
        num_layers: int | None = None,
        head_ids: torch.Tensor | None = None,
        max_len: int = 4096,
        dtype: torch.dtype | None = None,
        int8: bool = False,
        weights: dict[str, torch.Tensor] | None = None,
    ):
        """weights: state-dict entries that replace the model's own (a target's
        adapter merged into the projections)."""
        cfg = hf_model.config
        if cfg.model_type != "llama":
            raise ValueError(f"LeanLlama runs Llama models, not '{cfg.model_type}'")
        inner = hf_model.model
        self.dtype = dtype or next(hf_model.parameters()).dtype
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.eps = cfg.rms_norm_eps
        layers = inner.layers[: num_layers or len(inner.layers)]

        self._inner = inner
        # Weight-only int8 copies of the big matrices for 1-2 token steps: drafting is
        # memory-bound and int8 weights are half the bytes of bf16 (see
        # docs/drafter.md for the measured step times). Prefill keeps the dense path,
        # where the int8 kernel is slower.
        self.int8 = int8 and self.dtype == torch.bfloat16
        self.embed = self._w(inner.embed_tokens.weight)
        self.layers = [self._layer(i, weights or {}) for i in range(len(layers))]
        self.q_layers = [self._quantized(layer) for layer in self.layers] if self.int8 else []
        self.final_norm = self._w(inner.norm.weight)
        head = hf_model.get_output_embeddings().weight
        # head_ids: drafter token ids kept in the LM head; logits come back in that order.
        self.head_ids = head_ids
        self.head = self._w(head if head_ids is None else head[head_ids])
        self.q_head = _int8(self.head) if self.int8 else None
        self.max_len = max_len
        shape = (len(self.layers), 2, self.n_kv, max_len, self.head_dim)
        self.kv = torch.zeros(shape, dtype=self.dtype)
        self.length = 0
        theta = cfg.rope_parameters["rope_theta"] if getattr(cfg, "rope_parameters", None) else cfg.rope_theta
        inv_freq = 1.0 / theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)
        angles = torch.outer(torch.arange(max_len).float(), inv_freq)
        emb = torch.cat([angles, angles], dim=-1)
        self.cos, self.sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def _w(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(self.dtype).contiguous()

    def _layer(self, i: int, weights: dict[str, torch.Tensor]) -> tuple:
        """Layer i's (norm, fused qkv, o, norm, fused gate/up, down); weights
        replace the model's projections by state-dict name."""
        layer = self._inner.layers[i]

        def proj(part: str) -> torch.Tensor:
            module = getattr(layer.self_attn if part in _ATTN else layer.mlp, part)
            base = getattr(module, "base_layer", module)  # under a peft LoRA wrapper
            name = f"model.layers.{i}.{'self_attn' if part in _ATTN else 'mlp'}.{part}.weight"
            return self._w(weights.get(name, base.weight))

        return (
            self._w(layer.input_layernorm.weight),
            torch.cat([proj("q_proj"), proj("k_proj"), proj("v_proj")]),
            proj("o_proj"),
            self._w(layer.post_attention_layernorm.weight),
            torch.cat([proj("gate_proj"), proj("up_proj")]),
            proj("down_proj"),
        )

    def _quantized(self, layer: tuple) -> tuple:
        return tuple(_int8(m) for m in (layer[1], layer[2], layer[4], layer[5]))

    def set_weights(self, weights: dict[str, torch.Tensor] | None, should_stop: ShouldStop = never) -> bool:
        """Replace the projections (None: the model's own), keeping the embeddings,
        head, KV buffer and RoPE tables. Layer by layer, checking should_stop()
        between layers; all layers change at once at the end, or none (returns
        False) when stopped. The context must be recomputed afterwards."""
        layers, q_layers = [], []
        for i in range(len(self.layers)):
            if should_stop():
                return False
            layers.append(self._layer(i, weights or {}))
            if self.int8:
                q_layers.append(self._quantized(layers[-1]))
        self.layers, self.q_layers = layers, q_layers
        self.length = 0
        return True

    def reset(self) -> None:
        self.length = 0

    def rollback(self, length: int) -> None:
        """Forget everything after the first `length` positions."""
        self.length = min(self.length, length)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def _attend(self, q, k, v, mask):
        """Grouped-query attention. For one new token the query heads that share a
        key/value head are stacked as rows of one query, so keys/values are never
        copied per query head (SDPA's enable_gqa path does copy them)."""
        hq, n, d = q.shape
        hk = k.shape[0]
        if n == 1:
            out = F.scaled_dot_product_attention(q.view(1, hk, hq // hk, d), k[None], v[None])
            return out.view(hq, 1, d)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    @torch.inference_mode()
    def forward(self, ids: list[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ids; returns (logits [n, head], final hidden states [n, hidden])."""
        ids = torch.as_tensor(ids, dtype=torch.long).view(-1)
        n, start = ids.numel(), self.length
        end = start + n
        if end > self.max_len:
            raise ValueError(f"drafter context full ({self.max_len} tokens)")
        x = self.embed[ids]
        cos, sin = self.cos[start:end], self.sin[start:end]
        hq, hk, d = self.n_heads, self.n_kv, self.head_dim
        mask = None
        if n > 1:  # causal within the new block, everything before it visible
            mask = torch.ones(n, end, dtype=torch.bool).tril(diagonal=start)
        small = self.int8 and n <= _INT8_MAX_TOKENS
        mm = _mm_int8 if small else _mm
        for layer, (ln1, wqkv, wo, ln2, wgu, wd) in enumerate(self.layers):
            if small:
                wqkv, wo, wgu, wd = self.q_layers[layer]
            qkv = mm(self._norm(x, ln1), wqkv)
            q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
            q = self._rope(q.view(n, hq, d).transpose(0, 1), cos, sin)
            k = self._rope(k.view(n, hk, d).transpose(0, 1), cos, sin)
            cache = self.kv[layer]
            cache[0, :, start:end] = k
            cache[1, :, start:end] = v.view(n, hk, d).transpose(0, 1)
            att = self._attend(q, cache[0, :, :end], cache[1, :, :end], mask)
            x = x + mm(att.transpose(0, 1).reshape(n, hq * d), wo)
            gate, up = mm(self._norm(x, ln2), wgu).chunk(2, dim=-1)
            x = x + mm(F.silu(gate) * up, wd)
        self.length = end
        h = self._norm(x, self.final_norm)
        return mm(h, self.q_head if small else self.head), h


_INT8_MAX_TOKENS = 2
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


def _int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-row int8 quantization: (int8 weights, scales)."""
    scales = (w.float().abs().amax(dim=1) / 127.0).clamp(min=1e-8)
    q = (w.float() / scales[:, None]).round().clamp(-128, 127).to(torch.int8)
    return q.contiguous(), scales.to(w.dtype)


def _mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w.T


def _mm_int8(x: torch.Tensor, qw: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return torch.ops.aten._weight_int8pack_mm(x, qw[0], qw[1])
