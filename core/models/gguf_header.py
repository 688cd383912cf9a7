"""A GGUF file's header (metadata and tensor table), read without reading the file.

gguf.GGUFReader turns every entry of every array into an object: ~8 s here for a
file with Qwen's 151k-token vocabulary. This reads the same header from a memory
map with struct, skipping array contents (an array's value is its length), in
milliseconds, so the worker can answer Model info… at once.

Format (GGUF v2/v3, little-endian): magic "GGUF", version u32, tensor count u64,
metadata count u64; each metadata entry is key (u64 length + UTF-8), value type
u32, value; then per tensor: name, dimension count u32, dimensions u64 each, ggml
type u32, data offset u64.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class Tensor:
    name: str
    ggml_type: int  # gguf.GGMLQuantizationType
    n_elements: int
    dims: tuple[int, ...] = ()  # fastest-varying first, as GGUF stores them
    offset: int = 0  # of its data from the file's start


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, object]  # scalars and strings as they are; an array as its length
    tensors: list[Tensor]


class _Cursor:
    def __init__(self, buffer):
        self.buffer = buffer
        self.pos = 0

    def unpack(self, fmt: str):
        value = struct.unpack_from(fmt, self.buffer, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        text = bytes(self.buffer[self.pos:self.pos + n]).decode("utf-8", "replace")
        self.pos += n
        return text

    def value(self, kind: int):
        if kind in _SCALAR:
            return self.unpack(_SCALAR[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            self.skip(item, count)
            return count
        raise ValueError(f"unknown GGUF value type {kind}")

    def skip(self, kind: int, count: int) -> None:
        if kind in _SCALAR:
            self.pos += count * struct.calcsize(_SCALAR[kind])
            return
        for _ in range(count):  # strings and nested arrays have their own lengths
            self.value(kind)


def read_header(path: Path) -> GGUFHeader:
    """The header of a GGUF file; ValueError when it is not one (or is damaged)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
        try:
            return _parse(_Cursor(buffer))
        except (struct.error, UnicodeDecodeError, OverflowError) as exc:
            raise ValueError(f"{Path(path).name} has a damaged GGUF header ({exc})") from exc


def _parse(cursor: _Cursor) -> GGUFHeader:
    if bytes(cursor.buffer[:4]) != b"GGUF":
        raise ValueError("not a GGUF file")
    cursor.pos = 4
    version = cursor.unpack("<I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is not supported")
    n_tensors, n_metadata = cursor.unpack("<Q"), cursor.unpack("<Q")
    metadata = {}
    for _ in range(n_metadata):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.unpack("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cursor.string()
        dims = tuple(cursor.unpack("<Q") for _ in range(cursor.unpack("<I")))
        infos.append((name, dims, cursor.unpack("<I"), cursor.unpack("<Q")))
    alignment = metadata.get("general.alignment", 32)
    data_start = -(-cursor.pos // alignment) * alignment
    tensors = [Tensor(name, kind, math.prod(dims), dims, data_start + offset) for name, dims, kind, offset in infos]
    return GGUFHeader(version, metadata, tensors)


@dataclass(frozen=True)
class KVShape:
    """What a model's KV cache holds per token: layers x KV heads x head_dim,
    keys and values; window: its context length."""

    layers: int
    kv_heads: int
    head_dim: int
    window: int

    def bytes_per_token(self, element_bytes: int = 2) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * element_bytes


def kv_shape(header: GGUFHeader) -> KVShape | None:
    """The KV cache's shape from a GGUF header's {arch}.* keys (None: the header
    does not say). A per-layer KV head count (an array) reads as its length, so
    the head count falls back to the query heads' (an overestimate)."""
    meta = header.metadata
    arch = meta.get("general.architecture")

    def number(key: str) -> int | None:
        value = meta.get(f"{arch}.{key}")
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    layers, heads = number("block_count"), number("attention.head_count")
    if not layers or not heads:
        return None
    kv_heads = min(number("attention.head_count_kv") or heads, heads)  # an array's length is no head count
    head_dim = number("attention.key_length") or (number("embedding_length") or 0) // heads
    if not head_dim:
        return None
    return KVShape(layers, kv_heads, head_dim, number("context_length") or 0)
