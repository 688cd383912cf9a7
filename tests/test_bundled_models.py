"""The bundled models load and generate (smoke: part of `make test`), and the
converted-weights cache survives interruption (integration)."""

import pytest
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine
from omnidraft.core.events import TurnFinished
from omnidraft.core.models import loader
from omnidraft.core.models.catalog import (
    BUNDLED,
    GEMMA_ID,
    QWEN05_ID,
    QWEN15_ID,
    SMOLLM2_ID,
    ModelCatalog,
    bundled_path,
)


@pytest.fixture(scope="module")
def engine():
    return Engine(drafter_id=SMOLLM2_ID)


@pytest.mark.smoke
@pytest.mark.parametrize("model_id", [QWEN15_ID, QWEN05_ID, GEMMA_ID, SMOLLM2_ID])
def test_bundled_model_loads_and_chats(engine, model_id):
    stages = []
    engine.load_target(model_id, lambda stage, frac: stages.append((stage, frac)))
    assert stages[-1][1] == 1.0
    fractions = [f for _, f in stages]
    assert fractions == sorted(fractions)  # one progress bar that only moves forward
    events = list(engine.chat([{"role": "user", "content": "What is 2+2?"}], GenerationConfig(max_new_tokens=6)))
    done = events[-1]
    assert isinstance(done, TurnFinished)
    assert done.stats.method == "omnidraft"  # drafted by SmolLM2, across vocabularies for all but itself
    assert done.stats.new_tokens >= 1
    assert done.text.strip() or done.reason == "eos"


@pytest.mark.smoke
def test_converted_copy_is_reused():
    entry = BUNDLED[SMOLLM2_ID]
    folder = loader.weights_folder(entry)  # converted here unless a test before did
    assert folder == loader.converted_dir(entry, bundled_path(SMOLLM2_ID)) and loader.is_complete(folder)
    made = (folder / "model.safetensors").stat().st_mtime_ns
    assert loader.weights_folder(entry) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == made  # reused, not rewritten
    assert (loader.weights_folder(BUNDLED[GEMMA_ID]) / "GEMMA_TERMS.html").exists()


@pytest.mark.integration
def test_half_written_conversion_is_rebuilt(home):
    """A conversion killed half-way leaves a folder without the completion marker."""
    entry = ModelCatalog().get(SMOLLM2_ID)
    gguf = bundled_path(SMOLLM2_ID)
    folder = loader.converted_dir(entry, gguf)
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"truncated")
    loaded = loader.load(entry)
    assert loader.is_complete(folder)
    assert loaded.model.config.num_hidden_layers == 30
