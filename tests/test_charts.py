"""The charts show whether drafting got faster for a target as it learned:
speedup and acceptance per drafted reply with their rolling means, the learner's
steps marked between the replies, and the first replies against the latest."""

import pytest
from omnidraft.app.charts import ChartsPanel, milestones
from omnidraft.app.metrics_history import (
    LearningMetric,
    MetricsHistory,
    ReplyMetric,
    first_and_last,
    learner_marks,
)


def _reply(t: float, speedup: float | None, acceptance: float | None, method: str = "omnidraft", model="m"):
    return ReplyMetric(t, model, method, 64, 10.0, 6.4, acceptance, 2.5 if acceptance else None,
                       40, 20, 4.0 if speedup else None, speedup)


def _learned(t: float, steps: int, model="m"):
    return LearningMetric(t, model, steps, steps * 8, 2.0, 0.5)


def test_first_and_last_compare_the_first_replies_with_the_latest():
    assert first_and_last([1.0]) is None
    assert first_and_last([1.0, 2.0, 3.0]) == (1.0, 3.0, 1)  # fewer than 2 windows: half each
    values = [1.0] * 10 + [5.0] * 5 + [2.0] * 10
    assert first_and_last(values) == (1.0, 2.0, 10)


def test_learner_steps_are_marked_between_the_replies_they_came_between():
    replies = [_reply(t, 1.5, 0.5) for t in (10, 20, 30, 40)]
    learning = [_learned(5, 1), _learned(21, 2), _learned(22, 3), _learned(45, 4)]
    # Before the first reply, two steps after the second, one after the last.
    assert learner_marks(replies, learning) == [(0.5, 1), (2.5, 3), (4.5, 4)]


def test_many_marks_are_thinned_to_round_step_counts():
    marks = [(n + 0.5, 3 * n) for n in range(1, 101)]  # 100 gaps, 3 steps each
    kept, every = milestones(marks)
    assert every == 20 and len(kept) <= 20
    assert [steps for _, steps in kept][:3] == [21, 42, 60]  # the first gap past each multiple of 20
    assert milestones(marks[:5]) == (marks[:5], None)


@pytest.fixture
def history(tmp_path):
    """Ten drafted replies getting faster, a plain one among them, the learner
    training after the 3rd and the 6th."""
    h = MetricsHistory(tmp_path / "m.json")
    for n in range(10):
        t = 10.0 * (n + 1)
        h.replies.append(_reply(t, 1.4 if n < 5 else 1.7, 0.5 if n < 5 else 0.6))
        if n == 4:
            h.replies.append(_reply(t + 1, 1.0, None, method="target"))  # speculative off: not drafted
        if n in (2, 5):
            h.learning.append(_learned(t + 5, 4 if n == 2 else 8))
    h.replies.append(_reply(200.0, 3.0, 0.9, model="other"))  # another target's
    return h


def test_the_panel_shows_this_targets_drafted_replies_and_where_it_learned(qtbot, history):
    panel = ChartsPanel(history)
    qtbot.addWidget(panel)
    panel.set_current_target("m")
    dots, rolling = panel.speedup_plot.listDataItems()[:2]
    assert list(dots.getData()[0]) == list(range(1, 11))  # the plain reply and the other target left out
    assert list(rolling.getData()[1])[4] == pytest.approx(1.4)
    assert list(rolling.getData()[1])[-1] == pytest.approx(1.55)  # the mean of the last 10
    for plot in (panel.speedup_plot, panel.acceptance_plot, panel.tps_plot):
        xs = panel._marks[plot].getData()[0]
        assert sorted(set(xs)) == [3.5, 6.5]  # after the 3rd and the 6th drafted reply
    assert "the drafter learned here" in panel.speedup_plot.titleLabel.text  # the marks' key
    text = panel.summary.text()
    assert "Speedup 1.40x → 1.70x" in text and "acceptance 50% → 60%" in text
    assert "first 5 vs last 5 of 10 drafted replies" in text and "trained 8 steps" in text

    # A learner step reported now is marked after the last reply at once.
    panel.add_learning("m", 9, 72, 1.9, 0.6)
    assert sorted(set(panel._marks[panel.speedup_plot].getData()[0])) == [3.5, 6.5, 10.5]
    assert "trained 9 steps" in panel.summary.text()


def test_without_drafted_replies_the_plots_say_so(qtbot, tmp_path):
    h = MetricsHistory(tmp_path / "m.json")
    h.replies.append(_reply(1.0, 1.0, None, method="target"))
    panel = ChartsPanel(h)
    qtbot.addWidget(panel)
    panel.set_current_target("m")
    assert panel.summary.text() == "No drafted replies measured yet for this selection."
    assert not panel.speedup_plot.listDataItems() and not panel._marks
    assert "learned here" not in panel.speedup_plot.titleLabel.text  # no marks, no key for them
