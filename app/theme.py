"""A clean light theme and the window icon.

Kept in Python rather than resource files so the installed package needs no
package-data entry and the look is the same in a source checkout and a wheel.
Fusion is the base style: it looks the same on every platform, so the sheet
below only has to adjust it, not fight a native style.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QFont, QIcon, QPainter, QPainterPath, QPalette, QPen, QPixmap
from PySide6.QtWidgets import QApplication

ACCENT = "#3b6fd8"
ACCENT_DARK = "#2f5bb5"
WINDOW_BG = "#f6f7f9"
SIDEBAR_BG = "#eef1f5"
BORDER = "#dde2e8"
TEXT = "#1f2430"
MUTED_TEXT = "#6b7380"

STYLE = f"""
QMainWindow, QDialog {{ background: {WINDOW_BG}; }}
QWidget {{ color: {TEXT}; }}
QToolTip {{ background: #ffffff; color: {TEXT}; border: 1px solid {BORDER}; padding: 4px; }}

#Sidebar {{ background: {SIDEBAR_BG}; border-right: 1px solid {BORDER}; }}
#SidebarTitle {{ color: {MUTED_TEXT}; font-size: 8.5pt; font-weight: 600; padding: 6px 4px 0 4px; }}
#NewChatButton {{
    background: {ACCENT}; color: white; border: none; border-radius: 8px;
    padding: 8px 12px; font-weight: 600; text-align: left;
}}
#NewChatButton:hover {{ background: {ACCENT_DARK}; }}
#SidebarSearch {{
    background: white; border: 1px solid {BORDER}; border-radius: 7px; padding: 5px 8px;
}}
#ConversationList {{ background: transparent; border: none; outline: none; }}
#ConversationList::item {{ padding: 7px 8px; border-radius: 7px; margin: 1px 0; }}
#ConversationList::item:hover {{ background: #e2e7ef; }}
#ConversationList::item:selected {{ background: #d6e2f8; color: {TEXT}; }}

#ChatScroll, #ChatCanvas, #ChatColumn {{ background: {WINDOW_BG}; }}
#ContextCut {{
    color: {MUTED_TEXT}; font-size: 8.5pt; padding: 6px 12px; border-top: 1px dashed #c3c8cf;
}}
#EmptyHint {{ color: {MUTED_TEXT}; font-size: 11pt; padding: 80px 20px; }}
#UserMessage {{ background: #e7eefc; border: 1px solid #d3def6; border-radius: 12px; }}
#AssistantMessage {{ background: #ffffff; border: 1px solid {BORDER}; border-radius: 12px; }}
#Author {{ font-weight: 600; color: {MUTED_TEXT}; font-size: 9pt; }}
#MessageNote {{ color: {MUTED_TEXT}; font-style: italic; font-size: 9pt; }}
#MessageMeta {{ color: #98a0ab; font-size: 8.5pt; }}
#TextBlock {{ background: transparent; }}
#CodeBlock {{ background: #f3f4f7; border: 1px solid #e3e6eb; border-radius: 8px; }}
#CodeLang {{ color: {MUTED_TEXT}; font-size: 8.5pt; }}
#CodeView {{ background: transparent; }}
#CopyButton {{
    border: none; color: {MUTED_TEXT}; padding: 2px 6px; border-radius: 5px; font-size: 8.5pt;
}}
#CopyButton:hover {{ background: #e8ebf0; color: {TEXT}; }}
#MessageAction {{
    border: none; color: {MUTED_TEXT}; padding: 2px 6px; border-radius: 5px; font-size: 8.5pt;
}}
#MessageAction:hover {{ background: #e8ebf0; color: {TEXT}; }}
#MessageAction:disabled {{ color: #c3c8cf; }}
#VersionLabel {{ color: {MUTED_TEXT}; font-size: 8.5pt; }}
#VersionArrow {{
    border: none; color: {MUTED_TEXT}; padding: 0 5px; border-radius: 5px; font-size: 13pt; font-weight: 600;
}}
#VersionArrow:hover {{ background: #e8ebf0; color: {TEXT}; }}
#VersionArrow:disabled {{ color: #c3c8cf; }}
#EditSendButton {{
    background: {ACCENT}; color: white; border: none; border-radius: 6px; padding: 3px 12px; font-weight: 600;
}}
#EditSendButton:hover {{ background: {ACCENT_DARK}; }}
#MessageEditor {{
    background: white; border: 1px solid #cfd6df; border-radius: 8px; padding: 4px 6px;
}}
#MessageEditor:focus {{ border: 1px solid {ACCENT}; }}

#ChatHeader {{ background: #ffffff; border-bottom: 1px solid {BORDER}; }}
#HeaderCaption {{ color: {MUTED_TEXT}; font-weight: 600; font-size: 9pt; }}
#SystemPromptSummary {{ color: {TEXT}; }}
#SystemPromptSummary[empty="true"] {{ color: {MUTED_TEXT}; font-style: italic; }}
#HeaderHint {{ color: {MUTED_TEXT}; font-size: 8.5pt; }}
#HeaderButton {{
    border: 1px solid {BORDER}; border-radius: 6px; padding: 3px 12px; background: {WINDOW_BG};
}}
#HeaderButton:hover {{ background: #e8ebf0; }}
#SystemPromptEditor {{
    background: white; border: 1px solid #cfd6df; border-radius: 8px; padding: 4px 6px;
}}
#SystemPromptEditor:focus {{ border: 1px solid {ACCENT}; }}

