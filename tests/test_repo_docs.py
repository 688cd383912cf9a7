"""The repository's docs describe the product: every result file a doc cites is
there, every kept result file is cited, and no doc, comment or test reads as a
work log (dated entries, ordinals of past stretches of work, issue numbers)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
CITATION = re.compile(r"(?<![:\w/])(?:docs/)?results/([\w.\-]+\.(?:json|jsonl|csv|png|txt)(?:\.gz)?)")
# Files a user or maintainer reads: docs, code, tests, build files.
SOURCES = ["README.md", "Makefile", "pyproject.toml", ".ci/run", "docs", "eval", "core", "app", "bench",
           "tools", "tests", "omnidraft", "packaging", "resources"]
WORK_LOG = [
    re.compile(r"\b(?:first|second|third|fourth|fifth|\w+(?:tieth|teenth)|\w+-\w+(?:th|st|nd|rd))\s+session",
               re.IGNORECASE),
    re.compile(r"\bsessions? \d+\b", re.IGNORECASE),
    re.compile(r"\bissues? #?\d+\b", re.IGNORECASE),
    re.compile(r"\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* \d{1,2}(?:st|nd|rd|th)?\b(?!\.\d)"),
]


def _texts(suffixes=(".md", ".py", ".c", ".h", ".toml", "")):
    for name in SOURCES:
        path = ROOT / name
        files = [path] if path.is_file() else sorted(path.rglob("*")) if path.is_dir() else []
        for file in files:
            if file.is_file() and file.suffix in suffixes and "results" not in file.parts :
                yield file, file.read_text(encoding="utf-8", errors="replace")


def _cited() -> dict[str, list[str]]:
    cited: dict[str, list[str]] = {}
    for file, text in _texts():
        for name in CITATION.findall(text):
            cited.setdefault(name, []).append(str(file.relative_to(ROOT)))
    return cited


def test_every_result_file_a_doc_cites_exists():
    missing = {name: where for name, where in _cited().items() if not (RESULTS / name).is_file()}
    assert not missing, missing


def test_every_kept_result_file_is_cited_by_a_doc():
    kept = {p.name for p in RESULTS.iterdir()} if RESULTS.is_dir() else set()
    assert not kept - set(_cited()), sorted(kept - set(_cited()))
    # A curated set: each CPU class's bench runs, the step times, the 7B
    # simulation, the server, the learning runs, the stream and the ceilings.
    assert len(kept) <= 15


# A doc a reader finishes: the product as it is today, not the history of it.
DOC_LINES = {"README.md": 165, "docs/performance.md": 325, "docs/learning.md": 225}


@pytest.mark.parametrize("name", sorted(DOC_LINES))
def test_docs_stay_short_enough_to_read(name):
    lines = len((ROOT / name).read_text(encoding="utf-8").splitlines())
    assert lines <= DOC_LINES[name], f"{name}: {lines} lines"


def test_nothing_reads_as_a_work_log():
    hits = []
    for file, text in _texts():
        if file.resolve() == Path(__file__).resolve() or file.name == "method.md":
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if any(p.search(line) for p in WORK_LOG):
                hits.append(f"{file.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits[:40]) + f"\n({len(hits)} lines)"
