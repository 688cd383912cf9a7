"""Settings: defaults, persistence, validation, a damaged file."""

import json
import os

import pytest
from omnidraft.core.storage.settings import Settings, load_settings, save_settings, settings_path


def test_defaults():
    s = Settings()
    assert (s.temperature, s.top_p, s.max_new_tokens, s.draft_length) == (0.0, 1.0, 512, 4)
    assert s.adaptive_gamma is None and s.idle_delay_s == 20.0 and s.learner_threads == 1
    assert s.learning_paused is False and s.speculative is True and s.highlight_drafts is False
    assert s.last_target == "qwen2.5-coder-1.5b-instruct"


def test_missing_file_gives_defaults_without_warnings(home):
    assert load_settings() == (Settings(), [])


def test_save_and_load_round_trip(home):
    s, problems = Settings().updated(temperature=0.7, adaptive_gamma=0.3, last_target="x-1")
    assert problems == []
    save_settings(s)
    assert settings_path().parent.name == "config"
    assert load_settings() == (s, [])


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("temperature", -1, 0.0),
        ("temperature", 9.0, 2.0),
        ("top_p", 0.0, 0.05),
        ("max_new_tokens", 10**9, 8192),
        ("max_new_tokens", 3.6, 4),
        ("draft_length", 0, 1),
        ("adaptive_gamma", 1.0, 0.95),
        ("idle_delay_s", -5, 1.0),
        ("learner_threads", 10_000, os.cpu_count()),
    ],
)
def test_out_of_range_values_are_clamped_and_reported(name, value, expected):
    s, problems = Settings.from_dict({name: value})
    assert getattr(s, name) == expected
    assert len(problems) == 1 and name in problems[0]


@pytest.mark.parametrize(
    "name, value",
    [
        ("temperature", "hot"),
        ("temperature", True),
        ("temperature", float("nan")),
        ("max_new_tokens", None),
        ("speculative", "yes"),
        ("last_target", ""),
        ("adaptive_gamma", "0.3"),
    ],
)
def test_wrong_types_fall_back_to_the_default(name, value):
    s, problems = Settings.from_dict({name: value})
    assert getattr(s, name) == getattr(Settings(), name)
    assert len(problems) == 1


def test_int_types_stay_int_and_unknown_keys_are_ignored():
    s, problems = Settings.from_dict({"max_new_tokens": 100.0, "from_the_future": 1})
    assert s.max_new_tokens == 100 and isinstance(s.max_new_tokens, int)
    assert problems == []
    _, problems = Settings().updated(nonsense=1)
    assert problems == ["Unknown setting 'nonsense' ignored."]


def test_hand_edited_file_with_bad_values_loads_with_warnings(home):
    settings_path().write_text(json.dumps({"temperature": 5, "speculative": "no"}))
    s, problems = load_settings()
    assert s.temperature == 2.0 and s.speculative is True
    assert len(problems) == 2
    assert settings_path().exists(), "a readable file is not quarantined"


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", "\xff\xfe"])
def test_corrupt_file_gives_defaults_warning_and_is_kept_aside(home, content):
    settings_path().write_bytes(content.encode("latin-1"))
    s, problems = load_settings()
    assert s == Settings()
    assert len(problems) == 1 and "damaged" in problems[0]
    assert not settings_path().exists()
    assert (settings_path().parent / "settings.json.corrupt").read_bytes() == content.encode("latin-1")


def test_theme_follows_the_system_by_default_and_old_files_still_load(home):
    assert Settings().theme == "system"
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"temperature": 0.5}))  # written before themes existed
    settings, problems = load_settings()
    assert (settings.theme, settings.temperature, problems) == ("system", 0.5, [])
    dark, problems = settings.updated(theme="dark")
    assert dark.theme == "dark" and not problems
    wrong, problems = settings.updated(theme="purple")
    assert wrong.theme == "system" and "theme" in problems[0]
