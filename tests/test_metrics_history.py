"""The charts' history is saved on the GUI thread, so a save costs what changed
(app/metrics_history.py): appended lines, a rewrite only past the caps, and a
damaged file set aside rather than overwritten."""

from __future__ import annotations

import json

import pytest
from omnidraft.app import metrics_history
from omnidraft.app.metrics_history import LEGACY_FILE_NAME, MetricsHistory
from omnidraft.core.events import TurnStats

STATS = TurnStats(method="omnidraft", new_tokens=10, seconds=1.0, steps=5, proposed=4, accepted=2)


def _history(path, replies=3, learning=2) -> MetricsHistory:
    history = MetricsHistory(path)
    for _ in range(replies):
        history.add_turn(STATS, "m", 5.0)
    for step in range(learning):
        history.add_learning("m", step + 1, 8, 2.0, 0.5)
    return history


def _same(a: MetricsHistory, b: MetricsHistory) -> bool:
    return a.replies == b.replies and a.learning == b.learning


def test_a_save_appends_what_was_added_since_the_last(tmp_path):
    path = tmp_path / "m.jsonl"
    history = _history(path)
    history.save()
    before = path.read_bytes()
    history.add_turn(STATS, "m", None)
    history.save()
    after = path.read_bytes()
    assert after.startswith(before) and after[len(before):].count(b"\n") == 1
    again = MetricsHistory(path)
    again.load()
    assert again.load_warning is None and _same(again, history)


def test_past_the_caps_the_file_is_rewritten_with_the_newest(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics_history, "MAX_REPLIES", 5)
    path = tmp_path / "m.jsonl"
    history = MetricsHistory(path)
    lines = []
    for _ in range(1100):
        history.add_turn(STATS, "m", 5.0)
        history.save()
        lines.append(path.read_bytes().count(b"\n"))
    assert len(history.replies) == 5
    assert max(lines) <= 2 * 5 + 1000 + 1 and lines[-1] < max(lines), "rewritten, not grown without end"
    again = MetricsHistory(path)
    again.load()
    assert _same(again, history)


def test_a_line_cut_short_by_a_kill_is_dropped_and_the_rest_kept(tmp_path):
    path = tmp_path / "m.jsonl"
    history = _history(path)
    history.save()
    with open(path, "ab") as f:
        f.write(b'{"reply": {"time": 1.0, "model_')
    again = MetricsHistory(path)
    again.load()
    assert again.load_warning is None and _same(again, history)
    again.add_turn(STATS, "m", 5.0)
    again.save()  # not appended after the cut-short line
    third = MetricsHistory(path)
    third.load()
    assert third.load_warning is None and len(third.replies) == 4


@pytest.mark.parametrize("line", [
    b"not json\n",
    b"[1, 2, 3]\n",
    b'{"reply": {"time": 1.0}}\n',
    (b'{"learning": {"time": 1.0, "model_id": "m", "steps": "many", "samples": 1, "loss": null, '
     b'"acceptance": null}}\n'),
])
def test_a_damaged_or_wrong_shaped_line_sets_the_file_aside(tmp_path, line):
    path = tmp_path / "m.jsonl"
    history = _history(path)
    history.save()
    data = path.read_bytes()
    path.write_bytes(line + data)
    again = MetricsHistory(path)
    again.load()
    assert "damaged" in again.load_warning and again.replies == []
    assert (tmp_path / "m.jsonl.corrupt").read_bytes() == line + data
    again.add_turn(STATS, "m", 5.0)
    again.save()
    third = MetricsHistory(path)
    third.load()
    assert third.load_warning is None and len(third.replies) == 1


def test_the_older_whole_file_history_is_read_once_and_replaced(tmp_path):
    old = _history(tmp_path / "old.jsonl")
    legacy = tmp_path / LEGACY_FILE_NAME
    legacy.write_text(json.dumps({
        "version": 1,
        "replies": [vars(r) for r in old.replies],
        "learning": [vars(m) for m in old.learning],
    }))
    path = tmp_path / "metrics_history.jsonl"
    history = MetricsHistory(path)
    history.load()
    assert history.load_warning is None and _same(history, old)
    history.save()
    assert path.exists() and not legacy.exists()
    again = MetricsHistory(path)
    again.load()
    assert _same(again, old)
