"""A GGUF file straight into a model: its config and tokenizer from the header,
a skeleton with no weights, then the tensors one at a time from a memory map.

No de-quantized copy is written and no full-precision model exists at any
moment. A target (quantized=True) gets its large linear layers in the kernels'
layouts from the file's own blocks (Q4_K, Q6_K; Q5_0 and Q8_0 too where the
layers run as one call, see quantize.k_quant_reader), int8 from a one-tensor
de-quantization for the other types; its token table stays in the file's
blocks (QuantEmbedding). The small tensors (norms, biases) are de-quantized one
at a time. A drafter (quantized=False) is materialised in float, one tensor at
a time: the learner trains it with LoRA, and 135M weights in float are small.

What is reused from transformers: the GGUF -> HF tensor names
(get_gguf_hf_weights_map), its per-architecture tensor processors (Llama's q/k
row permutation, Gemma's norm offset), its config mapping and its tokenizer
reading. Its own config reader (gguf.GGUFReader) turns every vocabulary entry
into an object (Qwen has 151k); the config is rebuilt from the fast metadata
reader instead (gguf_config_dict).
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from ..kernels import layouts
from ..kernels.linear import quant_linear
from .gguf_header import Tensor, read_header
from .quantize import MIN_WEIGHTS, Int8Linear

# Architectures whose config transformers' GGUF reader builds by renaming metadata
# keys alone (the others, e.g. T5 or StableLM, look at tensors too: its own reader).
_PLAIN_CONFIG = {"llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "mistral", "phi3", "starcoder2",
                 "olmo2", "gpt2", "nemotron", "deci", "cohere", "command-r"}
_RENAMED = {"gemma3": "gemma3_text"}
_PAGE = mmap.PAGESIZE


def gguf_config_dict(path: Path) -> dict:
    """The transformers config dict of a GGUF file, as transformers' own GGUF reader
    builds it (load_gguf_checkpoint), from the header in well under a second."""
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING
    from transformers.integrations.gguf import (
        GGUF_CONFIG_ARCHS,
        get_gguf_config,
        read_gguf_metadata,
    )
    from transformers.modeling_gguf_pytorch_utils import (
        GGUF_TO_TRANSFORMERS_MAPPING,
        load_gguf_checkpoint,
    )

    metadata, tensor_names = read_gguf_metadata(str(path))
    arch = metadata["general.architecture"]
    if arch in GGUF_CONFIG_ARCHS:
        return get_gguf_config(metadata, tensor_names)
    if arch not in _PLAIN_CONFIG or (arch == "llama" and metadata.get("general.name") == "mistral"):
        return load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    config: dict = {"tie_word_embeddings": "output.weight" not in tensor_names}
    for key, value in GGUF_CONFIG_DEFAULTS_MAPPING.get(arch, {}).items():
        config.setdefault(key, value)
    renames = GGUF_TO_TRANSFORMERS_MAPPING["config"]
    for key, value in metadata.items():
        prefix, _, rest = key.partition(".")
        if prefix in renames and rest in renames[prefix]:
            target = renames[prefix][rest]
            if target is not None and target != -1:
                config[target] = value
    config["model_type"] = _RENAMED.get(config.get("model_type"), config.get("model_type"))
    if "vocab_size" not in config and isinstance(metadata.get("tokenizer.ggml.tokens"), int):
        config["vocab_size"] = metadata["tokenizer.ggml.tokens"]  # the reader gives an array's length
    return config


def gguf_tokenizer(path: Path, config_dict: dict):
    """The tokenizer and chat template the file holds. AutoTokenizer builds the
    file's config again to choose the tokenizer's class (with the slow reader):
    it is handed the one already built."""
    from transformers import AutoTokenizer

    with mock.patch("transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint",
                    lambda *args, **kwargs: {"config": dict(config_dict)}):
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


class GGUFFile:
    """A GGUF file's tensors by name over a read-only memory map. Pages read are
    given back after each tensor (release), so the load's resident memory is what
    it keeps, not the file too."""

    def __init__(self, path: Path):
        self.path = path
        self.header = read_header(path)
        self.tensors: dict[str, Tensor] = {t.name: t for t in self.header.tensors}
        with open(path, "rb") as f:
            self.buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(reversed(self.tensors[name].dims))

    def nbytes(self, name: str) -> int:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        tensor = self.tensors[name]
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(tensor.ggml_type)]
        return tensor.n_elements // block * size

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes, [rows, bytes per row], a view of the map."""
        tensor = self.tensors[name]
        rows = int(np.prod(self.shape(name)[:-1])) if len(tensor.dims) > 1 else 1
        data = np.frombuffer(self.buffer, dtype=np.uint8, count=self.nbytes(name), offset=tensor.offset)
        return data.reshape(rows, -1)

    def dequantized(self, name: str) -> np.ndarray:
        """The tensor in float32, in its GGUF shape (rows slowest)."""
        from gguf.quants import dequantize

        values = dequantize(self.raw(name), self.tensors[name].ggml_type)
        self.release(name)
        return np.array(values, dtype=np.float32).reshape(self.shape(name))  # writable, for torch

    def release(self, name: str) -> None:
        """Give back the pages of this tensor's bytes (they stay in the page cache)."""
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        tensor = self.tensors[name]
        start = tensor.offset // _PAGE * _PAGE
        end = min(len(self.buffer), tensor.offset + self.nbytes(name))
        self.buffer.madvise(mmap.MADV_DONTNEED, start, end - start)

    def close(self) -> None:
        try:
            self.buffer.close()
        except BufferError:  # a view still exported (never kept past a load): the map goes with it
            pass


