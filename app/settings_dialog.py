"""The Settings dialog: generation, drafting, learning, and where data lives.

It edits a copy of the values and hands back only a dict of changes; the
main window validates them through core.settings and tells the worker.
"""

from __future__ import annotations

import os

from omnidraft.core.storage.settings import Settings
from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

DEFAULT_GAMMA = 0.3  # the paper's value for chat and summaries
THEMES = {"system": "Follow the system", "light": "Light", "dark": "Dark"}
MAX_CONTEXT = 131072  # the setting's range (core.storage.settings) while no model says less


def _double(low: float, high: float, step: float, decimals: int, value: float) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(low, high)
    box.setSingleStep(step)
    box.setDecimals(decimals)
    box.setValue(value)
    return box


def _int(low: int, high: int, value: int, suffix: str = "") -> QSpinBox:
    box = QSpinBox()
    box.setRange(low, high)
    box.setValue(value)
    box.setSuffix(suffix)
    return box


class SettingsDialog(QDialog):
    clear_all_requested = Signal()

    def __init__(
        self, settings: Settings, data_folder: str, parent: QWidget | None = None, max_context: int = 0,
    ):
        """max_context: the most tokens the loaded model reads (0: no model loaded)."""
        super().__init__(parent)
        self.setWindowTitle("Settings — OmniDraft")
        self.setObjectName("SettingsDialog")
        self.setMinimumWidth(480)
        self.original = settings

        self.temperature = _double(0.0, 2.0, 0.1, 2, settings.temperature)
        self.temperature.setToolTip("0 = greedy: the reply is exactly what plain decoding gives. Above 0 it is "
                                    "sampled from the model's own distribution, drafted or not")
        self.top_p = _double(0.05, 1.0, 0.05, 2, settings.top_p)
        self.max_tokens = _int(1, 8192, settings.max_new_tokens, " tokens")
        self.system_prompt = QPlainTextEdit(settings.system_prompt)
        self.system_prompt.setObjectName("DefaultSystemPrompt")
        self.system_prompt.setPlaceholderText("None: the model's own default behaviour")
        self.system_prompt.setToolTip("New chats start with this; each chat can change its own above the chat")
        self.system_prompt.setTabChangesFocus(True)
        self.system_prompt.setFixedHeight(64)
        # 0 = the model's own; a model that reads less bounds a longer setting.
        self.context = _int(0, max(max_context, settings.context_tokens) if max_context else MAX_CONTEXT,
                            settings.context_tokens, " tokens")
        self.context.setSingleStep(512)
        self.context.setSpecialValueText(
            f"The model's maximum ({max_context:,} tokens)" if max_context else "The model's maximum")
        self.context.setToolTip(
            "How much of a chat (with the reply) the model reads; older messages are left out "
            "beyond it, the system prompt always kept."
            + (f" This model reads at most {max_context:,} tokens." if max_context else ""))
        generation = QGroupBox("Generation")
        form = QFormLayout(generation)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top-p", self.top_p)
        form.addRow("Max reply length", self.max_tokens)
        form.addRow("Context length", self.context)
        form.addRow("Default system prompt", self.system_prompt)

        self.speculative = QCheckBox("Use the drafter (speculative decoding)")
        self.speculative.setChecked(settings.speculative)
        self.fixed = QRadioButton("Fixed draft length")
        self.adaptive = QRadioButton("Adaptive: stop drafting when the risk of rejection exceeds γ")
        group = QButtonGroup(self)
        group.addButton(self.fixed)
        group.addButton(self.adaptive)
        self.draft_length = _int(1, 16, settings.draft_length, " tokens")
        self.gamma = _double(0.05, 0.95, 0.05, 2, settings.adaptive_gamma or DEFAULT_GAMMA)
        (self.adaptive if settings.adaptive_gamma is not None else self.fixed).setChecked(True)
        self.highlight = QCheckBox("Tint text that came from accepted drafts")
        self.highlight.setChecked(settings.highlight_drafts)
        drafting = QGroupBox("Drafting")
        form = QFormLayout(drafting)
        form.addRow(self.speculative)
        form.addRow(self.fixed, self.draft_length)
        form.addRow(self.adaptive)
        form.addRow("γ (stop threshold)", self.gamma)
        form.addRow(self.highlight)
        for widget in (self.fixed, self.adaptive, self.speculative):
            widget.toggled.connect(self._enable)

        self.idle_delay = _double(1.0, 3600.0, 5.0, 0, settings.idle_delay_s)
        self.idle_delay.setSuffix(" s")
        self.threads = _int(1, os.cpu_count() or 1, settings.learner_threads)
        learning = QGroupBox("Learning (while you are idle)")
        form = QFormLayout(learning)
        form.addRow("Start after idle for", self.idle_delay)
        form.addRow("Learner threads", self.threads)

        self.theme = QComboBox()
        self.theme.setObjectName("ThemeChoice")
        for key, label in THEMES.items():
            self.theme.addItem(label, key)
        self.theme.setCurrentIndex(max(0, self.theme.findData(settings.theme)))
        self.theme.setToolTip("Light or dark; following the system switches with the desktop's setting")
        appearance = QGroupBox("Appearance")
        QFormLayout(appearance).addRow("Theme", self.theme)

        self.data_folder = QLineEdit(data_folder)
        self.data_folder.setReadOnly(True)
        open_folder = QPushButton("Open folder")
        open_folder.clicked.connect(
            lambda: QDesktopServices.openUrl(QUrl.fromLocalFile(data_folder))
        )
        clear = QPushButton("Clear all data…")
        clear.setObjectName("DangerButton")
        clear.clicked.connect(self._ask_clear)
        folder_row = QHBoxLayout()
        folder_row.addWidget(self.data_folder, 1)
        folder_row.addWidget(open_folder)
        data = QGroupBox("Your data")
        data_layout = QVBoxLayout(data)
        data_layout.addLayout(folder_row)
        data_layout.addWidget(clear, 0, Qt.AlignmentFlag.AlignLeft)

        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)

        layout = QVBoxLayout(self)
        layout.setSpacing(12)
        for box in (generation, drafting, learning, appearance, data):
            layout.addWidget(box)
        layout.addWidget(buttons)
        self._enable()

    def _enable(self) -> None:
        on = self.speculative.isChecked()
        for widget in (self.fixed, self.adaptive, self.highlight):
            widget.setEnabled(on)
        self.draft_length.setEnabled(on and self.fixed.isChecked())
        self.gamma.setEnabled(on and self.adaptive.isChecked())

    def values(self) -> dict:
        return {
            "temperature": round(self.temperature.value(), 4),
            "top_p": round(self.top_p.value(), 4),
            "max_new_tokens": self.max_tokens.value(),
            "speculative": self.speculative.isChecked(),
            "draft_length": self.draft_length.value(),
            "adaptive_gamma": round(self.gamma.value(), 4) if self.adaptive.isChecked() else None,
            "highlight_drafts": self.highlight.isChecked(),
            "idle_delay_s": float(self.idle_delay.value()),
            "learner_threads": self.threads.value(),
            "system_prompt": self.system_prompt.toPlainText().strip(),
            "context_tokens": self.context.value(),
            "theme": self.theme.currentData(),
        }

    def changes(self) -> dict:
        """Only what the user changed, so untouched values keep their exact saved form."""
        old = self.original.to_dict()
        return {k: v for k, v in self.values().items() if old.get(k) != v}

    def _ask_clear(self) -> None:
        answer = QMessageBox.warning(
            self,
            "Clear all data",
            "Delete all conversations, chart history, added models and everything the "
            "drafter has learned? This cannot be undone.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
            QMessageBox.StandardButton.Cancel,
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.clear_all_requested.emit()
            self.reject()
