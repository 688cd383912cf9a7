"""The light and dark themes and the window icon.

Kept in Python rather than resource files so the installed package needs no
package-data entry and the look is the same in a source checkout and a wheel.
Fusion is the base style: it looks the same on every platform, so the sheet
below only has to adjust it, not fight a native style. A theme is one Palette;
the Settings choice "system" (the default) follows the desktop's colour scheme
(QStyleHints.colorScheme, live through colorSchemeChanged). Widgets that paint
colours themselves (the charts, the draft tint) read theme.current().
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, QRectF, Qt, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QGuiApplication,
    QIcon,
    QPainter,
    QPainterPath,
    QPalette,
    QPen,
    QPixmap,
)
from PySide6.QtWidgets import QApplication


@dataclass(frozen=True)
class Palette:
    """Every colour the app draws with; the style sheet, the charts and the draft
    tint read them from here, so a theme is one of these."""

    name: str
    accent: str
    accent_hover: str
    window_bg: str
    sidebar_bg: str
    surface: str  # replies, header, inputs, menus, the charts panel
    border: str
    input_border: str
    text: str
    muted: str
    faint: str  # message figures, placeholders
    disabled: str
    hover: str
    selected: str
    menu_selected: str
    button: str
    button_hover: str
    user_bubble: str
    user_border: str
    code_bg: str
    code_border: str
    danger: str
    danger_hover: str
    banner_bg: str
    banner_border: str
    banner_text: str
    draft_tint: str  # text that came from accepted drafts
    good: str
    bad: str
    link: str
    chart_fg: str
    chart_muted: str
    chart_accent: str
    chart_accent_2: str
    code_style: str = "default"  # the Pygments style code blocks take their token colours from


LIGHT = Palette(
    name="light", accent="#3b6fd8", accent_hover="#2f5bb5", window_bg="#f6f7f9", sidebar_bg="#eef1f5",
    surface="#ffffff", border="#dde2e8", input_border="#cfd6df", text="#1f2430", muted="#6b7380",
    faint="#98a0ab", disabled="#c3c8cf", hover="#e2e7ef", selected="#d6e2f8", menu_selected="#e5ecfa",
    button="#f1f3f6", button_hover="#e8ebf0", user_bubble="#e7eefc", user_border="#d3def6",
    code_bg="#f3f4f7", code_border="#e3e6eb", danger="#d64545", danger_hover="#b83636",
    banner_bg="#fff4d6", banner_border="#efd98f", banner_text="#5b4700", draft_tint="#dff3e4",
    good="#2e7d32", bad="#b3261e", link="#2f5bb5",
    chart_fg="#4a5361", chart_muted="#9aa4b2", chart_accent="#3b6fd8", chart_accent_2="#e0803a",
)
DARK = Palette(
    name="dark", accent="#4f7fe0", accent_hover="#3f6cc8", window_bg="#1c1f25", sidebar_bg="#17191e",
    surface="#252930", border="#353b46", input_border="#414855", text="#e2e5ea", muted="#9aa2ae",
    faint="#7d8591", disabled="#565d68", hover="#2d323b", selected="#2e3f61", menu_selected="#2f3a52",
    button="#2b3039", button_hover="#343a45", user_bubble="#263350", user_border="#34466b",
    code_bg="#1d2026", code_border="#353b46", danger="#d95757", danger_hover="#c04444",
    banner_bg="#3b331a", banner_border="#5c4d20", banner_text="#f0dc9c", draft_tint="#1e4a2d",
    good="#72c476", bad="#f07167", link="#8ab0ff",
    chart_fg="#bcc3cd", chart_muted="#7c8593", chart_accent="#6d9bff", chart_accent_2="#f0934d",
    code_style="github-dark",
)
THEMES = {"light": LIGHT, "dark": DARK}
CHOICES = ("system", "light", "dark")  # the Settings choice; "system" follows the desktop
ACCENT = LIGHT.accent  # the icon's colour, the same in both themes
_current = LIGHT


def current() -> Palette:
    """The palette last applied (light until a theme is applied)."""
    return _current


def style_sheet(p: Palette) -> str:
    return f"""
