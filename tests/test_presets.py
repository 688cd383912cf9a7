"""Named presets (system prompt plus sampling): the shipped ones, the user's own
kept in the settings, and choosing, saving, renaming and deleting them in Settings."""

from __future__ import annotations

import pytest
from omnidraft.core.storage.presets import BUILT_IN, all_presets
from omnidraft.core.storage.settings import Settings, load_settings, save_settings


def test_shipped_presets_include_precise_code_and_creative():
    by_name = {p.name: p for p in BUILT_IN}
    assert by_name["Precise code"].temperature == 0.0  # greedy: plain decoding's reply
    creative = by_name["Creative"]
    assert creative.temperature > 0 and creative.min_p > 0 and creative.repetition_penalty > 1
    for preset in BUILT_IN:  # each is within the settings' own ranges
        _, problems = Settings().updated(**preset.values())
        assert not problems, preset.name


def test_new_sampling_controls_default_to_changing_nothing():
    s = Settings()
    assert (s.top_k, s.min_p, s.repetition_penalty, s.learning_on_battery) == (0, 0.0, 1.0, False)


def test_user_presets_are_saved_and_loaded_with_the_settings(home):
    mine = {"name": "Terse", "system_prompt": "Answer in one line.", "temperature": 0.3, "top_p": 0.9,
            "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.15}
    settings, problems = Settings().updated(presets=[mine], top_k=40, min_p=0.1, repetition_penalty=1.2)
    assert not problems
    save_settings(settings)
    loaded, problems = load_settings()
    assert not problems
    assert loaded.presets == (mine,) and (loaded.top_k, loaded.min_p, loaded.repetition_penalty) == (40, 0.1, 1.2)
    assert [p.name for p in all_presets(loaded.presets)][-1] == "Terse"


def test_damaged_presets_are_corrected_or_left_out_with_a_sentence():
    raw = [{"name": "Hot", "temperature": 9, "top_k": "many"}, {"name": "Creative"}, "junk", {"name": " "}]
    settings, problems = Settings().updated(presets=raw)
    assert [p["name"] for p in settings.presets] == ["Hot"]  # a shipped name or no name: left out
    assert settings.presets[0]["temperature"] == 2.0 and settings.presets[0]["top_k"] == 0
    assert problems and "presets" in problems[0] and "Error" not in problems[0]
    settings, problems = Settings().updated(presets="nonsense")
    assert settings.presets == () and problems


@pytest.fixture
def dialog(qtbot, monkeypatch):
    from omnidraft.app import settings_dialog
    from PySide6.QtWidgets import QMessageBox

    told = []
    monkeypatch.setattr(QMessageBox, "warning", lambda *a, **k: told.append(a[2]))
    monkeypatch.setattr(QMessageBox, "information", lambda *a, **k: told.append(a[2]))
    box = settings_dialog.SettingsDialog(Settings(), "/somewhere")
    qtbot.addWidget(box)
    box.told = told
    return box


def test_settings_show_the_new_controls_and_change_nothing_untouched(dialog):
    assert dialog.changes() == {}
    dialog.top_k.setValue(40)
    dialog.min_p.setValue(0.05)
    dialog.repetition_penalty.setValue(1.1)
    dialog.learn_on_battery.setChecked(True)
    assert dialog.changes() == {"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "learning_on_battery": True}
    assert dialog.top_k.specialValueText() == "Off" and dialog.top_k.minimum() == 0


def test_choosing_a_preset_fills_the_prompt_and_sampling(dialog):
    dialog.apply_preset("Creative")
    creative = next(p for p in BUILT_IN if p.name == "Creative")
    changes = dialog.changes()
    assert changes["system_prompt"] == creative.system_prompt
    assert (changes["temperature"], changes["min_p"], changes["repetition_penalty"]) == (
        creative.temperature, creative.min_p, creative.repetition_penalty)
    assert dialog.preset.currentData() == "Creative"


def test_save_rename_and_delete_a_preset(dialog):
    dialog.temperature.setValue(0.4)
    dialog.top_k.setValue(12)
    dialog.system_prompt.setPlainText("Be brief.")
    assert dialog.save_preset("Brief")
    assert not dialog.save_preset("precise code")  # a shipped name, in any case
    assert "already a preset" in dialog.told[-1]
    saved = dialog.changes()["presets"]
    assert saved == ({"name": "Brief", "system_prompt": "Be brief.", "temperature": 0.4, "top_p": 1.0,
                      "top_k": 12, "min_p": 0.0, "repetition_penalty": 1.0},)
    assert Settings().updated(presets=saved)[1] == []  # what the dialog saves, the store takes as is

    dialog.apply_preset("Precise code")
    assert not dialog.rename_preset("Mine") and not dialog.delete_preset()  # shipped ones stay
    dialog.apply_preset("Brief")
    assert dialog.temperature.value() == pytest.approx(0.4) and dialog.top_k.value() == 12
    assert dialog.rename_preset("Short")
    assert [p["name"] for p in dialog.changes()["presets"]] == ["Short"]
    assert dialog.preset.currentData() == "Short"
    assert dialog.delete_preset()
    assert "presets" not in dialog.changes()  # back to none of the user's own
    assert dialog.preset.findData("Short") == -1 and dialog.preset.findData("Creative") > 0
