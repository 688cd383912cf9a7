"""Before/after chart of an `omnidraft-bench --adapt` report, as a PNG.

Usage: QT_QPA_PLATFORM=offscreen python scripts/adapt_chart.py docs/results/adapt.json docs/adapt.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyqtgraph as pg
import pyqtgraph.exporters
from PySide6.QtWidgets import QApplication


def main(report_path: str, png_path: str) -> None:
    adapt = json.loads(Path(report_path).read_text())["adapt"]
    app = QApplication.instance() or QApplication(sys.argv)
    pg.setConfigOptions(background="w", foreground="k", antialias=True)
    layout = pg.GraphicsLayoutWidget()
    layout.resize(900, 380)
    panels = [
        ("omnidraft speedup over plain", "speedup"),
        ("acceptance rate", "acceptance_rate"),
        ("target tokens per step", "tokens_per_step"),
    ]
    for title, key in panels:
        plot = layout.addPlot(title=title)
        before = adapt["before"]["omnidraft"][key] or 0.0
        after = adapt["after"]["omnidraft"][key] or 0.0
        plot.addItem(pg.BarGraphItem(x=[0], height=[before], width=0.6, brush="#9aa5b1"))
        plot.addItem(pg.BarGraphItem(x=[1], height=[after], width=0.6, brush="#3b6fd8"))
        for x, value in ((0, before), (1, after)):
            label = pg.TextItem(f"{value:.2f}", anchor=(0.5, 1.2), color="k")
            label.setPos(x, value)
            plot.addItem(label)
        plot.getAxis("bottom").setTicks([[(0, "before"), (1, "after learning")]])
        plot.setYRange(0, max(before, after, 1e-6) * 1.25)
        plot.setMouseEnabled(False, False)
    layout.show()  # lay the plots out at the widget's size before exporting
    app.processEvents()
    exporter = pg.exporters.ImageExporter(layout.scene())
    exporter.parameters()["width"] = 900
    exporter.export(png_path)
    print(f"wrote {png_path}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