QMainWindow, QDialog {{ background: {p.window_bg}; }}
QWidget {{ color: {p.text}; }}
QToolTip {{ background: {p.surface}; color: {p.text}; border: 1px solid {p.border}; padding: 4px; }}

#Sidebar {{ background: {p.sidebar_bg}; border-right: 1px solid {p.border}; }}
#SidebarTitle {{ color: {p.muted}; font-size: 8.5pt; font-weight: 600; padding: 6px 4px 0 4px; }}
#NewChatButton {{
    background: {p.accent}; color: white; border: none; border-radius: 8px;
    padding: 8px 12px; font-weight: 600; text-align: left;
}}
#NewChatButton:hover {{ background: {p.accent_hover}; }}
#SidebarSearch {{
    background: {p.surface}; border: 1px solid {p.border}; border-radius: 7px; padding: 5px 8px;
}}
#SidebarSearch:focus {{ border: 1px solid {p.accent}; }}
#ConversationList {{ background: transparent; border: none; outline: none; }}
#ConversationList::item {{ padding: 7px 8px; border-radius: 7px; margin: 1px 0; }}
#ConversationList::item:hover {{ background: {p.hover}; }}
#ConversationList::item:selected {{ background: {p.selected}; color: {p.text}; }}
#SearchResults {{ background: transparent; border: none; outline: none; }}
#SearchResults::item {{ padding: 5px 8px; border-radius: 7px; margin: 1px 0; color: {p.muted}; }}
#SearchResults::item:hover {{ background: {p.hover}; }}
#SearchResults::item:selected {{ background: {p.selected}; color: {p.text}; }}

#ChatScroll, #ChatCanvas, #ChatColumn {{ background: {p.window_bg}; }}
#ContextCut {{
    color: {p.muted}; font-size: 8.5pt; padding: 6px 12px; border-top: 1px dashed {p.disabled};
}}
#EmptyHint {{ color: {p.muted}; font-size: 11pt; padding: 80px 20px; }}
#UserMessage {{ background: {p.user_bubble}; border: 1px solid {p.user_border}; border-radius: 12px; }}
#AssistantMessage {{ background: {p.surface}; border: 1px solid {p.border}; border-radius: 12px; }}
#UserMessage[found="true"], #AssistantMessage[found="true"] {{ border: 2px solid {p.accent}; }}
#Author {{ font-weight: 600; color: {p.muted}; font-size: 9pt; }}
#MessageNote {{ color: {p.muted}; font-style: italic; font-size: 9pt; }}
#MessageMeta {{ color: {p.faint}; font-size: 8.5pt; }}
#TextBlock {{ background: transparent; }}
#CodeBlock {{ background: {p.code_bg}; border: 1px solid {p.code_border}; border-radius: 8px; }}
#CodeLang {{ color: {p.muted}; font-size: 8.5pt; }}
#CodeView {{ background: transparent; }}
#CopyButton {{
    border: none; color: {p.muted}; padding: 2px 6px; border-radius: 5px; font-size: 8.5pt;
}}
#CopyButton:hover {{ background: {p.button_hover}; color: {p.text}; }}
#MessageAction {{
    border: none; color: {p.muted}; padding: 2px 6px; border-radius: 5px; font-size: 8.5pt;
}}
#MessageAction:hover {{ background: {p.button_hover}; color: {p.text}; }}
#MessageAction:disabled {{ color: {p.disabled}; }}
#VersionLabel {{ color: {p.muted}; font-size: 8.5pt; }}
#VersionArrow {{
    border: none; color: {p.muted}; padding: 0 5px; border-radius: 5px; font-size: 13pt; font-weight: 600;
}}
#VersionArrow:hover {{ background: {p.button_hover}; color: {p.text}; }}
#VersionArrow:disabled {{ color: {p.disabled}; }}
#EditSendButton {{
    background: {p.accent}; color: white; border: none; border-radius: 6px; padding: 3px 12px; font-weight: 600;
}}
#EditSendButton:hover {{ background: {p.accent_hover}; }}
#MessageEditor {{
    background: {p.surface}; border: 1px solid {p.input_border}; border-radius: 8px; padding: 4px 6px;
}}
#MessageEditor:focus {{ border: 1px solid {p.accent}; }}