class QuantEmbedding(torch.nn.Module):
    """A token table kept in its GGUF blocks (a copy of the file's bytes, so a file
    changed on disk cannot break a running model); a lookup de-quantizes only the
    rows looked up. Qwen2.5-Coder-1.5B's 151936 x 1536 table is 131 MB in Q4_K
    against 467 MB in bf16. scale: Gemma's embedding multiplier."""

    def __init__(self, blocks: torch.Tensor, ggml_type: int, dim: int, dtype: torch.dtype,
                 scale: torch.Tensor | None = None):
        super().__init__()
        self.blocks, self.ggml_type, self.dim, self.dtype = blocks, ggml_type, dim, dtype
        self.num_embeddings, self.embedding_dim = blocks.shape[0], dim
        self.weight_count = blocks.shape[0] * dim
        self.embed_scale = scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        from gguf.quants import dequantize

        flat = ids.reshape(-1)
        rows = dequantize(self.blocks[flat].numpy(), self.ggml_type)
        out = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32)).to(self.dtype)
        if self.embed_scale is not None:
            out = out * self.embed_scale.to(self.dtype)
        return out.view(*ids.shape, self.dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, ggml type {self.ggml_type}"


Check = Callable[[], None]


def _processor(arch: str, config_dict: dict):
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    return TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config_dict)


def _processed(processor, name: str, weights: np.ndarray) -> np.ndarray:
    return processor.process(weights=weights, name=name, tensor_key_mapping={}, parsed_parameters={}).weights


def _row_order(processor, name: str, rows: int) -> torch.Tensor | None:
    """The rows of the file's tensor in the model's order when the architecture's
    processor only reorders rows (Llama's q/k permutation); None: in order.
    ValueError: it changes values, so the blocks cannot be used as they are."""
    index = np.arange(rows, dtype=np.int64).reshape(rows, 1)
    order = np.asarray(_processed(processor, name, index)).reshape(-1)
    if order.shape != (rows,) or not np.array_equal(np.sort(order), np.arange(rows)):
        raise ValueError(f"{name} is transformed on load")
    return None if np.array_equal(order, np.arange(rows)) else torch.from_numpy(order.copy())


def _hf_names(model: torch.nn.Module, arch: str, layers: int) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, by gguf's own table (what
    transformers' get_gguf_hf_weights_map does, which builds that table again for
    every submodule, hundreds of times for a 30-layer model)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    found = next((key for key, value in MODEL_ARCH_NAMES.items() if value == arch), None)
    if found is None:
        raise ValueError(f"the gguf package does not know the architecture '{arch}'")
    table = get_tensor_name_map(found, layers)
    names = {}
    for hf_name in model.state_dict(keep_vars=True):
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = table.get_name(base) if suffix in ("weight", "bias") else None
        if gguf_name is not None:
            names.setdefault(f"{gguf_name}.{suffix}", hf_name)
    return names


def _set(model: torch.nn.Module, hf_name: str, value: torch.Tensor) -> None:
    owner_name, _, attr = hf_name.rpartition(".")
    owner = model.get_submodule(owner_name)
    old = getattr(owner, attr)
    if isinstance(old, torch.nn.Parameter):
        setattr(owner, attr, torch.nn.Parameter(value, requires_grad=old.requires_grad))
    else:
        setattr(owner, attr, value)


def _replace(model: torch.nn.Module, module_name: str, new: torch.nn.Module) -> None:
    owner_name, _, attr = module_name.rpartition(".")
    setattr(model.get_submodule(owner_name) if owner_name else model, attr, new)