#ComposeBar {{ background: {WINDOW_BG}; border-top: 1px solid {BORDER}; }}
#Composer {{
    background: white; border: 1px solid #cfd6df; border-radius: 10px; padding: 6px 8px;
}}
#Composer:focus {{ border: 1px solid {ACCENT}; }}
#SendButton {{
    background: {ACCENT}; color: white; border: none; border-radius: 10px;
    padding: 8px 18px; font-weight: 600; min-width: 56px;
}}
#SendButton:hover {{ background: {ACCENT_DARK}; }}
#SendButton[stop="true"] {{ background: #d64545; }}
#SendButton[stop="true"]:hover {{ background: #b83636; }}

#Banner {{ background: #fff4d6; border-bottom: 1px solid #efd98f; }}
#Banner QLabel {{ color: #5b4700; }}
#Banner QToolButton {{ border: none; color: #5b4700; padding: 2px 6px; }}

#ChartsPanel {{ background: white; }}
#ChartsSummary {{ color: {MUTED_TEXT}; font-size: 9pt; }}
QDockWidget::title {{ background: {SIDEBAR_BG}; padding: 6px 10px; border-bottom: 1px solid {BORDER}; }}

QStatusBar {{ background: {SIDEBAR_BG}; border-top: 1px solid {BORDER}; }}
QStatusBar QLabel {{ color: {MUTED_TEXT}; padding: 0 6px; }}
QProgressBar {{
    border: 1px solid {BORDER}; border-radius: 5px; background: white; height: 12px;
    text-align: center; font-size: 8pt;
}}
QProgressBar::chunk {{ background: {ACCENT}; border-radius: 4px; }}
QMenuBar {{ background: {WINDOW_BG}; border-bottom: 1px solid {BORDER}; }}
QMenuBar::item {{ padding: 5px 10px; background: transparent; }}
QMenuBar::item:selected {{ background: #e2e7ef; border-radius: 5px; }}
QMenu {{ background: white; border: 1px solid {BORDER}; padding: 4px; }}
QMenu::item {{ padding: 5px 24px 5px 24px; border-radius: 5px; }}
QMenu::item:selected {{ background: #e5ecfa; color: {TEXT}; }}
QMenu::separator {{ height: 1px; background: {BORDER}; margin: 4px 8px; }}
QGroupBox {{
    border: 1px solid {BORDER}; border-radius: 8px; margin-top: 14px; padding: 10px 8px 6px 8px;
    background: white;
}}
QGroupBox::title {{ subcontrol-origin: margin; left: 10px; padding: 0 4px; color: {MUTED_TEXT}; }}
#DangerButton {{ color: #b83636; }}
QSplitter::handle {{ background: {BORDER}; }}
"""


def _icon_file() -> Path | None:
    """The project icon (resources/omnidraft.svg) in a source or editable install."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "resources" / "omnidraft.svg",
                      here.parent / "omnidraft" / "resources" / "omnidraft.svg"):
        if candidate.exists():
            return candidate
    return None


def app_icon() -> QIcon:
    path = _icon_file()
    if path is not None:
        icon = QIcon(str(path))
        if not icon.isNull():
            return icon
    return _drawn_icon()


def _drawn_icon() -> QIcon:
    """Where the SVG is not installed: a rounded accent square with a white 'O' and
    a green draft mark, so the window never shows a blank icon."""
    icon = QIcon()
    for size in (16, 32, 64, 128, 256):
        pixmap = QPixmap(size, size)
        pixmap.fill(Qt.GlobalColor.transparent)
        p = QPainter(pixmap)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        path = QPainterPath()
        path.addRoundedRect(QRectF(0, 0, size, size), size * 0.22, size * 0.22)
        p.fillPath(path, QColor(ACCENT))
        pen_w = max(1.5, size * 0.1)
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.setPen(QPen(QColor("white"), pen_w))
        r = size * 0.26
        p.drawEllipse(QRectF(size * 0.5 - r - size * 0.08, size * 0.5 - r, 2 * r, 2 * r))
        p.setPen(QPen(QColor("#7ee2a0"), pen_w, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap))
        p.drawLine(int(size * 0.70), int(size * 0.30), int(size * 0.82), int(size * 0.30))
        p.drawLine(int(size * 0.70), int(size * 0.50), int(size * 0.86), int(size * 0.50))
        p.drawLine(int(size * 0.70), int(size * 0.70), int(size * 0.80), int(size * 0.70))
        p.end()
        icon.addPixmap(pixmap)
    return icon


def apply_theme(app: QApplication) -> None:
    app.setStyle("Fusion")
    palette = app.palette()
    palette.setColor(QPalette.ColorRole.Window, QColor(WINDOW_BG))
    palette.setColor(QPalette.ColorRole.Base, QColor("white"))
    palette.setColor(QPalette.ColorRole.Text, QColor(TEXT))
    palette.setColor(QPalette.ColorRole.WindowText, QColor(TEXT))
    palette.setColor(QPalette.ColorRole.Highlight, QColor(ACCENT))
    palette.setColor(QPalette.ColorRole.HighlightedText, QColor("white"))
    palette.setColor(QPalette.ColorRole.Button, QColor("#f1f3f6"))
    palette.setColor(QPalette.ColorRole.ButtonText, QColor(TEXT))
    palette.setColor(QPalette.ColorRole.PlaceholderText, QColor("#98a0ab"))
    app.setPalette(palette)
    font = QFont(app.font())
    if font.pointSizeF() < 10:
        font.setPointSizeF(10)
    app.setFont(font)
    app.setStyleSheet(STYLE)
    app.setWindowIcon(app_icon())
