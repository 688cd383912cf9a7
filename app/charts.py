"""The charts panel: whether drafting got faster for this target as it learned.

Four stacked plots (pyqtgraph). Over the drafted replies, oldest first: the
measured speedup over plain decoding, the acceptance rate and the target
tokens per step, each reply a dot and the mean of the last 10 a line, with an
orange mark wherever the learner trained between two replies. Then the
learner's own loss and acceptance estimate against its step count. The line
above compares the first replies with the latest ("speedup 1.4x -> 1.6x"). The
panel shows one target at a time (or all), follows the current target, and
exports what it shows as one PNG and all history as CSV.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyqtgraph as pg
import pyqtgraph.exporters
from omnidraft.core.events import TurnStats
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from . import theme
from .metrics_history import (
    ROLLING_WINDOW,
    MetricsHistory,
    first_and_last,
    learner_marks,
    rolling_mean,
)

ALL_TARGETS = ""
MAX_MARKS = 20  # learner marks on a plot before they are thinned to milestones
SAVE_DELAY_MS = 1000  # coalesce bursts of events into one write

pg.setConfigOptions(antialias=True)  # colours are the theme's, set per panel (set_palette)


def _pen(color: str, width: float = 2.0, style=Qt.PenStyle.SolidLine):
    return pg.mkPen(color=color, width=width, style=style)


class CountAxis(pg.AxisItem):
    """An axis of counts (reply number, learner step): whole-number ticks only."""

    def tickValues(self, minVal, maxVal, size):
        levels = super().tickValues(minVal, maxVal, size)
        return [(spacing, [v for v in values if float(v).is_integer()]) for spacing, values in levels]

    def tickStrings(self, values, scale, spacing):
        return [str(round(v * scale)) for v in values]


def milestones(marks: list[tuple[float, int]], limit: int = MAX_MARKS) -> tuple[list[tuple[float, int]], int | None]:
    """At most `limit` learner marks: all of them, or, when there are more, one
    where the step count passes each multiple of a round number (returned too)."""
    if len(marks) <= limit:
        return marks, None
    total = max(steps for _, steps in marks)
    every = next(m * 10**k for k in range(12) for m in (1, 2, 5) if total / (m * 10**k) <= limit)
    kept, due = [], every
    for x, steps in marks:
        if steps >= due:
            kept.append((x, steps))
            due = (steps // every + 1) * every
    return kept, every


class ChartsPanel(QWidget):
    exported = Signal(str)  # path written, for the status bar

    def __init__(
        self,
        history: MetricsHistory,
        name_of: Callable[[str], str] = lambda model_id: model_id,
        parent: QWidget | None = None,
    ):
        super().__init__(parent)
        self.setObjectName("ChartsPanel")
        self.history = history
        self.name_of = name_of
        self._following = True  # the filter follows the current target until the user picks one
        self._current_target: str | None = None
        self._drawn: list = []  # the drafted replies the series plots show
        self._marks: dict = {}  # plot -> its learner marks item
        self._titles: dict = {}  # plot -> (title, subtitle), redrawn in the theme's colours
        self._p = theme.current()
        self._save_timer = QTimer(self, singleShot=True, interval=SAVE_DELAY_MS)
        self._save_timer.timeout.connect(self.save)
        # A reply's figures are drawn in the event-loop pass after the one that
        # finishes the reply, so the two never add up to one long stall.
        self._redraw_timer = QTimer(self, singleShot=True, interval=0)
        self._redraw_timer.timeout.connect(self.refresh)

        self.target_combo = QComboBox()
        self.target_combo.setMinimumContentsLength(14)
        self.target_combo.activated.connect(self._user_picked_target)
        png = QPushButton("PNG")
        png.setToolTip("Export the charts as an image")
        png.clicked.connect(self._ask_export_png)
        csv_button = QPushButton("CSV")
        csv_button.setToolTip("Export all chart history as a table")
        csv_button.clicked.connect(self._ask_export_csv)
        self.summary = QLabel()
        self.summary.setObjectName("ChartsSummary")
        self.summary.setWordWrap(True)

        bar = QHBoxLayout()
        bar.addWidget(self.target_combo, 1)
        bar.addWidget(png)
        bar.addWidget(csv_button)

        self.plots = pg.GraphicsLayoutWidget()
        self.plots.ci.setSpacing(12)
        series = f"dots: each reply · line: mean of last {ROLLING_WINDOW}"
        self.speedup_plot = self._add_plot("Speedup vs plain decoding", "", None, self._speedup_subtitle(None))
        self.acceptance_plot = self._add_plot("Acceptance rate", "", (0, 1), series)
        self.tps_plot = self._add_plot("Target tokens per step", "drafted reply, oldest first", None, series)
        self.learning_plot = self._add_plot(
            "Learning", "learner step", None, "blue: loss (left) · orange: acceptance (right)"
        )
        self._add_learning_acceptance_axis()
        self._colour_plots()

        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 10, 10, 10)
        layout.setSpacing(8)
        layout.addLayout(bar)
        layout.addWidget(self.summary)
        layout.addWidget(self.plots, 1)
        self.refresh()

    # ------------------------------------------------------------ building

    def _set_title(self, plot, title: str, subtitle: str = "") -> None:
        self._titles[plot] = (title, subtitle)
        # Short titles: a title wider than the panel widens the whole plot column.
        if subtitle:
            title += f"<br><span style='font-size:8pt; color:{self._p.chart_muted}'>{subtitle}</span>"
        plot.setTitle(f"<span style='font-size:10pt'>{title}</span>", color=self._p.chart_fg)

    @property
    def plots_list(self) -> list:
        return [self.speedup_plot, self.acceptance_plot, self.tps_plot, self.learning_plot]

    def set_palette(self, palette: theme.Palette) -> None:
        """Redraw in another theme's colours (the theme switched while the app runs)."""
        self._p = palette
        self._colour_plots()
        self.refresh()

    def _colour_plots(self) -> None:
        p = self._p
        self.plots.setBackground(p.surface)
        for plot in self.plots_list:
            for name in ("left", "bottom", "right"):
                axis = plot.getAxis(name)
                axis.setPen(p.chart_fg)
                axis.setTextPen(p.chart_fg)
                if axis.labelText:
                    axis.setLabel(axis.labelText, color=p.chart_fg)
            self._set_title(plot, *self._titles.get(plot, ("", "")))
        # The learning plot's two scales say by their colour which line they are.
        self.learning_plot.getAxis("right").setLabel("acceptance", color=p.chart_accent_2)
        self.learning_plot.getAxis("left").setLabel("loss", color=p.chart_accent)

    def _add_plot(
        self, title: str, x_label: str, y_range: tuple[float, float] | None = None,
        subtitle: str = "",
    ):
        plot = self.plots.addPlot(axisItems={"bottom": CountAxis("bottom")})
        self._set_title(plot, title, subtitle)
        plot.showGrid(x=True, y=True, alpha=0.15)
        if x_label:
            plot.setLabel("bottom", x_label)
        plot.setMenuEnabled(False)
        plot.getViewBox().setMouseEnabled(x=True, y=False)
        plot.getAxis("left").enableAutoSIPrefix(False)  # "loss (x0.001)" reads badly
        plot.getAxis("left").setWidth(48)  # aligned plots, whatever their tick labels
        if y_range:
            plot.setYRange(*y_range, padding=0.05)
        self.plots.nextRow()
        return plot

    def _reset(self, plot) -> None:
        plot.clear()
        # A placeholder fixed the ranges; data gets automatic ones again, except that
        # acceptance always shows its whole 0-1 scale.
        plot.enableAutoRange(axis=pg.ViewBox.XAxis)
        if plot is self.acceptance_plot:
            plot.setYRange(0, 1, padding=0.05)
        else:
            plot.enableAutoRange(axis=pg.ViewBox.YAxis)

    def _placeholder(self, plot, text: str) -> None:
        """Say why a plot is empty rather than show bare axes."""
        plot.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
        label = pg.TextItem(text, color=self._p.chart_muted, anchor=(0.5, 0.5))
        label.setPos(0.5, 0.5)
        plot.addItem(label)

    def _add_learning_acceptance_axis(self) -> None:
        """Acceptance (0-1) and loss share the x axis but not a scale: a right axis."""
        plot = self.learning_plot
        self.learning_acc_view = pg.ViewBox()
        plot.showAxis("right")
        plot.scene().addItem(self.learning_acc_view)
        plot.getAxis("right").linkToView(self.learning_acc_view)
        self.learning_acc_view.setXLink(plot)
        self.learning_acc_view.setYRange(0, 1, padding=0.05)

        def sync() -> None:
            self.learning_acc_view.setGeometry(plot.getViewBox().sceneBoundingRect())

        plot.getViewBox().sigResized.connect(sync)

    # ------------------------------------------------------------ feeding

    def set_current_target(self, model_id: str | None) -> None:
        self._current_target = model_id
        if self._following:
            self.refresh()

    def add_turn(self, stats: TurnStats, model_id: str, baseline: float | None, served: bool = False) -> None:
        """served: a reply of the local server, drawn as a diamond rather than a dot."""
        self.history.add_turn(stats, model_id, baseline, served)
        self._changed()

    def add_learning(self, model_id: str, steps: int, samples: int, loss, acceptance) -> None:
        if not self.history.add_learning(model_id, steps, samples, loss, acceptance):
            return
        if self.target_combo.findData(model_id) < 0:
            self._changed()  # a target new to the picker: redraw everything
            return
        # Only the learning plot and the marks show it: redrawing all four costs
        # ~25 ms of the GUI's time (plus their repaint) on every learner step.
        learning = self.history.learning_for(self.selected_target())
        self._draw_learning(learning)
        self._draw_marks(learning)
        self.summary.setText(self._summary_text(self._drawn, learning))
        self._save_timer.start()

    def clear(self) -> None:
        self.history.clear()
        self._changed()

    def _changed(self) -> None:
        self._redraw_timer.start()
        self._save_timer.start()

    def save(self) -> None:
        self._save_timer.stop()
        self.history.save()

    # ------------------------------------------------------------ drawing

    def selected_target(self) -> str | None:
        if self._following:
            return self._current_target
        return self.target_combo.currentData() or None

    def _user_picked_target(self, index: int) -> None:
        # Picking the current target again means "follow the current one".
        picked = self.target_combo.itemData(index)
        self._following = picked == self._current_target
        self.refresh()

    def _fill_combo(self) -> None:
        ids = self.history.model_ids()
        if self._current_target and self._current_target not in ids:
            ids.append(self._current_target)
        wanted = self.selected_target() or ALL_TARGETS
        self.target_combo.blockSignals(True)
        self.target_combo.clear()
        self.target_combo.addItem("All targets", ALL_TARGETS)
        for model_id in ids:
            self.target_combo.addItem(self.name_of(model_id), model_id)
        index = self.target_combo.findData(wanted)
        self.target_combo.setCurrentIndex(max(index, 0))
        self.target_combo.blockSignals(False)

    def refresh(self) -> None:
        self._redraw_timer.stop()  # this redraw covers a pending one
        self._fill_combo()
        target = self.selected_target()
        replies = self.history.drafted_for(target)
        learning = self.history.learning_for(target)
        self._drawn = replies
        self._draw_series(self.speedup_plot, replies, "speedup", "Needs the measured plain speed", 1.0)
        self._draw_series(self.acceptance_plot, replies, "acceptance_rate", "No drafted replies yet")
        self._draw_series(self.tps_plot, replies, "tokens_per_step", "No drafted replies yet")
        self._draw_marks(learning)
        self._draw_learning(learning)
        self.summary.setText(self._summary_text(replies, learning))

    def _summary_text(self, replies, learning) -> str:
        if not replies:
            return "No drafted replies measured yet for this selection."
        parts = []
        speedups = [r.speedup for r in replies if r.speedup is not None]
        acceptance = [r.acceptance_rate for r in replies if r.acceptance_rate is not None]
        if (speed := first_and_last(speedups)) is not None:
            parts.append(f"Speedup {speed[0]:.2f}x → {speed[1]:.2f}x")
        elif speedups:
            parts.append(f"Speedup {speedups[-1]:.2f}x")
        if (accept := first_and_last(acceptance)) is not None:
            parts.append(f"{'acceptance' if parts else 'Acceptance'} {accept[0]:.0%} → {accept[1]:.0%}")
        elif acceptance:
            parts.append(f"{'acceptance' if parts else 'Acceptance'} {acceptance[-1]:.0%}")
        n = (speed or accept or (0, 0, 0))[2]
        text = " · ".join(parts)
        if n:
            text += f" (first {n} vs last {n} of {len(replies)} drafted replies)"
        else:
            text += f" ({len(replies)} drafted {'reply' if len(replies) == 1 else 'replies'})"
        if served := sum(r.served for r in replies):
            text += f" · {served} served over the API (diamonds)"
        steps = max((m.steps for m in learning), default=0)
        return text + (f" · drafter trained {steps} steps" if steps else " · not trained yet")

    def _draw_series(self, plot, replies, field: str, empty: str, reference: float | None = None) -> None:
        """One figure per drafted reply (x: its place, from 1) and its rolling mean."""
        self._reset(plot)
        points = [(i + 1, getattr(r, field)) for i, r in enumerate(replies) if getattr(r, field) is not None]
        if not points:
            return self._placeholder(plot, empty)
        if reference is not None:
            plot.addItem(pg.InfiniteLine(pos=reference, angle=0,
                                         pen=_pen(self._p.chart_muted, 1, Qt.PenStyle.DashLine)))
        xs, ys = zip(*points)
        # The titles say what each series is: a legend box would sit on the points.
        # Served replies (the local server's) are diamonds, the chat's dots.
        served = {i + 1 for i, r in enumerate(replies) if r.served}
        symbols = ["d" if x in served else "o" for x in xs]
        plot.plot(xs, ys, pen=None, symbol=symbols, symbolSize=5, symbolBrush=self._p.chart_muted, symbolPen=None)
        plot.plot(xs, rolling_mean(list(ys)), pen=_pen(self._p.chart_accent))
        plot.setXRange(0.5, max(xs) + 0.5, padding=0.02)

    def _speedup_subtitle(self, every: int | None, marked: bool = False) -> str:
        """The series' key, and the learner marks' once there are any."""
        key = f"dots: each reply · line: mean of last {ROLLING_WINDOW}"
        if not marked:
            return key
        what = f"every {every} learner steps" if every else "the drafter learned here"
        return f"{key}<br><span style='color:{self._p.chart_accent_2}'>|</span> {what}"

    def _draw_marks(self, learning) -> None:
        """A short orange tick under each series plot's dots wherever the learner
        trained between two replies: one item per plot, however many marks."""
        marks, every = milestones(learner_marks(self._drawn, learning))
        self._set_title(self.speedup_plot, "Speedup vs plain decoding", self._speedup_subtitle(every, bool(marks)))
        for plot in (self.speedup_plot, self.acceptance_plot, self.tps_plot):
            old = self._marks.pop(plot, None)
            if old is not None and old.scene() is not None:  # not already cleared by a redraw
                plot.removeItem(old)
            data = [item.getData()[1] for item in plot.listDataItems()]
            if not marks or not data:
                continue
            low = min(min(ys) for ys in data)
            high = max(max(ys) for ys in data)
            if plot is self.acceptance_plot:
                low, high = 0.0, 1.0
            elif plot is self.speedup_plot:
                low, high = min(low, 1.0), max(high, 1.0)
            span = (high - low) or 1.0
            xs = [x for x, _ in marks for _ in (0, 1)]
            # Below the lowest dot (acceptance: at its 0, inside the fixed 0-1 view).
            foot = (-0.04, 0.04) if plot is self.acceptance_plot else (low - 0.14 * span, low - 0.04 * span)
            ys = [y for _ in marks for y in foot]
            self._marks[plot] = pg.PlotDataItem(xs, ys, connect="pairs", pen=_pen(self._p.chart_accent_2, 2.5))
            plot.addItem(self._marks[plot])

    def _draw_learning(self, points) -> None:
        plot = self.learning_plot
        self._reset(plot)
        self.learning_acc_view.clear()
        losses = [(m.steps, m.loss) for m in points if m.loss is not None]
        accs = [(m.steps, m.acceptance) for m in points if m.acceptance is not None]
        if not losses and not accs:
            return self._placeholder(plot, "Not trained on this target yet")
        if losses:
            xs, ys = zip(*losses)
            accent = self._p.chart_accent
            plot.plot(xs, ys, pen=_pen(accent), symbol="o", symbolSize=5, symbolBrush=accent, symbolPen=None)
        if accs:
            xs, ys = zip(*accs)
            accent = self._p.chart_accent_2
            curve = pg.PlotDataItem(xs, ys, pen=_pen(accent), symbol="t", symbolSize=6,
                                    symbolBrush=accent, symbolPen=None)
            self.learning_acc_view.addItem(curve)

    # ------------------------------------------------------------ export

    def export_png(self, path: str | Path) -> None:
        exporter = pyqtgraph.exporters.ImageExporter(self.plots.scene())
        exporter.parameters()["width"] = max(800, int(self.plots.width() * 2))
        exporter.export(str(path))
        self.exported.emit(str(path))

    def export_csv(self, path: str | Path) -> None:
        self.history.export_csv(Path(path))
        self.exported.emit(str(path))

    def _ask_export_png(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export charts", "omnidraft-charts.png",
                                              "PNG image (*.png)")
        if path:
            self.export_png(path if path.lower().endswith(".png") else path + ".png")

    def _ask_export_csv(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export chart data", "omnidraft-metrics.csv",
                                              "CSV table (*.csv)")
        if path:
            self.export_csv(path if path.lower().endswith(".csv") else path + ".csv")
