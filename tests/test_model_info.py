"""Model info: what the loaded target is and how the drafter's vocabulary maps onto
it, computed in core from the loaded models and the file they came from."""

from __future__ import annotations

import gguf
import pytest
from omnidraft.core.decoding.vocab_bridge import VocabBridge, token_bytes
from omnidraft.core.engine import Engine, InputError
from omnidraft.core.models.catalog import QWEN05_ID, ModelCatalog, ModelEntry, bundled_path
from omnidraft.core.models.gguf_header import read_header
from omnidraft.core.models.loader import LoadedModel
from omnidraft.core.models.model_info import describe, gguf_quantization

from tests.tiny import tiny_engine, tiny_llama, tiny_qwen2, write_tiny_gguf


def test_gguf_header_reads_what_ggufs_own_reader_reads(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    header = read_header(path)
    reader = gguf.GGUFReader(str(path))
    assert [(t.name, t.ggml_type, t.n_elements) for t in header.tensors] == [
        (t.name, int(t.tensor_type), int(t.n_elements)) for t in reader.tensors
    ]
    assert header.metadata["general.architecture"] == "llama"
    assert header.metadata["general.name"] == "Tiny Downloaded"
    assert header.metadata["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q8_0
    assert header.metadata["tokenizer.ggml.tokens"] == 100  # an array reads as its length
    (tmp_path / "junk.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 20)
    with pytest.raises(ValueError, match="damaged GGUF header"):
        read_header(tmp_path / "junk.gguf")


def test_quantization_says_what_a_file_declares_and_what_its_weights_are(tmp_path):
    # 100x2560 F32 embedding, 64x256 Q8_0 matrix: 94% and 6% of the weights.
    declared = write_tiny_gguf(tmp_path / "q8.gguf")
    assert gguf_quantization(declared) == "Q8_0 GGUF file (weights 94% F32, 6% Q8_0)"
    silent = write_tiny_gguf(tmp_path / "plain.gguf", file_type=None)
    assert gguf_quantization(silent) == "GGUF file (weights 94% F32, 6% Q8_0)"


def test_a_bundled_q4_k_m_file_shows_its_real_mix(qwen_tok):
    """Qwen2.5-Coder-0.5B's rows (896) are not multiples of 256, so its 'Q4_K_M'
    file holds mostly Q5_0 weights; the header says both (qwen_tok assembled it)."""
    path = bundled_path(QWEN05_ID)
    assert gguf_quantization(path).startswith("Q4_K_M GGUF file (weights 62% Q5_0, 22% Q8_0")
    header = read_header(path)
    assert header.metadata["general.architecture"] == "qwen2"
    assert header.metadata["tokenizer.ggml.tokens"] == 151936
    assert len(header.tensors) == 24 * 12 + 3  # 24 layers; embedding, output, final norm


@pytest.fixture(scope="module")
def engine(tmp_path_factory, qwen_tok) -> Engine:
    """A tiny Qwen2 target (Qwen's tokenizer) with the tiny SmolLM2-vocabulary drafter."""
    folder = tmp_path_factory.mktemp("models") / "tiny-qwen-info"
    return tiny_engine(folder, tiny_qwen2(len(qwen_tok), seed=4), qwen_tok)


def test_target_info_and_its_relation_to_the_drafter(engine, qwen_tok, smol_tok):
    info = engine.describe_target()
    model = engine.target.model
    assert info.model_id == engine.target.entry.id and info.name == engine.target.entry.name
    assert info.architecture == "qwen2"
    assert info.parameters == sum(p.numel() for p in model.parameters())
    assert info.quantization == "float32 (not quantized)" and info.runs_as == "float32"
    assert info.context_length == 2048 and info.context_used == engine.context_limit() < 2048
    assert info.tokenizer_size == len(qwen_tok)
    assert info.drafter == engine.drafter_model.entry.name
    assert info.drafter_vocab == len(smol_tok) and not info.same_vocabulary
    # Counted independently: drafter tokens whose bytes some Qwen token has too.
    qwen_spellings = {b for b in token_bytes(qwen_tok) if b}
    shared = sum(1 for b in token_bytes(smol_tok) if b and b in qwen_spellings)
    assert info.direct_mapped == shared and 0.5 < info.direct_share < 1.0
    assert info.ngram_entries == len(engine.bridge.cache)


def test_without_drafting_the_relation_is_left_out(engine):
    target = engine.target
    info = describe(target, 100)
    assert info.drafter is None and info.direct_share == 0.0 and info.tokenizer_size > 0


def test_a_gguf_target_reports_its_file(tmp_path, smol_tok):
    """The quantization comes from the file the target was loaded from."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    entry = ModelEntry("tiny-gguf", "Tiny GGUF", str(path))
    same = LoadedModel(entry, tiny_llama(len(smol_tok)), smol_tok, 0.0)
    info = describe(same, 1536, same, VocabBridge(smol_tok, smol_tok))
    assert info.quantization == "Q8_0 GGUF file (weights 94% F32, 6% Q8_0)"
    assert info.architecture == "llama" and info.same_vocabulary
    assert info.direct_mapped == sum(1 for b in token_bytes(smol_tok) if b)


def test_no_model_loaded_is_a_clear_error(home):
    with pytest.raises(InputError, match="No model is loaded yet"):
        Engine(ModelCatalog()).describe_target()


def test_a_kernel_build_asked_for_by_name_that_this_cpu_cannot_run_is_named(monkeypatch):
    from omnidraft.core.kernels import build

    monkeypatch.setenv("OMNIDRAFT_KERNEL_ISA", "avx1024")
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c"}))
    build.forget_builds()
    try:
        assert build.kernel_isa() is None
        assert build.unavailable() == ("The 4-bit kernels cannot run here: OMNIDRAFT_KERNEL_ISA=avx1024 is not "
                                       "a build this CPU runs (avx2, generic).")
    finally:
        build.forget_builds()


def test_a_cpu_without_avx2_runs_the_portable_kernel_build(monkeypatch):
    from omnidraft.core.kernels import build

    for flags, isa in ((frozenset({"sse2", "avx"}), None), (frozenset({"avx2", "fma", "f16c"}), "avx2")):
        monkeypatch.setattr(build, "cpu_flags", lambda flags=flags: flags)
        build.forget_builds()
        try:
            assert build.runnable_isas() == ([isa] if isa else []) + ["generic"]
            if isa is None:
                assert build.kernel_isa() == "generic" and build.unavailable() is None
        finally:
            build.forget_builds()
