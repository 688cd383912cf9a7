"""Writes a GGUF file shaped as Qwen2-7B in llama.cpp's Q4_K_M mix, with random weights.

    .venv/bin/python -m omnidraft.tools.synthetic_gguf --out qwen2-7b-shaped.gguf
    .venv/bin/python -m omnidraft.tools.step_times --target qwen2-7b-shaped.gguf --json step-times-7b.json

What a 7B-class target costs here, without downloading one: the file has Qwen2-7B's
shapes (28 layers of width 3,584, 28 query and 4 key/value heads of 128, a 18,944-wide
MLP, q/k/v biases) and the Q4_K_M file's types, tensor by tensor, as llama.cpp's
quantizer chooses them: Q4_K everywhere but `attn_v` and `ffn_down` in Q6_K for the
first and last eighth of the layers and every third one between, and the output
matrix in Q6_K. The metadata (tokenizer, chat template, RoPE base) is copied from
the default target's GGUF, whose 151,936-token vocabulary Qwen2-7B shares, so the
engine, the bench and llama.cpp all load it as they load a real 7B.

The blocks are random bytes written by the gguf package's writer (no quantizer:
the weights mean nothing), but for each block's fp16 scales, set small and finite
so activations stay finite. A decoding step streams and multiplies the same bytes
as a real file's, so its costs are a real 7B's; its replies are noise, so nothing
here measures acceptance. About 4.4 GB.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from .common import output_file, tool_parser

LAYERS, WIDTH, MLP, HEADS, KV_HEADS, HEAD_DIM = 28, 3584, 18944, 28, 4, 128
CONTEXT = 32768
# The GGUF keys of the copied header that describe the source's shapes: set to Qwen2-7B's.
SHAPE_KEYS = {"block_count": LAYERS, "embedding_length": WIDTH, "feed_forward_length": MLP,
              "attention.head_count": HEADS, "attention.head_count_kv": KV_HEADS, "context_length": CONTEXT}


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's use_more_bits: the layers whose attn_v and ffn_down Q4_K_M keeps in Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensors(vocab: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape as (rows, columns) or (n,), type) in the order llama.cpp writes them."""
    out = [("token_embd.weight", (vocab, WIDTH), "Q4_K")]
    kv = KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        wide = "Q6_K" if more_bits(i, LAYERS) else "Q4_K"
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (WIDTH,), "F32"),
                (b + "attn_q.weight", (WIDTH, WIDTH), "Q4_K"), (b + "attn_q.bias", (WIDTH,), "F32"),
                (b + "attn_k.weight", (kv, WIDTH), "Q4_K"), (b + "attn_k.bias", (kv,), "F32"),
                (b + "attn_v.weight", (kv, WIDTH), wide), (b + "attn_v.bias", (kv,), "F32"),
                (b + "attn_output.weight", (WIDTH, WIDTH), "Q4_K"),
                (b + "ffn_norm.weight", (WIDTH,), "F32"),
                (b + "ffn_gate.weight", (MLP, WIDTH), "Q4_K"), (b + "ffn_up.weight", (MLP, WIDTH), "Q4_K"),
                (b + "ffn_down.weight", (WIDTH, MLP), wide)]
    return out + [("output_norm.weight", (WIDTH,), "F32"), ("output.weight", (vocab, WIDTH), "Q6_K")]


def random_blocks(rng: np.random.Generator, shape: tuple[int, ...], kind: str) -> np.ndarray:
    """A tensor's bytes: random quants, small finite fp16 scales (F32: norms of 1, biases of 0)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if kind == "F32":
        return np.ones(shape, np.float32)
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    rows, cols = shape
    data = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    # Q4_K: d, dmin (fp16) lead each block; Q6_K: d (fp16) ends it. Weights of about 0.02.
    scale = np.frombuffer(np.float16(2e-5 if kind == "Q4_K" else 2e-4).tobytes(), np.uint8)
    if kind == "Q4_K":
        data[:, 0:2] = scale
        data[:, 2:4] = np.frombuffer(np.float16(1e-4).tobytes(), np.uint8)
    else:
        data[:, -2:] = scale
    return data.reshape(rows, cols // block * size)


def write(out: Path, source: Path, seed: int = 0) -> Path:
    """The Qwen2-7B-shaped file at `out`, its header copied from `source` (a Qwen2 GGUF)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(source)
    arch = str(reader.fields["general.architecture"].contents())
    vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    writer = GGUFWriter(out, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = field.contents()
        key = name.removeprefix(f"{arch}.")
        if key in SHAPE_KEYS:
            value = SHAPE_KEYS[key]
        elif name == "general.name":
            value = "Qwen2-7B-shaped (random weights)"
        vtype = field.types[0]
        writer.add_key_value(name, value, vtype, sub_type=field.types[-1] if vtype == GGUFValueType.ARRAY else None)
    rng = np.random.default_rng(seed)
    plan = tensors(vocab)
    for name, shape, kind in plan:
        if kind == "F32":
            writer.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        else:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
            raw = (shape[0], shape[1] // block * size)
            writer.add_tensor_info(name, raw, np.dtype(np.uint8), raw[0] * raw[1], raw_dtype=GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, shape, kind in plan:  # one tensor in memory at a time
        writer.write_tensor_data(random_blocks(rng, shape, kind))
    writer.close()
    return out


def parse_args(argv: list[str] | None = None):
    ap = tool_parser(__file__, __doc__)
    ap.add_argument("--out", type=output_file, required=True, help="the GGUF file to write (~4.4 GB)")
    ap.add_argument("--source", default="qwen2.5-coder-1.5b-instruct",
                    help="catalog id or GGUF path whose header (tokenizer, template) is copied")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    source = Path(args.source)
    if not source.is_file():
        from omnidraft.core.models.catalog import ModelCatalog
        from omnidraft.core.models.loader import source_path

        source = source_path(ModelCatalog().get(args.source))
    write(args.out, source, args.seed)
    print(f"wrote {args.out}: {args.out.stat().st_size / 1e9:.2f} GB, Qwen2-7B shapes in the Q4_K_M mix")
    return 0


if __name__ == "__main__":
    sys.exit(main())
