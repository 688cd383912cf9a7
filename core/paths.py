"""Where user data lives: platformdirs' user dirs, or all of it under $OMNIDRAFT_HOME.

Tests and benchmarks point OMNIDRAFT_HOME at a temporary folder so they never
touch a person's real data.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "omnidraft"
HOME_ENV = "OMNIDRAFT_HOME"


def _root(kind: str) -> Path:
    home = os.environ.get(HOME_ENV)
    if home:
        path = Path(home).expanduser() / kind
    elif kind == "data":
        path = Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    elif kind == "cache":
        path = Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))
    else:
        path = Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_dir() -> Path:
    """Conversations, learned state (adapters, caches, replay buffers), catalog."""
    return _root("data")


def cache_dir() -> Path:
    """Re-creatable files: converted model weights."""
    return _root("cache")


def config_dir() -> Path:
    """Settings."""
    return _root("config")


def all_roots() -> list[Path]:
    return [data_dir(), cache_dir(), config_dir()]