#ChatHeader {{ background: {p.surface}; border-bottom: 1px solid {p.border}; }}
#HeaderCaption {{ color: {p.muted}; font-weight: 600; font-size: 9pt; }}
#SystemPromptSummary {{ color: {p.text}; }}
#SystemPromptSummary[empty="true"] {{ color: {p.muted}; font-style: italic; }}
#HeaderHint {{ color: {p.muted}; font-size: 8.5pt; }}
#HeaderButton {{
    border: 1px solid {p.border}; border-radius: 6px; padding: 3px 12px; background: {p.window_bg};
}}
#HeaderButton:hover {{ background: {p.button_hover}; }}
#SystemPromptEditor {{
    background: {p.surface}; border: 1px solid {p.input_border}; border-radius: 8px; padding: 4px 6px;
}}
#SystemPromptEditor:focus {{ border: 1px solid {p.accent}; }}

#ComposeBar {{ background: {p.window_bg}; border-top: 1px solid {p.border}; }}
#Composer {{
    background: {p.surface}; border: 1px solid {p.input_border}; border-radius: 10px; padding: 6px 8px;
}}
#Composer:focus {{ border: 1px solid {p.accent}; }}
#SendButton {{
    background: {p.accent}; color: white; border: none; border-radius: 10px;
    padding: 8px 18px; font-weight: 600; min-width: 56px;
}}
#SendButton:hover {{ background: {p.accent_hover}; }}
#SendButton[stop="true"] {{ background: {p.danger}; }}
#SendButton[stop="true"]:hover {{ background: {p.danger_hover}; }}
#AttachButton {{
    background: {p.button}; border: 1px solid {p.input_border}; border-radius: 10px;
    padding: 5px 8px; font-size: 12pt; font-weight: 600; color: {p.muted};
}}
#AttachButton:hover {{ background: {p.button_hover}; color: {p.text}; }}
#AttachmentChip {{ background: {p.code_bg}; border: 1px solid {p.code_border}; border-radius: 8px; }}
#AttachmentName {{ font-size: 9pt; }}
#AttachmentRemove {{ border: none; color: {p.muted}; font-weight: 600; padding: 0 3px; }}
#AttachmentRemove:hover {{ color: {p.danger}; }}
#AttachNote {{ color: {p.bad}; font-size: 9pt; }}

#Banner {{ background: {p.banner_bg}; border-bottom: 1px solid {p.banner_border}; }}
#Banner QLabel {{ color: {p.banner_text}; }}
#Banner QToolButton {{ border: none; color: {p.banner_text}; padding: 2px 6px; }}

#ChartsPanel {{ background: {p.surface}; }}
#ChartsSummary {{ color: {p.muted}; font-size: 9pt; }}
QDockWidget::title {{ background: {p.sidebar_bg}; padding: 6px 10px; border-bottom: 1px solid {p.border}; }}

QStatusBar {{ background: {p.sidebar_bg}; border-top: 1px solid {p.border}; }}
QStatusBar QLabel {{ color: {p.muted}; padding: 0 6px; }}
QProgressBar {{
    border: 1px solid {p.border}; border-radius: 5px; background: {p.surface}; height: 12px;
    text-align: center; font-size: 8pt;
}}
QProgressBar::chunk {{ background: {p.accent}; border-radius: 4px; }}
QMenuBar {{ background: {p.window_bg}; border-bottom: 1px solid {p.border}; }}
QMenuBar::item {{ padding: 5px 10px; background: transparent; }}
QMenuBar::item:selected {{ background: {p.hover}; border-radius: 5px; }}
QMenu {{ background: {p.surface}; border: 1px solid {p.border}; padding: 4px; }}
QMenu::item {{ padding: 5px 24px 5px 24px; border-radius: 5px; }}
QMenu::item:selected {{ background: {p.menu_selected}; color: {p.text}; }}
QMenu::item:disabled {{ color: {p.disabled}; }}
QMenu::separator {{ height: 1px; background: {p.border}; margin: 4px 8px; }}
QGroupBox {{
    border: 1px solid {p.border}; border-radius: 8px; margin-top: 14px; padding: 10px 8px 6px 8px;
    background: {p.surface};
}}
QGroupBox::title {{ subcontrol-origin: margin; left: 10px; padding: 0 4px; color: {p.muted}; }}
#DangerButton {{ color: {p.danger_hover}; }}
#ErrorText {{ color: {p.bad}; }}
#ShortcutsTable {{ background: {p.surface}; border: 1px solid {p.border}; border-radius: 8px; }}
#ShortcutsTable::item {{ padding: 0 8px; }}
#ShortcutsTable QHeaderView::section {{
    background: {p.surface}; color: {p.muted}; border: none; border-bottom: 1px solid {p.border};
    padding: 5px 8px; font-weight: 600;
}}
QSplitter::handle {{ background: {p.border}; }}
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