def build(path: Path, dtype: torch.dtype, quantized: bool, readers: Callable[[object], dict],
          check: Check) -> tuple[torch.nn.Module, object]:
    """(model, tokenizer) from the file. readers(config): the GGUF types read into
    the kernels' layouts, by type ({} where the kernels do not run).
    check() is called between tensors (it raises to stop the load)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM
    config_dict = gguf_config_dict(path)
    from transformers import CONFIG_MAPPING

    config = CONFIG_MAPPING[config_dict["model_type"]].from_dict(config_dict)
    tokenizer = gguf_tokenizer(path, config_dict)
    check()
    with init_empty_weights(include_buffers=False):  # rotary tables and Gemma's scale stay real
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    file = GGUFFile(path)
    try:
        arch = str(file.header.metadata["general.architecture"])
        processor = _processor(arch, config.to_dict())
        hf_names = _hf_names(model, arch, config.num_hidden_layers)
        _fill(model, file, processor, hf_names, dtype, quantized, readers(config), check)
    finally:
        file.close()
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ValueError(f"the file has no weights for {', '.join(missing[:3])}")
    return model, tokenizer


def _fill(model, file: GGUFFile, processor, hf_names: dict[str, str], dtype: torch.dtype, quantized: bool,
          readers: dict, check: Check) -> None:
    embed = model.get_input_embeddings()
    head = model.get_output_embeddings()
    embed_name = next(n for n, m in model.named_modules() if m is embed)
    head_name = next((n for n, m in model.named_modules() if m is head), None)
    tied = "output.weight" not in file.tensors
    linears = {}
    for gguf_name in file.tensors:
        hf_name = hf_names.get(gguf_name)
        if hf_name is None or hf_name == f"{embed_name}.weight":
            continue
        module_name, _, attr = hf_name.rpartition(".")
        module = model.get_submodule(module_name)
        if attr == "weight" and type(module) is torch.nn.Linear:
            linears[module_name] = gguf_name  # after their biases, which the replacements take
            continue
        check()
        _set(model, hf_name, torch.from_numpy(_processed(processor, gguf_name, file.dequantized(gguf_name))).to(dtype))
    # The token table: kept in its blocks by a target, float for a drafter.
    embd = "token_embd.weight"
    check()
    if quantized and embd in file.tensors and file.tensors[embd].ggml_type not in (0, 1, 30):
        blocks = torch.from_numpy(file.raw(embd).copy())
        file.release(embd)
        scale = getattr(embed, "embed_scale", None)
        _replace(model, embed_name, QuantEmbedding(blocks, file.tensors[embd].ggml_type, embed.embedding_dim,
                                                   dtype, scale))
    else:
        _set(model, f"{embed_name}.weight", torch.from_numpy(_processed(processor, embd, file.dequantized(embd))).to(dtype))
    if head_name is not None and tied:
        if quantized:
            linears[head_name] = embd  # the head gets its own copy: the table stays in blocks
            model.config.tie_word_embeddings = False
        else:
            head.weight = model.get_input_embeddings().weight
    for module_name, gguf_name in linears.items():
        check()
        linear = model.get_submodule(module_name)
        if not quantized:
            _set(model, f"{module_name}.weight",
                 torch.from_numpy(_processed(processor, gguf_name, file.dequantized(gguf_name))).to(dtype))
            continue
        _replace(model, module_name, _linear(linear, file, processor, gguf_name, readers, dtype))


def _linear(linear: torch.nn.Linear, file: GGUFFile, processor, name: str, readers: dict,
            dtype: torch.dtype) -> torch.nn.Module:
    """The layer in a kernel layout from the file's blocks, or int8 from its
    de-quantized weight (another type, or a layer too small to be worth it)."""
    tensor = file.tensors[name]
    n, k = linear.out_features, linear.in_features
    read = readers.get(tensor.ggml_type)
    if read is not None and len(tensor.dims) == 2 and n % layouts.CHANNELS == 0 and linear.weight.numel() >= MIN_WEIGHTS:
        try:
            order = _row_order(processor, name, n)
        except ValueError:
            order = None
            read = None
        if read is not None:
            if order is None:  # a slice of rows at a time: a large matrix's unpacking stays small
                quantized = layouts.read_packed(read, tensor.ggml_type, file.buffer, tensor.offset, n, k)
            else:  # q and k, their rows reordered: a layer's worth
                quantized = read(file.buffer, tensor.offset, n, k)
                quantized = type(quantized)(*(t[order] for t in quantized))
            file.release(name)
            return quant_linear(linear, quantized)
    weight = torch.from_numpy(_processed(processor, name, file.dequantized(name)))
    if linear.weight.numel() < MIN_WEIGHTS:
        linear.weight = torch.nn.Parameter(weight.to(dtype), requires_grad=False)
        return linear
    linear.weight = torch.nn.Parameter(weight, requires_grad=False)
    return Int8Linear(linear)
