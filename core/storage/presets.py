"""Named presets: a system prompt and the sampling controls, applied together.

A few ship with the app (BUILT_IN, never edited); the user's own are kept in
the settings (Settings.presets, one dict each) and checked on load like every
other setting.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

# The settings a preset sets, with the ranges Settings checks them against.
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
MAX_NAME = 60


@dataclass(frozen=True)
class Preset:
    name: str
    system_prompt: str = ""
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    def values(self) -> dict:
        """The settings it sets (Settings field -> value)."""
        out = asdict(self)
        del out["name"]
        return out


BUILT_IN = (
    # Greedy: the model's single most likely reply, exactly what plain decoding gives.
    Preset("Precise code", "You are a careful programming assistant. Answer with correct, complete code and "
           "brief explanations. Say so when you are unsure.", temperature=0.0),
    # Sampled, min-p keeping the tail sensible, a light penalty against loops.
    Preset("Creative", "You are an imaginative writing partner. Vary your wording and offer fresh ideas.",
           temperature=1.0, top_p=0.95, min_p=0.05, repetition_penalty=1.1),
    Preset("Balanced", "", temperature=0.7, top_p=0.9, top_k=40, min_p=0.05),
)


def all_presets(user: tuple[dict, ...]) -> list[Preset]:
    """The shipped presets, then the user's."""
    return list(BUILT_IN) + [Preset(**p) for p in user]


def is_built_in(name: str) -> bool:
    return any(p.name == name for p in BUILT_IN)


def name_problem(name: str, user: tuple[dict, ...], renaming: str | None = None) -> str | None:
    """Why `name` can't name a new preset (or `renaming` one), or None when it can."""
    name = name.strip()
    if not name:
        return "A preset needs a name."
    if len(name) > MAX_NAME:
        return f"A preset's name can be at most {MAX_NAME} characters."
    taken = {p.name.casefold() for p in BUILT_IN} | {p["name"].casefold() for p in user if p["name"] != renaming}
    if name.casefold() in taken:
        return f"There is already a preset called '{name}'."
    return None


def check_presets(value: Any, check_value) -> tuple[tuple[dict, ...], str | None]:
    """The user's presets from a saved value, and a sentence when some had to be
    corrected or left out. check_value(name, value, default) -> (value, problem)
    checks one sampling value as Settings does."""
    if not isinstance(value, (list, tuple)):
        return (), "Setting 'presets' must be a list of presets; none are kept."
    kept: list[dict] = []
    problems = 0
    names = {p.name.casefold() for p in BUILT_IN}
    defaults = Preset("")
    for raw in value:
        name = raw.get("name") if isinstance(raw, dict) else None
        if not isinstance(name, str) or not name.strip() or name.strip().casefold() in names:
            problems += 1
            continue
        preset = {"name": name.strip()[:MAX_NAME]}
        prompt = raw.get("system_prompt", "")
        preset["system_prompt"] = prompt.strip() if isinstance(prompt, str) else ""
        for f in fields(Preset):
            if f.name in SAMPLING:
                got, problem = check_value(f.name, raw.get(f.name, getattr(defaults, f.name)), getattr(defaults, f.name))
                preset[f.name] = got
                problems += problem is not None
        names.add(preset["name"].casefold())
        kept.append(preset)
    problem = (f"The saved presets had {problems} problem{'s' if problems != 1 else ''}; "
               "they were corrected or left out.") if problems else None
    return tuple(kept), problem
