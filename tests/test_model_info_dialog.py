"""Targets → Model info… in the window: the request goes to the engine, the answer
with the same id fills the dialog, and an error answering it shows there (not in
the window's banner). The worker's side is in test_worker and test_model_info."""

from __future__ import annotations

from omnidraft.app.main_window import MainWindow
from omnidraft.app.model_info_dialog import count, rows
from omnidraft.core.models.catalog import ModelEntry
from omnidraft.core.models.model_info import ModelInfo
from omnidraft.core.worker.protocol import (
    DescribeTarget,
    ErrorEvent,
    ModelLoaded,
    TargetDescribed,
    WorkerReady,
)

from tests.gui_helpers import IdleWorker, ScriptedWorker, dispose

QWEN = ModelInfo(
    model_id="qwen", name="Qwen2.5-Coder-1.5B-Instruct", architecture="qwen2", parameters=1_543_714_304,
    quantization="Q4_K_M GGUF file (weights 76% Q4_K, 24% Q6_K)", runs_as="4-bit weights in 168 layers, 6-bit in 29 (as in the file; amx kernel), float32 activations",
    context_length=32_768, context_used=7_680, tokenizer_size=151_665,
    drafter="SmolLM2-135M-Instruct", drafter_vocab=49_152, direct_mapped=40_960, ngram_entries=1_234,
)


def model_info_action(win):
    return next(a for a in win.targets_menu.actions() if a.text() == "Model info…")


def test_what_the_dialog_says_of_a_cross_vocabulary_target():
    shown = dict(rows(QWEN))
    assert shown["Parameters"] == "1.54 billion (1,543,714,304)"
    assert shown["Stored as"] == "Q4_K_M GGUF file (weights 76% Q4_K, 24% Q6_K)"
    assert shown["Runs here as"] == QWEN.runs_as
    assert shown["Context length"] == "32,768 tokens; a chat gets the latest 7,680"
    assert shown["Tokenizer"] == "151,665 tokens"
    assert shown["Drafter"] == "SmolLM2-135M-Instruct (49,152 tokens)"
    assert shown["Direct mapping"].startswith("83.3% of the drafter's tokens (40,960 of 49,152)")
    assert shown["Learned n-grams"].startswith("1,234 drafter-to-target token runs")
    assert count(135_000_000) == "135 million" and count(999) == "999"


def test_same_vocabulary_and_drafting_off_are_said_plainly():
    from dataclasses import replace

    same = dict(rows(replace(QWEN, same_vocabulary=True, direct_mapped=49_152)))
    assert same["Vocabularies"].startswith("the same tokenizer as the target")
    assert "Direct mapping" not in same
    off = dict(rows(replace(QWEN, drafter=None, drafter_vocab=0, direct_mapped=0)))
    assert off["Drafter"] == "none: drafting is off for this model" and "Direct mapping" not in off


def test_model_info_is_asked_for_and_the_answer_with_its_id_fills_the_dialog(home, qapp, qt_loop):
    worker = ScriptedWorker()
    win = MainWindow(target="qwen", handle=worker)
    try:
        assert not model_info_action(win).isEnabled()  # nothing loaded yet
        win.on_event(WorkerReady(1, [ModelEntry("qwen", QWEN.name, "/q.gguf")]))
        load = worker.sent[-1]
        win.on_event(ModelLoaded(load.request_id, "qwen", QWEN.name, 0.1, "SmolLM2"))
        model_info_action(win).trigger()
        ask = worker.sent[-1]
        dialog = win.model_info.dialog
        assert isinstance(ask, DescribeTarget) and dialog.isVisible()
        assert dialog.note.text().startswith("Asking the engine")
        win.on_event(TargetDescribed(ask.request_id + 100, QWEN))  # not ours: ignored
        assert dialog.texts() == {}
        win.on_event(TargetDescribed(ask.request_id, QWEN))
        assert dialog.texts() == dict(rows(QWEN)) and dialog.note.text() == ""

        model_info_action(win).trigger()  # asked again: the error answering it shows in the dialog
        again = worker.sent[-1]
        win.on_event(ErrorEvent(again.request_id, "No model is loaded yet."))
        assert dialog.note.text() == "No model is loaded yet." and dialog.texts() == {}
        assert "No model is loaded yet." not in win.banner.text()
        win.on_event(ErrorEvent(None, "Learning stopped: adapter exploded"))  # not ours
        assert "Learning stopped" in win.banner.text() and dialog.note.text() == "No model is loaded yet."
    finally:
        win.close()
        dispose(qapp, win)


def test_without_a_running_engine_the_dialog_says_so(home, qapp, qt_loop):
    win = MainWindow(target="qwen", handle=IdleWorker())
    try:
        win.targets_menu.set_current("qwen")
        model_info_action(win).trigger()
        assert win.model_info.dialog.note.text().startswith("The engine is not running")
    finally:
        win.close()
        dispose(qapp, win)
