"""The bundled models load straight from their GGUF files and generate (smoke:
part of `make test`)."""

import pytest
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine
from omnidraft.core.events import TurnFinished
from omnidraft.core.models.catalog import (
    GEMMA_ID,
    QWEN05_ID,
    QWEN15_ID,
    SMOLLM2_ID,
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