def resolve(choice: str, scheme: Qt.ColorScheme | None = None) -> Palette:
    """The palette for a Settings choice; "system" reads the desktop's colour scheme
    (light where it says none, as on a bare X server)."""
    if choice == "system":
        if scheme is None:
            scheme = QGuiApplication.styleHints().colorScheme()
        return DARK if scheme == Qt.ColorScheme.Dark else LIGHT
    return THEMES.get(choice, LIGHT)


def qt_palette(p: Palette) -> QPalette:
    """Fusion draws spin boxes, combo boxes, scroll bars and check boxes from the
    palette, not the sheet: every role it reads, disabled text included."""
    role, group = QPalette.ColorRole, QPalette.ColorGroup
    palette = QPalette()
    colours = {
        role.Window: p.window_bg, role.WindowText: p.text, role.Base: p.surface,
        role.AlternateBase: p.window_bg, role.Text: p.text, role.Button: p.button,
        role.ButtonText: p.text, role.BrightText: "#ffffff", role.Highlight: p.accent,
        role.HighlightedText: "#ffffff", role.PlaceholderText: p.faint, role.ToolTipBase: p.surface,
        role.ToolTipText: p.text, role.Link: p.link, role.LinkVisited: p.link,
        role.Light: p.surface, role.Midlight: p.button_hover, role.Mid: p.border,
        role.Dark: p.input_border, role.Shadow: "#000000",
    }
    for r, colour in colours.items():
        palette.setColor(r, QColor(colour))
    for r in (role.WindowText, role.Text, role.ButtonText):
        palette.setColor(group.Disabled, r, QColor(p.disabled))
    return palette


def apply_theme(app: QApplication, choice: str = "system", scheme: Qt.ColorScheme | None = None) -> Palette:
    """Style the whole app with the theme `choice` names; the palette used."""
    global _current
    p = resolve(choice, scheme)
    _current = p
    app.setStyle("Fusion")
    app.setPalette(qt_palette(p))
    font = QFont(app.font())
    if font.pointSizeF() < 10:
        font.setPointSizeF(10)
        app.setFont(font)
    app.setStyleSheet(style_sheet(p))
    app.setWindowIcon(app_icon())
    return p


class ThemeFollower(QObject):
    """Keeps the app in the chosen theme; with "system", follows the desktop when
    it switches between light and dark while the app runs."""

    changed = Signal(object)  # the Palette now applied

    def __init__(self, choice: str = "system", parent: QObject | None = None):
        super().__init__(parent)
        self.choice = choice
        self.palette = current()
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._system_changed)

    def set_choice(self, choice: str) -> Palette:
        self.choice = choice
        return self._apply(None)

    def _system_changed(self, scheme: Qt.ColorScheme) -> None:
        if self.choice == "system":
            self._apply(scheme)

    def _apply(self, scheme: Qt.ColorScheme | None) -> Palette:
        app = QApplication.instance()
        palette = apply_theme(app, self.choice, scheme) if app is not None else resolve(self.choice, scheme)
        self.palette = palette
        self.changed.emit(palette)
        return palette
