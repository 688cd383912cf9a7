"""Quantized target weights (core/kernels/: 4-, 6- and 8-bit layouts): the kernels
compute the products, a row's result never depends on the rows beside it, Q4_K and Q6_K
tensors read from a GGUF file are the weights the file holds, a target's layers
run as one kernel call compute what its torch layers compute, and speculative
decoding of such a target gives the tokens of its plain decoding."""

import contextlib
import ctypes
import mmap
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize
from omnidraft.core.engine import Engine, LearnSettings
from omnidraft.core.events import TurnFinished
from omnidraft.core.kernels import build as kernel_build
from omnidraft.core.kernels import layouts
from omnidraft.core.kernels.linear import Q4_1Linear, QuantLinear, join, quant_linear, quant_mm
from omnidraft.core.models import loader, quantize
from omnidraft.core.models.catalog import ModelCatalog
from omnidraft.core.models.quantize import (
    Int8Linear,
    k_quant_reader,
    quant_layer_count,
    quantize_int8,
)

from tests.tiny import tiny_qwen2

pytestmark = pytest.mark.skipif(kernel_build.unavailable() is not None, reason=f"{kernel_build.unavailable()}")


def _integer_isa() -> str:
    """The best build this CPU runs without AMX's bf16 tiles (integer products at every row count)."""
    return next(isa for isa in kernel_build.runnable_isas() if isa != "amx")


@pytest.fixture
def integer_build():
    """Products that name no build run on _integer_isa()'s."""
    with kernel_build.use_build(_integer_isa()):
        yield


@pytest.fixture(params=["default", "generic"])
def either_build(request):
    """The test on the build this CPU runs by default, then on the portable plain-C
    one (the fallback where no SIMD build runs)."""
    if request.param == "default":
        yield
        return
    with kernel_build.use_build("generic"):
        yield


