"""User settings, persisted as JSON in config_dir()/settings.json.

Every value is checked on load and on change: a wrong type falls back to the
default, an out-of-range number is clamped, and each correction is reported.
A file that is not JSON at all is moved aside (quarantined) and the defaults
are used, with a warning for the user.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..models.catalog import DEFAULT_TARGET
from . import paths
from .persistence import CorruptStateError, atomic_write_json, read_json
from .presets import check_presets

# (low, high) for each numeric setting. adaptive_gamma is the stop threshold γ of
# adaptive drafting (stop when 1 - Π P_accept > γ), a probability strictly inside (0, 1).
_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.05, 1.0),
    "top_k": (0, 1000),
    "min_p": (0.0, 1.0),
    "repetition_penalty": (1.0, 2.0),
    "max_new_tokens": (1, 8192),
    "draft_length": (1, 16),
    "adaptive_gamma": (0.05, 0.95),
    "idle_delay_s": (1.0, 3600.0),
    "learner_threads": (1, 64),
    "context_tokens": (0, 131072),
    "server_port": (1, 65535),
}

_FREE_TEXTS = {"system_prompt", "server_api_key"}  # texts that may be empty
_CHOICES = {"theme": ("system", "light", "dark")}  # texts that must be one of these


@dataclass(frozen=True)
class Settings:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # 1 = off
    max_new_tokens: int = 512
    draft_length: int = 4  # k: draft tokens proposed per step
    adaptive_gamma: float | None = None  # None = fixed draft length k
    idle_delay_s: float = 20.0  # learning starts after this long without a request
    learner_threads: int = 1
    learning_paused: bool = False
    learning_on_battery: bool = False  # idle learning waits for mains power (where a battery is sensed)
    last_target: str = DEFAULT_TARGET
    speculative: bool = True
    highlight_drafts: bool = False
    system_prompt: str = ""  # new chats start with it (each chat can change its own)
    # Context length in tokens (conversation and reply); 0 = the model's. The model's
    # own window bounds it (Engine.context_window).
    context_tokens: int = 0
    theme: str = "system"  # "system" follows the desktop's light or dark scheme; or "light", "dark"
    presets: tuple = ()  # the user's own presets (core.storage.presets), one dict each
    # Settings → Local server: the OpenAI-compatible server inside the app (server/).
    server_enabled: bool = False
    server_host: str = "127.0.0.1"  # another address only with server_api_key
    server_port: int = 8090
    server_api_key: str = ""  # "" = none; clients send it as "Authorization: Bearer <key>"
    learn_from_api: bool = False  # served turns enter the replay buffer like chat turns

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> tuple[Settings, list[str]]:
        """Settings from a (possibly hand-edited) dict, and what had to be corrected.

        Unknown keys are ignored so a newer version's file still loads.
        """
        defaults = cls()
        values: dict[str, Any] = {}
        problems: list[str] = []
        for f in fields(cls):
            if f.name not in raw:
                continue
            value, problem = _check(f.name, raw[f.name], getattr(defaults, f.name))
            values[f.name] = value
            if problem:
                problems.append(problem)
        return cls(**values), problems

    def updated(self, **changes: Any) -> tuple[Settings, list[str]]:
        """A copy with `changes` applied and checked."""
        unknown = sorted(set(changes) - {f.name for f in fields(self)})
        merged = {**self.to_dict(), **{k: v for k, v in changes.items() if k not in unknown}}
        settings, problems = Settings.from_dict(merged)
        return settings, [f"Unknown setting '{k}' ignored." for k in unknown] + problems


def _check(name: str, value: Any, default: Any) -> tuple[Any, str | None]:
    """(value to use, a sentence when it was corrected)."""
    if name == "adaptive_gamma" and value is None:
        return None, None
    if name == "presets":
        return check_presets(value, _check_number)
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value, None
        return default, f"Setting '{name}' must be true or false; using {default}."
    if name in _CHOICES:
        if value in _CHOICES[name]:
            return value, None
        return default, f"Setting '{name}' must be one of {', '.join(_CHOICES[name])}; using '{default}'."
    if name in _FREE_TEXTS:
        if isinstance(value, str):
            return value.strip(), None
        return default, f"Setting '{name}' must be a text; using '{default}'."
    if isinstance(default, str):
        if isinstance(value, str) and value.strip():
            return value.strip(), None
        return default, f"Setting '{name}' must be a non-empty text; using '{default}'."
    return _check_number(name, value, default)


def _check_number(name: str, value: Any, default: Any) -> tuple[Any, str | None]:
    want_int = isinstance(default, int)
    # bool is an int in Python, but `true` as a temperature is a mistake.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return default, f"Setting '{name}' must be a number; using {default}."
    low, high = _RANGES[name]
    if name == "learner_threads":
        high = min(high, os.cpu_count() or 1)
    clamped = min(max(value, low), high)
    clamped = round(clamped) if want_int else float(clamped)
    if clamped != value:
        return clamped, f"Setting '{name}' = {value} is outside {low}–{high}; using {clamped}."
    return clamped, None


def settings_path() -> Path:
    return paths.config_dir() / "settings.json"


def load_settings(path: Path | None = None) -> tuple[Settings, list[str]]:
    """The saved settings (defaults when there is no file) and warnings for the user."""
    path = Path(path or settings_path())
    try:
        raw = read_json(path, {})
        if not isinstance(raw, dict):
            raise CorruptStateError(path, "it does not hold a settings object")
    except CorruptStateError as exc:
        kept = exc.quarantine()
        return Settings(), [f"The settings file was damaged; defaults are used (kept as {kept.name})."]
    return Settings.from_dict(raw)


def save_settings(settings: Settings, path: Path | None = None) -> None:
    atomic_write_json(Path(path or settings_path()), settings.to_dict())
