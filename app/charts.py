"""The charts panel: how well the drafter does, reply by reply and while it learns.

Four stacked plots (pyqtgraph): acceptance rate per reply with its rolling
mean, measured speedup over plain decoding, target tokens per step, and the
learner's loss and acceptance against its step count. The panel shows one
target at a time (or all), follows the current target, and exports what it
shows as one PNG and all history as CSV.
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

from .metrics_history import MetricsHistory, rolling_mean

ALL_TARGETS = ""
ACCENT = "#3b6fd8"
ACCENT_2 = "#e0803a"
MUTED = "#9aa4b2"
SAVE_DELAY_MS = 1000  # coalesce bursts of events into one write

pg.setConfigOptions(background="w", foreground="#4a5361", antialias=True)


def _pen(color: str, width: float = 2.0, style=Qt.PenStyle.SolidLine):
    return pg.mkPen(color=color, width=width, style=style)


class CountAxis(pg.AxisItem):
    """An axis of counts (reply number, learner step): whole-number ticks only."""

    def tickValues(self, minVal, maxVal, size):
        levels = super().tickValues(minVal, maxVal, size)
        return [(spacing, [v for v in values if float(v).is_integer()]) for spacing, values in levels]

    def tickStrings(self, values, scale, spacing):
        return [str(round(v * scale)) for v in values]


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
        self.acceptance_plot = self._add_plot(
            "Acceptance rate per reply", "", (0, 1), "dots: each reply · line: mean of last 10"
        )
        self.speedup_plot = self._add_plot("Speedup per reply vs plain decoding", "")
        self.tps_plot = self._add_plot("Target tokens per step, per reply", "")
        self.learning_plot = self._add_plot(
            "Learning", "learner step", None, "blue: loss (left) · orange: acceptance (right)"
        )
        self._add_learning_acceptance_axis()

        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 10, 10, 10)
        layout.setSpacing(8)
        layout.addLayout(bar)
        layout.addWidget(self.summary)
        layout.addWidget(self.plots, 1)
        self.refresh()

    # ------------------------------------------------------------ building

    def _add_plot(
        self, title: str, x_label: str, y_range: tuple[float, float] | None = None,
        subtitle: str = "",
    ):
        # Short titles: a title wider than the panel widens the whole plot column.
        if subtitle:
            title += f"<br><span style='font-size:8pt; color:{MUTED}'>{subtitle}</span>"
        plot = self.plots.addPlot(
            title=f"<span style='font-size:10pt'>{title}</span>",
            axisItems={"bottom": CountAxis("bottom")},
        )
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

    @staticmethod
    def _placeholder(plot, text: str) -> None:
        """Say why a plot is empty rather than show bare axes."""
        plot.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
        label = pg.TextItem(text, color=MUTED, anchor=(0.5, 0.5))
        label.setPos(0.5, 0.5)
        plot.addItem(label)

    def _add_learning_acceptance_axis(self) -> None:
        """Acceptance (0-1) and loss share the x axis but not a scale: a right axis."""
        plot = self.learning_plot
        self.learning_acc_view = pg.ViewBox()
        plot.showAxis("right")
        plot.scene().addItem(self.learning_acc_view)
        plot.getAxis("right").linkToView(self.learning_acc_view)
        plot.getAxis("right").setLabel("acceptance", color=ACCENT_2)
        plot.getAxis("left").setLabel("loss", color=ACCENT)
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

    def add_turn(self, stats: TurnStats, model_id: str, baseline: float | None) -> None:
        self.history.add_turn(stats, model_id, baseline)
        self._changed()

    def add_learning(self, model_id: str, steps: int, samples: int, loss, acceptance) -> None:
        if not self.history.add_learning(model_id, steps, samples, loss, acceptance):
            return
        if self.target_combo.findData(model_id) < 0:
            self._changed()  # a target new to the picker: redraw everything
            return
        # Only the learning plot shows it: redrawing all four costs ~25 ms of the
        # GUI's time (plus their repaint) on every learner step.
        self._draw_learning(self.history.learning_for(self.selected_target()))
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
        replies = self.history.replies_for(target)
        self._draw_acceptance(replies)
        self._draw_speedup(replies)
        self._draw_tokens_per_step(replies)
        self._draw_learning(self.history.learning_for(target))
        self.summary.setText(self._summary_text(replies))

    def _summary_text(self, replies) -> str:
        if not replies:
            return "No replies measured yet for this selection."
        last = replies[-1]
        parts = [f"{len(replies)} replies", f"last {last.tokens_per_s:.1f} tok/s"]
        if last.acceptance_rate is not None:
            parts.append(f"acceptance {last.acceptance_rate:.0%}")
        if last.speedup is not None:
            parts.append(f"speedup {last.speedup:.2f}x")
        return " · ".join(parts)

    def _draw_acceptance(self, replies) -> None:
        plot = self.acceptance_plot
        self._reset(plot)
        points = [(i + 1, r.acceptance_rate) for i, r in enumerate(replies) if r.acceptance_rate is not None]
        if not points:
            return self._placeholder(plot, "No drafted replies yet")
        xs, ys = zip(*points)
        # The titles say what each series is: a legend box would sit on the points.
        plot.plot(xs, ys, pen=None, symbol="o", symbolSize=6, symbolBrush=MUTED, symbolPen=None)
        plot.plot(xs, rolling_mean(list(ys)), pen=_pen(ACCENT))

    def _draw_speedup(self, replies) -> None:
        plot = self.speedup_plot
        self._reset(plot)
        points = [(i + 1, r.speedup) for i, r in enumerate(replies) if r.speedup is not None]
        if not points:
            return self._placeholder(plot, "Needs the measured plain speed")
        plot.addItem(pg.InfiniteLine(pos=1.0, angle=0, pen=_pen(MUTED, 1, Qt.PenStyle.DashLine)))
        xs, ys = zip(*points)
        plot.plot(xs, ys, pen=_pen(ACCENT, 1.5), symbol="o", symbolSize=6,
                  symbolBrush=ACCENT, symbolPen=None)

    def _draw_tokens_per_step(self, replies) -> None:
        plot = self.tps_plot
        self._reset(plot)
        points = [(i + 1, r.tokens_per_step) for i, r in enumerate(replies) if r.tokens_per_step]
        if not points:
            return self._placeholder(plot, "No replies yet")
        xs, ys = zip(*points)
        plot.plot(xs, ys, pen=_pen(ACCENT, 1.5), symbol="o", symbolSize=6,
                  symbolBrush=ACCENT, symbolPen=None)

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
            plot.plot(xs, ys, pen=_pen(ACCENT), symbol="o", symbolSize=5, symbolBrush=ACCENT,
                      symbolPen=None)
        if accs:
            xs, ys = zip(*accs)
            curve = pg.PlotDataItem(xs, ys, pen=_pen(ACCENT_2), symbol="t", symbolSize=6,
                                    symbolBrush=ACCENT_2, symbolPen=None)
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
