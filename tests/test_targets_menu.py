"""The Targets menu tells a user what each model is and how big it is."""

from omnidraft.app.targets_menu import TargetsMenu, entry_label
from omnidraft.core.models.catalog import BUNDLED, DEFAULT_TARGET, GEMMA_ID, SMOLLM2_ID, ModelEntry


def test_bundled_entries_show_size_and_what_they_are(qapp):
    menu = TargetsMenu()
    menu.set_catalog(list(BUNDLED.values()))
    menu.set_current(DEFAULT_TARGET)
    labels = [a.text() for a in menu.actions() if a.isCheckable()]
    assert labels == [
        "Qwen2.5-Coder-1.5B-Instruct  (1.1 GB, chat and code; the default)",
        "Qwen2.5-Coder-0.5B-Instruct  (0.5 GB, smaller chat and code model)",
        "Gemma-3-270M (base)  (0.3 GB, base model: continues text, does not chat)",
        "SmolLM2-135M-Instruct  (0.1 GB, the drafter's own family (same tokenizer))",
    ]
    assert menu.checked_id() == DEFAULT_TARGET
    assert GEMMA_ID in BUNDLED and SMOLLM2_ID in BUNDLED


def test_a_local_model_without_a_description_is_marked_local():
    assert entry_label(ModelEntry("my-model", "my-model", "/m")) == "my-model  (local)"
    assert entry_label(ModelEntry("m", "m", "/m", size_bytes=2_500_000_000,
                                  description="local llama model")) == "m  (2.5 GB, local llama model)"