def _layer(n=256, k=512, seed=0) -> layouts.Q4:
    """Random 4-bit weights in groups (fit's form, the drafter's)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g)
    scale = (torch.rand(n, k // 32, generator=g) * 0.01 + 1e-3).half()
    offset = (-torch.rand(n, k // 32, generator=g) * 0.05).half()
    return layouts.Q4(q, scale, offset)


def _layer_k(n=256, k=512, seed=0) -> layouts.Q4K:
    """Random weights as a Q4_K tensor holds them (a GGUF target's)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g)
    supers = -(-k // 256)
    d, dmin = ((torch.rand(n, supers, generator=g) + 0.1) * 1e-3).half(), (torch.rand(n, supers, generator=g) * 1e-3).half()
    sc, m = (torch.randint(0, 64, (n, k // 32), dtype=torch.uint8, generator=g) for _ in range(2))
    return layouts.Q4K(q, d, dmin, sc, m)


@pytest.mark.parametrize("isa", kernel_build.runnable_isas())
def test_the_kernel_computes_the_4_bit_product_of_int8_rows(isa):
    # groups (Q4_1's form); Q4_K's superblocks of 256 inputs, whole and with a row
    # ending in a short one (352 inputs: 3 groups)
    for q4 in (_layer(), _layer_k(), _layer_k(k=352)):
        k = q4.q.shape[1]
        x = torch.randn(11, k, generator=torch.Generator().manual_seed(k))  # the same rows for every build
        x[4] *= 300  # an outlier row
        got = quant_mm(x, q4.packed(), 256, q4.kind, isa)
        # The kernel's arithmetic: each row on its own int8 scale, exact integer products.
        row_scale = x.abs().amax(1, keepdim=True) / 127
        xq = (x / row_scale).round()
        want = (xq.double() @ q4.weight().double().T) * row_scale.double()
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
        assert float((got - x @ q4.weight().T).norm() / got.norm()) < 0.02


def _layer6(n=256, k=512, seed=0) -> layouts.Q6:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 64, (n, k), dtype=torch.uint8, generator=g)
    scale = ((torch.rand(n, k // 16, generator=g) - 0.2) * 0.01).half()  # some negative, as Q6_K's can be
    return layouts.Q6(q, scale)


def _layer8(n=256, k=512, seed=0) -> layouts.Q8:
    """Random weights as a Q8_0 tensor holds them, -128 and 127 included."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (n, k), dtype=torch.int16, generator=g).to(torch.int8)
    q[0, :64] = -128
    q[1, :64] = 127
    scale = ((torch.rand(n, k // 32, generator=g) - 0.2) * 0.01).half()
    return layouts.Q8(q, scale)


@pytest.mark.parametrize("isa", kernel_build.runnable_isas())
@pytest.mark.parametrize("bits", [6, 8])
def test_the_kernel_computes_the_6_and_8_bit_products_of_int8_rows(isa, bits):
    form = _layer6() if bits == 6 else _layer8()
    x = torch.randn(11, 512)
    x[4] *= 300
    got = quant_mm(x, form.packed(), 256, form.kind, isa)
    row_scale = x.abs().amax(1, keepdim=True) / 127
    want = ((x / row_scale).round().double() @ form.weight().double().T) * row_scale.double()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    layer = quant_linear(torch.nn.Linear(512, 256), form)
    assert layer.bits == bits and torch.equal(layer(x), got + layer.bias)
    assert torch.equal(torch.cat([layer(x[i : i + 1]) for i in range(11)]), layer(x))


@pytest.mark.skipif(len(kernel_build.runnable_isas()) < 2, reason="this CPU runs one of the kernel's instruction sets")
def test_every_instruction_set_gives_the_same_bits():
    """Every build this CPU runs, the generic one included (amx below its tiles' rows)."""
    x = torch.randn(13, 512)
    for form in (_layer(), _layer_k(), _layer6(), _layer8()):
        results = [quant_mm(x, form.packed(), 256, form.kind, isa) for isa in kernel_build.runnable_isas()]
        assert all(torch.equal(results[0], other) for other in results[1:])


@pytest.mark.parametrize("isa", [isa for isa in kernel_build.runnable_isas() if isa != "generic"])
def test_the_generic_build_gives_each_simd_builds_bits(isa):
    """The portable build (ggml's *_generic loops, no intrinsics) computes the SIMD
    builds' integers, and their float steps in their order (fmaf where they fuse a
    multiply-add): the same bits for every layout, for row counts around the 8-row
    blocks, an outlier row, a row ending in a short Q4_K superblock. (amx: fewer
    rows than its tiles take, so its integer kernel.)"""
    for form in (_layer(), _layer_k(), _layer_k(k=352), _layer6(), _layer8()):
        for m in (1, 3, 8, 13):
            x = torch.randn(m, form.q.shape[1], generator=torch.Generator().manual_seed(m))
            x[0] *= 300
            generic = quant_mm(x, form.packed(), 256, form.kind, "generic")
            assert torch.equal(generic, quant_mm(x, form.packed(), 256, form.kind, isa)), (form.kind, m)


def test_the_generic_decoder_stack_computes_what_the_simd_one_does(qwen_tok, monkeypatch):
    """The decoder stack's plain-C loops (norms, RoPE, the fp16 cache, attention's
    softmax, SiLU, the adapter beside the weights) against the SIMD build's on a
    Q4_K_M-like target and an adapted drafter: a prompt, a step and a
    verification-sized block. Not the same bits: the generic loops sum in order
    where the SIMD ones sum 8 or 16 lanes and then across them, take libm's expf
    for a polynomial, and the norm's sum in double; a last-bit difference can then
    round a key to the neighbouring fp16 step in the cache, or an activation to the
    neighbouring int8 step in the next product. That is why the SIMD stack itself
    is held only within 5e-3 of the torch layers (the tests below); the two stacks,
    each on its side of them, within 1e-2 of the logits' range, where a wrong RoPE,
    mask or softmax is off by tenths. Their products alone are the same bits (above)."""
    from omnidraft.core.models.lean_llama import LeanLlama
    from omnidraft.core.models.target_runtime import TargetRunner

    monkeypatch.setattr(quantize, "MIN_WEIGHTS", 0)
    target = tiny_qwen2(len(qwen_tok), seed=6)
    quantize_int8(target, _file_like)
    drafter = tiny_qwen2(len(qwen_tok), seed=3)
    nets = [TargetRunner(target).net, LeanLlama(drafter, int8=True, int4=True, adapter=_adapter(drafter))]
    assert all(net.stack is not None for net in nets)

    def run() -> list[torch.Tensor]:
        out = []
        for net in nets:
            net.reset()
            out += [net.forward(list(range(100, 137)))[0], net.forward([7])[0], net.forward([8, 9, 10, 11, 12])[0]]
        return out

    with kernel_build.use_build(_integer_isa()):
        simd = run()
    with kernel_build.use_build("generic"):
        generic = run()
    for got, expected in zip(generic, simd):
        torch.testing.assert_close(got, expected, atol=1e-2 * float(expected.abs().max()), rtol=1e-2)


def test_a_build_the_compiler_cannot_make_is_skipped_and_the_rest_load_with_no_compiler(tmp_path, home,
                                                                                           monkeypatch):
    """The package's build (build_all, what setup.py runs) skips a build the compiler
    cannot make and records why; at run time, with no compiler, the built ones load
    from the package's folder, the skipped one says why, and only where no build can
    load is the kernels' absence reported, as a sentence."""
    compiler = kernel_build.find_compiler()
    if compiler is None:
        pytest.skip("needs a C compiler")
    isas = {"broken": ((), ["-mno-such-instruction-set"]), "generic": kernel_build.ISAS["generic"]}
    monkeypatch.setattr(kernel_build, "ISAS", isas)
    manifest = kernel_build.build_all(tmp_path / "lib", compiler)
    assert "file" in manifest["builds"]["generic"] and "file" not in manifest["builds"]["broken"]
    assert "no-such-instruction-set" in manifest["builds"]["broken"]["skipped"]

    monkeypatch.setattr(kernel_build, "PREBUILT", tmp_path / "lib")
    monkeypatch.setattr(kernel_build, "find_compiler", lambda: None)
    kernel_build.forget_builds()
    try:
        assert kernel_build.runnable_isas() == ["broken", "generic"]
        generic = kernel_build.library()
        assert generic.isa == "generic" and Path(generic._name).parent == tmp_path / "lib"
        assert kernel_build.unavailable() is None
        broken = kernel_build.library("broken")
        assert isinstance(broken, kernel_build.KernelUnavailable) and "not built with the package" in str(broken)

        for name in ("generic", "broken"):  # an install that lost its libraries, on a machine without a compiler
            (tmp_path / "lib" / kernel_build.library_file(name)).unlink(missing_ok=True)
        (tmp_path / "lib" / kernel_build.MANIFEST).unlink()
        kernel_build.forget_builds()
        why = kernel_build.unavailable()
        assert why.startswith("The 4-bit kernels cannot run here: ") and why.endswith(".")
        assert "no C compiler" in why and "Error" not in why
    finally:
        kernel_build.forget_builds()


def test_avx_vnni_cpus_get_the_vnni_build_and_it_compiles(monkeypatch):
    """Intel's desktop CPUs since Alder Lake have AVX-VNNI (256-bit VPDPBUSD) but no
    AVX-512: they run the avxvnni build, AVX2's code multiplying with VPDPBUSD. This
    CPU may not run it, but it builds here; its products' bits are checked through
    its twin in AVX-512 VL's encodings (avxvnni-evex) where AVX-512 VNNI runs, by
    the tests parametrized over runnable_isas() and the one above."""
    monkeypatch.setattr(kernel_build, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c", "avx_vnni"}))
    assert kernel_build.runnable_isas() == ["avxvnni", "avx2", "generic"]
    lib = kernel_build.library("avxvnni")
    assert not isinstance(lib, kernel_build.KernelUnavailable), lib
    assert lib.isa == "avxvnni"


def test_a_library_of_another_interface_version_is_refused_at_load_and_at_the_call():
    """The library reports its interface's version (kernel_abi): bind refuses one
    that reports another, or none (a build from before versions); the decoder stack
    refuses a parameters struct whose version is not its own."""
    from omnidraft.core.kernels.stack import _StackParams

    for old in (SimpleNamespace(_name="newer.so", kernel_abi=lambda: kernel_build.KERNEL_ABI + 1),
                SimpleNamespace(_name="older.so")):
        with pytest.raises(kernel_build.KernelABIMismatch, match=old._name):
            kernel_build.bind(old)
    lib = kernel_build.library()
    assert lib.kernel_abi() == kernel_build.KERNEL_ABI
    assert lib.decoder_stack(ctypes.byref(_StackParams(kernel_build.KERNEL_ABI + 1))) == -2


def test_use_build_chooses_the_default_build_within_its_block_and_nests():
    default = kernel_build.library()
    isa = kernel_build.runnable_isas()[-1]
    with kernel_build.use_build(isa) as chosen:
        assert kernel_build.library() is chosen is kernel_build.library(isa)
        assert kernel_build.kernel_isa() == isa
        with kernel_build.use_build(default):
            assert kernel_build.library() is default
        assert kernel_build.library() is chosen
    assert kernel_build.library() is default
    with pytest.raises(ValueError, match="avx1024"), kernel_build.use_build("avx1024"):
        pass


@pytest.fixture(scope="module")
def emulated_avx512(tmp_path_factory):
    """The kernels built with their AVX-512 paths and every AVX-512 intrinsic
    emulated lane by lane (tests/avx512_emulation.h): on a CPU without AVX-512 (most
    desktops, and the AVX2 machines that run these tests) those paths still get
    checked."""
    if "avx2" not in kernel_build.runnable_isas() or shutil.which("cc") is None:
        pytest.skip("needs AVX2 and cc")
    built = tmp_path_factory.mktemp("emulated") / "kernels.so"
    subprocess.run(["cc", "-O1", "-fopenmp", "-shared", "-fPIC", *kernel_build.ISAS["avx2"][1], "-include",
                    str(Path(__file__).with_name("avx512_emulation.h")), *map(str, kernel_build.SOURCES),
                    "-o", str(built), "-lm"], check=True, capture_output=True)
    return kernel_build.bind(ctypes.CDLL(str(built)))


def test_the_avx512_products_give_the_avx2_products_bits_under_emulation(emulated_avx512):
    """Both builds compute the same integers and float steps: the same bits, for
    each layout, row counts around the 8-row blocks, a row ending in a short
    superblock."""
    cases = []
    for form in (_layer(), _layer_k(), _layer_k(k=352), _layer6(), _layer8()):
        for m in (1, 3, 8, 13):
            x = torch.randn(m, form.q.shape[1])
            cases.append((x, form, quant_mm(x, form.packed(), 256, form.kind, "avx2")))
    with kernel_build.use_build(emulated_avx512):
        for x, form, want in cases:
            assert torch.equal(quant_mm(x, form.packed(), 256, form.kind), want), (form.kind, x.shape)


def test_the_avx512_decoder_stack_computes_what_the_avx2_one_does_under_emulation(
        emulated_avx512, qwen_tok, monkeypatch):
    """The decoder stack's AVX-512 vector layer (norms, RoPE, attention's softmax,
    masked tails) against the AVX2 one on a Q4_K_M-like target and an adapted
    drafter: the same up to the order of float sums (16 lanes against 8)."""
    from omnidraft.core.models.lean_llama import LeanLlama
    from omnidraft.core.models.target_runtime import TargetRunner

    monkeypatch.setattr(quantize, "MIN_WEIGHTS", 0)
    target = tiny_qwen2(len(qwen_tok), seed=6)
    quantize_int8(target, _file_like)
    drafter = tiny_qwen2(len(qwen_tok), seed=3)
    nets = [TargetRunner(target).net, LeanLlama(drafter, int8=True, int4=True, adapter=_adapter(drafter))]
    assert all(net.stack is not None for net in nets)

    def run() -> list[torch.Tensor]:
        out = []
        for net in nets:
            net.reset()
            out += [net.forward(list(range(100, 137)))[0], net.forward([7])[0], net.forward([8, 9, 10, 11, 12])[0]]
        return out

    with kernel_build.use_build("avx2"):
        want = run()
    with kernel_build.use_build(emulated_avx512):
        emulated = run()
    for got, expected in zip(emulated, want):
        torch.testing.assert_close(got, expected, atol=1e-4 * float(expected.abs().max()), rtol=1e-4)


def test_a_rows_result_does_not_depend_on_the_rows_computed_beside_it():
    layer = Q4_1Linear(torch.nn.Linear(512, 256), _layer())
    x = torch.randn(20, 512)
    x[3] *= 1000
    batched = layer(x)
    alone = torch.cat([layer(x[i : i + 1]) for i in range(20)])
    assert torch.equal(batched, alone)  # 20 rows: two full chunks of 8 and a partial one
    assert torch.equal(layer(x[:5]), batched[:5])


@pytest.mark.skipif(not kernel_build.amx_rows(), reason="no AMX tiles here (CPU or OS)")
def test_long_blocks_of_rows_run_on_amx_tiles_in_bf16_and_short_ones_keep_the_integer_bits():
    """A prompt-sized block runs on AMX (the weights dequantized to bf16 tiles):
    close to the exact product, each row independent of the rows beside it; a
    block shorter than amx_rows (a verification, a step) keeps the integer
    kernel's bits. Each layout, an odd count of 16-channel columns, a row ending
    in a short Q4_K superblock, a partial block of 16 rows."""
    rows = kernel_build.amx_rows()
    integer = _integer_isa()
    for form in (_layer(), _layer_k(n=272, k=352), _layer6(), _layer8(n=272)):
        n, k = form.q.shape
        x = torch.randn(rows + 21, k)
        x[5] *= 300
        got = quant_mm(x, form.packed(), n, form.kind, "amx")
        exact = x.double() @ form.weight().double().T
        assert float((got.double() - exact).norm() / exact.norm()) < 4e-3  # bf16's 8 bits (int8 rows: ~8e-3)
        again = quant_mm(torch.cat([x[rows:], torch.randn(rows, k), x[:rows]]), form.packed(), n, form.kind, "amx")
        assert torch.equal(again[-rows:], got[:rows]) and torch.equal(again[: x.shape[0] - rows], got[rows:])
        short = x[: rows - 1]
        assert torch.equal(quant_mm(short, form.packed(), n, form.kind, "amx"),
                           quant_mm(short, form.packed(), n, form.kind, integer))


def _gguf_of(path, kind: GGMLQuantizationType, block_bytes: int, names: list[str], n=32, k=512, seed=0):
    """A GGUF file holding one random tensor of this quantized type under each name;
    returns what gguf dequantizes it to."""
    rng = np.random.default_rng(seed)
    per_block = 32 if kind in (GGMLQuantizationType.Q5_0, GGMLQuantizationType.Q8_0) else 256
    blocks = rng.integers(0, 256, size=(n * k // per_block, block_bytes), dtype=np.uint8)
    if kind == GGMLQuantizationType.Q4_K:
        blocks[:, 0:4] = np.array([0.01, 0.002], dtype=np.float16).view(np.uint8)  # d, dmin
    elif kind == GGMLQuantizationType.Q6_K:
        blocks[:, 208:210] = np.array([0.001], dtype=np.float16).view(np.uint8)  # d
    else:  # d per 32 inputs, each block its own
        blocks[:, 0:2] = (rng.random((len(blocks), 1)) * 0.01 + 1e-4).astype(np.float16).view(np.uint8)
    writer = GGUFWriter(path, "llama")
    for name in names:
        writer.add_tensor(name, blocks.reshape(n, -1), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return torch.from_numpy(dequantize(blocks.reshape(n, -1), kind).astype(np.float32))


def test_q4_k_blocks_read_as_gguf_dequantizes_them(tmp_path):
    path = tmp_path / "q4k.gguf"
    want = _gguf_of(path, GGMLQuantizationType.Q4_K, 144, ["blk.0.ffn_up.weight"])

    read = k_quant_reader(path)
    quantized = read("model.layers.0.mlp.up_proj", want.bfloat16())
    assert quantized is not None
    # Exactly the file's weights: its d, dmin, sub-scales and mins are kept as they are.
    assert isinstance(quantized, layouts.Q4K)
    torch.testing.assert_close(quantized.weight(), want, rtol=0, atol=float(want.abs().max()) * 2**-20)
    # Not the loaded weight (a tensor stored in another order), or not a Q4_K layer: int8.
    assert read("model.layers.0.mlp.up_proj", want.flip(0)) is None
    assert read("model.layers.0.mlp.down_proj", want) is None
    assert read("lm_head", want) is None
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
        assert buffer[:4] == b"GGUF"


def test_q6_k_blocks_read_as_gguf_dequantizes_them(tmp_path):
    path = tmp_path / "q6k.gguf"
    want = _gguf_of(path, GGMLQuantizationType.Q6_K, 210, ["blk.0.ffn_down.weight", "output.weight"], seed=1)

    read = k_quant_reader(path)
    for name in ("model.layers.0.mlp.down_proj", "lm_head"):
        quantized = read(name, want.bfloat16())
        assert isinstance(quantized, layouts.Q6)
        torch.testing.assert_close(quantized.weight(), want, rtol=0, atol=float(want.abs().max()) * 2**-10)
    assert read("model.layers.0.mlp.down_proj", want.flip(0)) is None
    assert read("model.layers.0.mlp.up_proj", want) is None


def test_q5_0_blocks_read_exactly_onto_the_6_bit_grid(tmp_path):
    """A Q5_0 tensor (a model whose widths are no multiple of 256, as
    Qwen2.5-Coder-0.5B's 896) takes the 6-bit kernel with its own weights where
    the model's layers run as one call."""
    path = tmp_path / "q5.gguf"
    want = _gguf_of(path, GGMLQuantizationType.Q5_0, 22, ["blk.0.attn_q.weight"], k=96, seed=2)

    quantized = k_quant_reader(path, stack=True)("model.layers.0.self_attn.q_proj", want.bfloat16())
    assert isinstance(quantized, layouts.Q6)
    assert torch.equal(quantized.weight(), want)  # d * (q - 16) for every weight, to the bit
    x = torch.randn(3, 96)
    torch.testing.assert_close(quant_mm(x, quantized.packed(), 32, layouts.Q6_K), x @ want.T, rtol=0.05, atol=0.02)
    # On transformers' forward (Gemma 3) such layers keep int8 (git show 524cea4:docs/speed.md).
    assert k_quant_reader(path)("model.layers.0.self_attn.q_proj", want.bfloat16()) is None


def test_q8_0_blocks_take_their_own_8_bit_form_where_the_layers_run_as_one_call(tmp_path):
    """A Q5_0 file's Q8_0 layers (its v projections, its LM head) would keep its
    whole stack on torch ops in int8: they run in the kernel with the file's weights."""
    path = tmp_path / "q8.gguf"
    want = _gguf_of(path, GGMLQuantizationType.Q8_0, 34, ["blk.0.attn_v.weight", "output.weight"], seed=3)

    read = k_quant_reader(path, stack=True)
    for name in ("model.layers.0.self_attn.v_proj", "lm_head"):
        quantized = read(name, want.bfloat16())
        assert isinstance(quantized, layouts.Q8)
        assert torch.equal(quantized.weight(), want)
    assert read("model.layers.0.self_attn.v_proj", want.flip(0)) is None
    assert k_quant_reader(path)("model.layers.0.self_attn.v_proj", want.bfloat16()) is None


def test_any_weight_fits_q4_k_s_grid_within_half_a_step_of_its_value():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 576, generator=g) * torch.rand(64, 1, generator=g)  # 576: a short last superblock
    w[:, 40:72] = w[:, 40:72].abs() + 0.5  # a group with no negative weight: its range still starts at 0
    w[3, :] = 0  # an all-zero row
    fitted = layouts.fit_q4_k(w)
    assert bool(((fitted.weight() - w).abs() <= fitted.steps() * 0.5 + 1e-6).all())
    assert fitted.q.max() <= 15 and fitted.sc.max() <= 63 and fitted.m.max() <= 63
    assert not fitted.weight()[3].any()


def test_quantize_keeps_4_bit_layers_4_bit_and_the_rest_int8(qwen_tok, monkeypatch):
    monkeypatch.setattr(quantize, "MIN_WEIGHTS", 0)
    model = tiny_qwen2(len(qwen_tok))
    quantize_int8(model, lambda name, w: layouts.fit(w) if name.endswith("mlp.gate_proj") else None)
    assert isinstance(model.model.layers[0].mlp.gate_proj, Q4_1Linear)
    assert isinstance(model.model.layers[0].mlp.up_proj, Int8Linear)
    assert quant_layer_count(model) == len(model.model.layers)
    assert quantize.streamed_bytes(model) < sum(
        m.weight_count for m in model.modules() if isinstance(m, (Int8Linear, QuantLinear)))


@pytest.mark.parametrize("formats", ["4-bit", "Q4_K_M-like", "Q5_0-like"])
def test_speculative_decoding_of_a_4_bit_target_matches_its_plain_decoding(formats, tmp_path, qwen_tok, monkeypatch,
                                                                           either_build):
    from omnidraft.core.decoding.sampling import GenerationConfig

    monkeypatch.setattr(quantize, "MIN_WEIGHTS", 0)
    readers = {"4-bit": lambda name, w: layouts.fit(w), "Q4_K_M-like": _file_like, "Q5_0-like": _q5_file_like}
    monkeypatch.setattr(loader, "_four_bit", lambda entry, model: readers[formats])
    model = tiny_qwen2(len(qwen_tok), seed=1)
    model.save_pretrained(tmp_path)
    qwen_tok.save_pretrained(tmp_path)
    engine = Engine(ModelCatalog(), dtype=torch.float32, int8=True, learn_settings=LearnSettings(enabled=False))
    engine.load_target(str(tmp_path), measure_baseline=False)
    layers = len(model.model.layers)
    if formats == "4-bit":
        assert quant_layer_count(engine.target.model) == 7 * layers + 1  # the LM head too
    elif formats == "Q5_0-like":
        assert quant_layer_count(engine.target.model, bits=8) == layers + 1
        assert quant_layer_count(engine.target.model, bits=6) == 6 * layers
        assert "int8" not in engine.describe_target().runs_as
    else:
        assert quant_layer_count(engine.target.model, bits=6) == 2 * layers + 1
        runs_as = engine.describe_target().runs_as
        assert f"6-bit in {2 * layers + 1}" in runs_as and "int8" not in runs_as  # no layer left in int8
    assert engine.target.runner.kind == "lean" and engine.target.runner.net.stack is not None
    assert "4-bit weights" in engine.describe_target().runs_as
    cfg = GenerationConfig(max_new_tokens=32)
    for prompt in ("def add(a, b):\n    return a + b\n\ndef add(a, b):\n", "The snowflake fell. The"):
        plain = next(e for e in engine.complete(prompt, cfg) if isinstance(e, TurnFinished))
        spec = next(e for e in engine.complete(prompt, cfg, speculative=True) if isinstance(e, TurnFinished))
        assert spec.token_ids == plain.token_ids
        assert spec.stats.proposed > 0


def test_joined_layers_compute_what_each_computes_alone_and_share_its_weights():
    layers = [Q4_1Linear(torch.nn.Linear(512, n), _layer(n, 512, seed=n)) for n in (256, 64, 64)]
    x = torch.randn(5, 512)
    alone = torch.cat([layer(x) for layer in layers], dim=-1)
    joined = join(layers)
    assert torch.equal(joined(x), alone)
    # The layers now hold views of the joined weights (no second copy) and still
    # compute what they did: transformers' own forward of the target uses them.
    assert all(layer._packed._base is not None for layer in layers)
    assert torch.equal(torch.cat([layer(x) for layer in layers], dim=-1), alone)


def _fp16_cache(monkeypatch, model) -> None:
    """transformers' Qwen2 forward with its keys (after RoPE) and values rounded to
    fp16, as the one-call stack keeps its cache."""
    from transformers.models.qwen2 import modeling_qwen2

    rotate = modeling_qwen2.apply_rotary_pos_emb

    def rotate_and_round(*args, **kwargs):
        q, k = rotate(*args, **kwargs)
        return q, k.half().float()

    monkeypatch.setattr(modeling_qwen2, "apply_rotary_pos_emb", rotate_and_round)
    for layer in model.model.layers:
        layer.self_attn.v_proj.register_forward_hook(lambda module, args, out: out.half().float())


def test_keys_beyond_fp16s_range_leave_the_logits_finite(qwen_tok, monkeypatch):
    """The stack's fp16 cache saturates a key or value past 65504 instead of storing
    an infinity, which would make every later score NaN; the torch layers saturate
    alike, so the two ways still compute the same."""
    from omnidraft.core.models.target_runtime import TargetRunner

    monkeypatch.setattr(quantize, "MIN_WEIGHTS", 0)
    model = tiny_qwen2(len(qwen_tok), seed=2)
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.bias[3] = 1e6  # RoPE spreads it over its pair
        model.model.layers[0].self_attn.v_proj.bias[5] = -1e6
    quantize_int8(model, lambda name, w: layouts.fit(w))
    net = TargetRunner(model).net
    assert net.stack is not None and net.kv.dtype == torch.float16
    stack = net.stack
    ways = []
    for use_stack in (True, False):
        net.stack = stack if use_stack else None
        net.reset()
        ways.append(torch.cat([net.forward(list(range(100, 120)))[0], net.forward([7])[0]]))
        assert torch.isfinite(ways[-1]).all(), use_stack
    torch.testing.assert_close(*ways, atol=5e-3, rtol=5e-3)


def test_a_4_bit_lean_target_computes_what_transformers_computes_on_the_same_weights(qwen_tok, monkeypatch):
    from omnidraft.core.models.target_runtime import TargetRunner

    monkeypatch.setattr(quantize, "MIN_WEIGHTS", 0)
    model = tiny_qwen2(len(qwen_tok), seed=2)
    quantize_int8(model, lambda name, w: layouts.fit(w))
    ids = list(range(100, 130))
    with torch.inference_mode():
        before = model(torch.tensor([ids])).logits[0]
    runner = TargetRunner(model)
    assert runner.net.kv.dtype == torch.float16
    lean = runner.session().forward(ids)  # joins q/k/v and gate/up
    with torch.inference_mode():
        after = model(torch.tensor([ids])).logits[0]
    assert torch.equal(before, after)
    _fp16_cache(monkeypatch, model)
    with torch.inference_mode():
        rounded = model(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(lean, rounded, atol=1e-3, rtol=1e-3)


def _adapter(model, rank: int = 4, scale: float = 0.02, skip: str = "k_proj") -> dict:
    """A random learned change on every projection but `skip`: (a, b) by module path."""
    g = torch.Generator().manual_seed(5)
    return {name.removesuffix(".weight"): (torch.randn(rank, w.shape[1], generator=g) * scale,
                                           torch.randn(w.shape[0], rank, generator=g) * scale)
            for name, w in model.named_parameters() if name.endswith("proj.weight") and skip not in name}


def _file_like(name: str, w: torch.Tensor):
    """A Q4_K_M file's choice: v and down projections and the LM head in 6 bits
    (Q6_K), the other projections in 4 (Q4_K)."""
    return layouts.fit6(w) if name.endswith(("v_proj", "down_proj", "lm_head")) else layouts.fit_q4_k(w)


def _q5_file_like(name: str, w: torch.Tensor):
    """A Q5_0 file's choice (Qwen2.5-Coder-0.5B's): v projections and the LM head
    in Q8_0, the rest on the 6-bit grid as Q5_0 sits there."""
    if name.endswith(("v_proj", "lm_head")):
        n, k = w.shape
        scale = (w.detach().float().view(n, k // 32, 32).abs().amax(-1) / 127).half()
        q = (w.detach().float().view(n, k // 32, 32) / scale.float().clamp(min=1e-8)[..., None]).round()
        return layouts.Q8(q.clamp(-127, 127).to(torch.int8).view(n, k), scale)
    return layouts.fit6(w)


def _storages(net) -> set[int]:
    """Where the net's products' packed weights live: their storages' addresses
    (the kernel's, and the views transformers' modules compute from)."""
    found = set()
    for p in net._placeable(net.layers, net.head):
        found.add(p.kernel_weights[0].untyped_storage().data_ptr())
        found.update(m._packed.untyped_storage().data_ptr() for m in getattr(p, "members", ()))
    return found


@pytest.mark.parametrize("who", ["target", "drafter"])
def test_the_packed_weights_move_into_one_block_and_compute_the_same_bits(who, qwen_tok, monkeypatch, integer_build):
    """A net gathers its products' packed weights into one block (huge_pages): a
    4-bit target's joined q/k/v and gate/up with their modules' views, its 6-bit
    head; the drafter's layers, its head, and its layers again when an adapter
    loads. The same logits bit for bit as the weights where they were made, for
    a prompt, a step and a verification, and from transformers' own forward."""
    from omnidraft.core.models import huge_pages
    from omnidraft.core.models.lean_llama import LeanLlama
    from omnidraft.core.models.target_runtime import TargetRunner

    monkeypatch.setattr(quantize, "MIN_WEIGHTS", 0)

    def build():
        model = tiny_qwen2(len(qwen_tok), seed=7)
        if who == "drafter":
            return model, LeanLlama(model, int8=True, int4=True)
        quantize_int8(model, _file_like)
        return model, TargetRunner(model).net

    def logits(model, net) -> torch.Tensor:
        net.reset()
        out = [net.forward(list(range(100, 140)))[0], net.forward([7])[0], net.forward([8, 9, 10, 11])[0]]
        if who == "target":
            with torch.inference_mode():
                out.append(model(torch.tensor([list(range(100, 120))])).logits[0])
        return torch.cat(out)

    real = huge_pages.gather
    monkeypatch.setattr(huge_pages, "gather", lambda layers: None)
    where_made = logits(*build())
    monkeypatch.setattr(huge_pages, "gather", real)
    model, net = build()
    assert len(_storages(net)) == 1
    assert torch.equal(logits(model, net), where_made)
    if who == "drafter":
        head = _storages(net)
        net.set_adapter(_adapter(model))
        net.set_adapter(None)
        assert len(_storages(net) - head) == 1  # the layers in a block of their own, the head where it was
        assert torch.equal(logits(model, net), where_made)


def test_a_block_starts_on_a_2_mb_boundary_asked_for_on_huge_pages():
    from omnidraft.core.models import huge_pages

    room = huge_pages.block(3 << 20)
    assert room.data_ptr() % huge_pages.HUGE == 0 and room.numel() == 3 << 20 and not room.any()
    room[-1] = 7  # writable to its last byte
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.exists() or "[never]" in thp.read_text():
        pytest.skip("this kernel lends no huge pages")
    address = room.data_ptr()
    flags = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if not head.endswith(":"):  # a mapping's first line: its address range, low-high
            low, high = (int(x, 16) for x in head.split("-"))
            inside = low <= address < high
        elif line.startswith("VmFlags:") and inside:
            flags = line.split()[1:]
    assert flags is not None and "hg" in flags  # MADV_HUGEPAGE


def test_a_targets_layers_run_as_one_kernel_call_and_compute_what_its_torch_layers_compute(
        qwen_tok, monkeypatch, integer_build):
    """A Q4_K_M target's projections, 4-bit and 6-bit, run as one decoder-stack
    call (v in 6 bits beside 4-bit q and k: a projection in parts); its torch
    layers over the same modules are the reference: a prompt longer than one
    stack call takes, steps, a verification-sized block, a rollback."""
    from omnidraft.core.models import lean_llama
    from omnidraft.core.models.target_runtime import TargetRunner

    monkeypatch.setattr(quantize, "MIN_WEIGHTS", 0)
    monkeypatch.setattr(lean_llama, "_STACK_ROWS", 16)
    # The torch layers take the 50-row prompt in one product, the stack in 16-row
    # calls: both on the integer kernel (integer_build; AMX would take the long block in bf16).
    model = tiny_qwen2(len(qwen_tok), seed=6)
    quantize_int8(model, _file_like)
    assert quant_layer_count(model, bits=6) == 2 * len(model.model.layers) + 1
    net = TargetRunner(model).net
    assert net.stack is not None
    stack = net.stack

    def run(use_stack: bool) -> torch.Tensor:
        net.stack = stack if use_stack else None
        net.reset()
        out = [net.forward(list(range(100, 150)))[0], net.forward([7])[0], net.forward([8, 9, 10, 11, 12])[0]]
        net.rollback(52)
        out += [net.forward([13, 14])[0], net.forward([15])[0]]
        assert net.length == 55
        return torch.cat(out)

    # Both ways read one fp16 cache, but a key the two ways' products round apart by
    # a last bit can land on either side of an fp16 step: 5e-3, where a wrong bias or
    # RoPE is off by tenths.
    torch.testing.assert_close(run(True), run(False), atol=5e-3, rtol=5e-3)
    _fp16_cache(monkeypatch, model)
    with torch.inference_mode():
        reference = model(torch.tensor([list(range(100, 150))])).logits[0]
    net.reset()
    torch.testing.assert_close(net.forward(list(range(100, 150)))[0], reference, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("who", ["target", "drafter"])
def test_a_read_that_needs_its_last_rows_only_gives_them_and_the_cache_bit_for_bit(
        who, qwen_tok, monkeypatch, integer_build):
    """The stack's last layer stops at the keys and values for rows whose output
    no one reads (a prompt's but its last): the rows asked for, in 16-row calls
    with them spanning three, and the steps after, are those of reading every row."""
    from omnidraft.core.models import lean_llama
    from omnidraft.core.models.target_runtime import TargetRunner

    monkeypatch.setattr(lean_llama, "_STACK_ROWS", 16)
    if who == "target":
        monkeypatch.setattr(quantize, "MIN_WEIGHTS", 0)
        model = tiny_qwen2(len(qwen_tok), seed=6)
        quantize_int8(model, _file_like)
        net = TargetRunner(model).net
    else:
        from tests.tiny import tiny_llama

        net = lean_llama.LeanLlama(tiny_llama(len(qwen_tok), seed=3), int8=True, int4=True)
    assert net.stack is not None
    prompt = list(range(100, 150))
    for last in (1, 20):
        net.reset()
        every = net.forward(prompt)
        after_every = net.forward([7, 8])
        net.reset()
        some = net.forward(prompt, last=last)
        assert all(torch.equal(a[-last:], b) for a, b in zip(every, some, strict=True))
        assert all(torch.equal(a, b) for a, b in zip(after_every, net.forward([7, 8]), strict=True))


@pytest.mark.skipif(not kernel_build.amx_rows(), reason="no AMX tiles here (CPU or OS)")
def test_a_prompt_read_before_gives_a_4_bit_target_the_logits_a_fresh_read_gives(qwen_tok, monkeypatch):
    """On AMX a long prompt's rows run in bf16 and a short block's in integers, so
    a kept prefix leaves a long block to recompute: the benchmark's methods one
    after another, a regenerated reply, pick their first token from the same bits
    as a fresh prompt read."""
    from omnidraft.core.models.target_runtime import TargetRunner

    monkeypatch.setattr(quantize, "MIN_WEIGHTS", 0)
    model = tiny_qwen2(len(qwen_tok), seed=6)
    quantize_int8(model, _file_like)
    prompt = list(range(100, 150))
    runner = TargetRunner(model)
    assert runner.net.fresh_rows == kernel_build.amx_rows()
    first = runner.session()
    first.forward(prompt, last=1)
    first.forward([7, 8, 9])  # the reply's steps
    again = runner.session()
    got = again.forward(prompt, last=1)
    assert again.reused == len(prompt) - kernel_build.amx_rows()
    assert torch.equal(got, TargetRunner(model).session().forward(prompt, last=1))


@pytest.mark.parametrize("build", ["llama", "qwen2", "llama+adapter", "llama+q4k"])
def test_the_drafters_one_call_decoder_stack_computes_what_its_torch_layers_compute(build, qwen_tok, either_build):
    """The drafter's 4-bit layers run as one kernel call (kernels.stack.DecoderStack); the
    same layers as torch ops are the reference: a prompt, one-token steps, a
    several-token re-sync and a rollback, Qwen2's q/k/v biases included, and a
    learned adapter beside the weights (one projection left without one)."""
    from omnidraft.core.models.lean_llama import LeanLlama

    from tests.tiny import tiny_llama

    model = tiny_llama(len(qwen_tok), seed=3) if build.startswith("llama") else tiny_qwen2(len(qwen_tok), seed=3)
    layout = layouts.Q4_K if "q4k" in build else layouts.Q4_1  # the bench's --draft q4k=1: the drafter on Q4_K's grid
    net = LeanLlama(model, int8=True, int4=True, adapter=_adapter(model) if "adapter" in build else None, layout=layout)
    assert net.stack is not None and net.head.kernel_weights[1] == layout
    stack = net.stack

    def run(use_stack: bool) -> torch.Tensor:
        net.stack = stack if use_stack else None
        net.reset()
        # 41 prompt rows: blocks of four and one row left over, as the adapter's side path takes them
        out = [net.forward(list(range(100, 141)))[0], net.forward([7])[0], net.forward([8, 9, 10])[0]]
        net.rollback(42)
        out += [net.forward([11, 12])[0], net.forward([13])[0]]
        assert net.length == 45
        return torch.cat(out)

    # Both ways read one fp16 cache, but a key the two ways' products round apart by
    # a last bit can land on either side of an fp16 step: 5e-3, where a wrong bias or
    # RoPE is off by tenths.
    torch.testing.assert_close(run(True), run(False), atol=5e-3, rtol=5e-3)


def test_a_4_bit_head_over_the_first_ids_gives_the_full_heads_bits_there(qwen_tok):
    """The drafter's shorter LM head (DraftSettings.head_tokens) keeps rows whole: each
    token's logit is the full 4-bit head's, bit for bit, after a prompt and a step."""
    from omnidraft.core.models.lean_llama import LeanLlama

    from tests.tiny import tiny_llama

    model = tiny_llama(len(qwen_tok), seed=3)
    full, short = (LeanLlama(model, int8=True, int4=True, head_rows=rows) for rows in (None, 2048))
    assert short.head.kernel_weights is not None
    for net in (full, short):
        net.reset()
    for ids in (list(range(100, 141)), [7]):
        wide, narrow = full.forward(ids)[0], short.forward(ids)[0]
        assert narrow.shape[-1] == 2048 and torch.equal(narrow, wide[:, :2048])


@pytest.mark.parametrize("build", ["llama+adapter", "qwen2"])
def test_the_one_call_stack_gives_the_same_bits_on_any_number_of_threads(build, qwen_tok, either_build):
    """The stack's threads split every loop and product between them and meet at the
    kernel's own barrier: the logits of a prompt, a step and a re-sync are the same
    bits on one thread, two, and more threads than this machine has CPUs (where a
    waiter must not hold the CPU of the thread it waits for)."""
    from omnidraft.core.models.lean_llama import LeanLlama

    from tests.tiny import tiny_llama

    model = tiny_llama(len(qwen_tok), seed=4) if build.startswith("llama") else tiny_qwen2(len(qwen_tok), seed=4)
    net = LeanLlama(model, int8=True, int4=True, adapter=_adapter(model) if "adapter" in build else None)
    assert net.stack is not None

    def run(threads: int) -> torch.Tensor:
        torch.set_num_threads(threads)
        net.reset()
        return torch.cat([net.forward(list(range(100, 141)))[0], net.forward([7])[0], net.forward([8, 9, 10])[0]])

    before = torch.get_num_threads()
    try:
        one = run(1)
        for threads in (2, (os.cpu_count() or 2) + 1):
            assert torch.equal(run(threads), one), threads
    finally:
        torch.set_num_threads(before)


# The generic build with heads of 16 only: its attention takes no other path for 64.
@pytest.mark.parametrize("window, head_dim, build", [(0, 16, None), (40, 16, None), (0, 64, None), (40, 64, None),
                                                     (0, 16, "generic"), (40, 16, "generic")])
def test_attention_past_a_softmax_part_keeps_its_bits_on_any_number_of_threads(window, head_dim, build):
    """Past 256 positions a query's softmax runs in parts folded in order; where the
    key/value heads do not split evenly between the threads (SmolLM2's 3 on 2) a
    step's tasks are a head's parts, merged after. A long prompt, a block of rows
    across a part's edge and a step past a third part give the same bits on 1, 2 and
    3 threads; the block gives its rows' one-token steps' bits (what keeps
    verification lossless) and everything stays what the torch layers compute,
    with a drafter's window too (the last rows read parts 0 and 2 only). Heads of
    64 take attention's bf16 multiply-adds where the CPU has them (odd blocks of
    positions padded to pairs), so within bf16's rounding of the torch layers. The
    generic build (its own attention loop) keeps the same properties."""
    from omnidraft.core.models.lean_llama import LeanLlama

    from tests.tiny import tiny_llama

    # A small vocabulary: the logits' product is not what is tested, and at a real
    # one's 152k rows it was most of the test's time.
    net = LeanLlama(tiny_llama(4096, seed=5, kv_heads=3, head_dim=head_dim), int8=True, int4=True,
                    max_len=1024, window=window)
    stack = net.stack
    assert stack is not None and net.n_kv == 3
    ids = torch.randint(100, 4000, (560,), generator=torch.Generator().manual_seed(5)).tolist()

    def run(threads: int, use_stack: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        torch.set_num_threads(threads)
        net.stack = stack if use_stack else None
        net.reset()
        out = [net.forward(ids[:252])[0], net.forward(ids[252:258])[0]]  # the block spans 252..257
        net.rollback(252)
        singles = torch.cat([net.forward([t])[0] for t in ids[252:258]])
        out += [net.forward(ids[258:559])[0], net.forward(ids[559:560])[0]]  # 20 blocks of rows; 3 parts
        return torch.cat(out), singles

    chosen = contextlib.ExitStack()
    if build:
        chosen.enter_context(kernel_build.use_build(build))
    before = torch.get_num_threads()
    try:
        one, singles = run(1)
        assert torch.equal(one[252:258], singles)
        for threads in (2, 3):
            got, got_singles = run(threads)
            assert torch.equal(got, one) and torch.equal(got_singles, singles), threads
        reference, _ = run(1, use_stack=False)
    finally:
        torch.set_num_threads(before)
        net.stack = stack
        chosen.close()
    # The two ways sum attention in another order, so a key or value can round
    # to the neighbouring fp16 step in the shared cache, and the next product's
    # int8 activations (or bf16 ones: attention for heads of 64 on AVX512-BF16,
    # AMX tiles for a prompt's blocks) can then round a step apart: ~1-2% of a
    # row, on any build. A wrong RoPE, bias or softmax part is off by tenths.
    close = 3e-2
    torch.testing.assert_close(one, reference, atol=close, rtol=close)


def test_attention_multiplies_in_bf16_where_the_cpu_has_it(qwen_tok):
    """On a CPU with AVX512-BF16 the default build takes attention's multiply-adds in
    bf16 for heads of 64 and 128: the logits stay within bf16's rounding of the
    float32 multiply-adds' (the avx512vnni build's, same products), and move from
    them, so the bf16 path ran; heads of 16 keep the float32 path, the same bits.
    The avx512bf16 build is compared, not amx: amx's tiles take a prompt's products
    in bf16 too, which would move heads of 16 as well."""
    from omnidraft.core.models.lean_llama import LeanLlama

    from tests.tiny import tiny_llama

    if "avx512bf16" not in kernel_build.runnable_isas():
        pytest.skip("no AVX512-BF16 here")
    ids = torch.randint(100, 4000, (300,), generator=torch.Generator().manual_seed(6)).tolist()
    for head_dim in (64, 16):
        net = LeanLlama(tiny_llama(len(qwen_tok), seed=6, kv_heads=3, head_dim=head_dim), int8=True, int4=True,
                        max_len=512)
        logits = {}
        for isa in ("avx512bf16", "avx512vnni"):
            with kernel_build.use_build(isa):
                net.reset()
                logits[isa] = torch.cat([net.forward(ids[:299])[0], net.forward(ids[299:])[0]])
        bf16, float32 = logits.values()
        if head_dim == 16:
            assert torch.equal(bf16, float32)
        else:
            assert not torch.equal(bf16, float32)
            spread = float(float32.abs().max())  # bf16 keeps 8 bits: ~0.4% of each input, through two layers
            torch.testing.assert_close(bf16, float32, atol=2e-2 * spread, rtol=0)


def test_a_learned_adapter_runs_beside_the_4_bit_weights_and_keeps_its_effect(qwen_tok):
    """Rounded into 4 bits with the weights, a small learned change would mostly
    vanish (git show 524cea4:scripts/adapter_rounding.py); beside them it moves the logits as it
    does in float. An int8 drafter takes it merged."""
    from omnidraft.core.models.lean_llama import LeanLlama

    from tests.tiny import tiny_llama

    model = tiny_llama(len(qwen_tok), seed=4)
    adapter = _adapter(model, rank=2, scale=0.02, skip="none")  # changes weights by half a 4-bit step at most
    ids = list(range(100, 160))

    def change(**kind) -> torch.Tensor:
        return (LeanLlama(model, adapter=adapter, **kind).forward(ids)[0]
                - LeanLlama(model, **kind).forward(ids)[0]).flatten()

    wanted = change()
    beside = LeanLlama(model, int8=True, int4=True, adapter=adapter)
    assert all(p.low_rank is not None and p.packed4 is not None for layer in beside.layers for p in layer[1::3][:1])
    # Beside the 4-bit weights: 0.81; merged into int8: 0.74; merged into 4 bits the
    # script measures ~0.25-0.46 for changes this size.
    assert torch.nn.functional.cosine_similarity(change(int8=True, int4=True), wanted, dim=0) > 0.75
    assert torch.nn.functional.cosine_similarity(change(int8=True), wanted, dim=0) > 0.65


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # random bytes: some fp16 scales are NaN
@pytest.mark.parametrize("file_type, read", [(layouts.Q4_K, layouts.read_q4_k), (layouts.Q6_K, layouts.read_q6_k),
                                             (layouts.Q5_0, layouts.read_q5_0), (layouts.Q8_0, layouts.read_q8_0)])
def test_a_large_matrix_read_a_slice_of_rows_at_a_time_packs_to_the_same_bytes(file_type, read, monkeypatch):
    """A file's matrix read and packed a slice of rows at a time (the last slice
    shorter) is byte for byte the whole matrix read and packed at once, and its
    form runs as a QuantLinear of the same layout."""
    n, k = 80, 512
    weights, block = layouts._FILE_BLOCKS[file_type]
    raw = torch.randint(0, 256, (n * k // weights * block + 64,), generator=torch.Generator().manual_seed(3),
                        dtype=torch.uint8).numpy().tobytes()
    whole = read(raw, 64, n, k)
    monkeypatch.setattr(layouts, "PACK_WEIGHTS", 32 * k)  # slices of 32 rows: 32, 32, 16
    sliced = layouts.read_packed(read, file_type, raw, 64, n, k)
    assert (sliced.kind, sliced.bits) == (whole.kind, whole.bits)
    assert torch.equal(sliced.packed(), whole.packed())
    layer = quant_linear(torch.nn.Linear(k, n, bias=False), sliced)
    assert layer.kind == whole.kind and layer.kernel_weights[0] is sliced.data
