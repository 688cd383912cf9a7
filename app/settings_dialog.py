"""The Settings dialog: generation, drafting, learning, and where data lives.

It edits a copy of the values and hands back only a dict of changes; the
main window validates them through core.settings and tells the worker.
"""

from __future__ import annotations

import os

from omnidraft.core.storage.presets import all_presets, is_built_in, name_problem
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
    QInputDialog,
    QLabel,
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


def context_bounds(here: int, own: int) -> str:
    """The context a model supports and what this machine's memory allows of it."""
    if not here:
        return ""
    if not own or own <= here:
        return f"The model supports {max(here, own):,} tokens; the memory here holds all of them."
    return (f"The model supports {own:,} tokens; the memory here holds the cache of {here:,} "
            "(about a quarter of the memory free when it loaded).")


class SettingsDialog(QDialog):
    clear_all_requested = Signal()

    def __init__(
        self, settings: Settings, data_folder: str, parent: QWidget | None = None, max_context: int = 0,
        server_status: str = "Off", model_context: int = 0,
    ):
        """max_context: the most tokens the loaded model reads here (0: no model loaded);
        server_status: the local server's state line (AppServer.status);
        model_context: the most it reads by its own design, which memory may bound."""
        super().__init__(parent)
        self.setWindowTitle("Settings — OmniDraft")
        self.setObjectName("SettingsDialog")
        self.setMinimumWidth(480)
        self.original = settings

        self.temperature = _double(0.0, 2.0, 0.1, 2, settings.temperature)
        self.temperature.setToolTip("0 = greedy: the reply is exactly what plain decoding gives. Above 0 it is "
                                    "sampled from the model's own distribution, drafted or not")
        self.top_p = _double(0.05, 1.0, 0.05, 2, settings.top_p)
        self.top_k = _int(0, 1000, settings.top_k)
        self.top_k.setSpecialValueText("Off")
        self.top_k.setToolTip("Sample only from the k most likely tokens")
        self.min_p = _double(0.0, 1.0, 0.01, 2, settings.min_p)
        self.min_p.setSpecialValueText("Off")
        self.min_p.setToolTip("Leave out tokens less likely than this fraction of the most likely one")
        self.repetition_penalty = _double(1.0, 2.0, 0.05, 2, settings.repetition_penalty)
        self.repetition_penalty.setSpecialValueText("Off")
        self.repetition_penalty.setToolTip("Make tokens of the last 64 less likely to come again "
                                           "(greedy replies too). Drafting stays exact under every control")
        self.user_presets = [dict(p) for p in settings.presets]
        self.preset = QComboBox()
        self.preset.setObjectName("PresetChoice")
        self.preset.setToolTip("A system prompt and sampling controls, set together")
        self.preset.activated.connect(lambda _: self.apply_preset(self.preset.currentData()))
        preset_buttons = QHBoxLayout()
        preset_buttons.addWidget(self.preset, 1)
        for label, slot in (("Save as…", self.save_preset), ("Rename…", self.rename_preset),
                            ("Delete", self.delete_preset)):
            button = QPushButton(label)
            button.clicked.connect(lambda _=False, f=slot: f())
            preset_buttons.addWidget(button)
        self._list_presets()
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
            + (f" This model reads at most {max_context:,} tokens here." if max_context else ""))
        # Both bounds: the model's own window, and what the memory here holds of its KV cache.
        self.context_bounds = QLabel(context_bounds(max_context, model_context))
        self.context_bounds.setObjectName("ContextBounds")
        self.context_bounds.setWordWrap(True)
        generation = QGroupBox("Generation")
        form = QFormLayout(generation)
        form.addRow("Preset", preset_buttons)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top-p", self.top_p)
        form.addRow("Top-k", self.top_k)
        form.addRow("Min-p", self.min_p)
        form.addRow("Repetition penalty", self.repetition_penalty)
        form.addRow("Max reply length", self.max_tokens)
        form.addRow("Context length", self.context)
        if max_context:
            form.addRow("", self.context_bounds)
        form.addRow("Default system prompt", self.system_prompt)

        self.speculative = QCheckBox("Use the drafter (speculative decoding)")
        self.speculative.setChecked(settings.speculative)
        self.fixed = QRadioButton("Draft while a token pays for itself, up to")
        self.fixed.setToolTip("Drafting stops where the next token's chance no longer covers its cost, "
                              "as measured on this computer")
        self.adaptive = QRadioButton("Stop drafting when the risk of rejection exceeds γ")
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
        self.learn_on_battery = QCheckBox("Learn on battery power too")
        self.learn_on_battery.setChecked(settings.learning_on_battery)
        self.learn_on_battery.setToolTip("Off: on a laptop running on battery, learning waits for mains power")
        form.addRow(self.learn_on_battery)

        server = self._server_box(settings, server_status)

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
        for box in (generation, drafting, learning, server, appearance, data):
            layout.addWidget(box)
        layout.addWidget(buttons)
        self._enable()

    def _server_box(self, settings: Settings, status: str) -> QGroupBox:
        """Settings → Local server: the OpenAI-compatible server on the app's engine."""
        self.server_on = QCheckBox("Serve the target over an OpenAI-compatible API")
        self.server_on.setToolTip("For editors and tools on this computer (or, with an API key, others)")
        self.server_on.setChecked(settings.server_enabled)
        self.server_host = QLineEdit(settings.server_host)
        self.server_host.setToolTip("127.0.0.1: this machine only. Any other address needs an API key")
        self.server_port = _int(1, 65535, settings.server_port)
        self.server_key = QLineEdit(settings.server_api_key)
        self.server_key.setEchoMode(QLineEdit.EchoMode.PasswordEchoOnEdit)
        self.server_key.setPlaceholderText("None (allowed on 127.0.0.1 only)")
        self.server_key.setToolTip("Clients send it as 'Authorization: Bearer <key>'; kept in settings.json")
        self.learn_from_api = QCheckBox("Learn from served requests (like chats; off: they teach nothing)")
        self.learn_from_api.setChecked(settings.learn_from_api)
        self.server_status = QLabel(status)
        self.server_status.setObjectName("ServerStatus")
        self.server_status.setWordWrap(True)
        self.server_status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        box = QGroupBox("Local server")
        form = QFormLayout(box)
        form.addRow(self.server_on)
        form.addRow("Host", self.server_host)
        form.addRow("Port", self.server_port)
        form.addRow("API key", self.server_key)
        form.addRow(self.learn_from_api)
        form.addRow("Status", self.server_status)
        return box

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
            "top_k": self.top_k.value(),
            "min_p": round(self.min_p.value(), 4),
            "repetition_penalty": round(self.repetition_penalty.value(), 4),
            "learning_on_battery": self.learn_on_battery.isChecked(),
            "presets": tuple(dict(p) for p in self.user_presets),
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
            "server_enabled": self.server_on.isChecked(),
            "server_host": self.server_host.text().strip() or "127.0.0.1",
            "server_port": self.server_port.value(),
            "server_api_key": self.server_key.text().strip(),
            "learn_from_api": self.learn_from_api.isChecked(),
        }

    # ------------------------------------------------------------ presets

    def _list_presets(self, current: str | None = None) -> None:
        self.preset.clear()
        self.preset.addItem("Choose a preset…", None)
        for preset in all_presets(tuple(self.user_presets)):
            self.preset.addItem(preset.name + ("" if is_built_in(preset.name) else " (yours)"), preset.name)
        self.preset.setCurrentIndex(max(0, self.preset.findData(current)))

    def _preset_values(self) -> dict:
        """The fields a preset sets, as they stand in the dialog."""
        return {
            "system_prompt": self.system_prompt.toPlainText().strip(),
            "temperature": round(self.temperature.value(), 4), "top_p": round(self.top_p.value(), 4),
            "top_k": self.top_k.value(), "min_p": round(self.min_p.value(), 4),
            "repetition_penalty": round(self.repetition_penalty.value(), 4),
        }

    def apply_preset(self, name: str | None) -> None:
        """Fill the fields from the named preset (nothing is saved until OK)."""
        preset = next((p for p in all_presets(tuple(self.user_presets)) if p.name == name), None)
        if preset is None:
            return
        values = preset.values()
        self.system_prompt.setPlainText(values["system_prompt"])
        self.temperature.setValue(values["temperature"])
        self.top_p.setValue(values["top_p"])
        self.top_k.setValue(values["top_k"])
        self.min_p.setValue(values["min_p"])
        self.repetition_penalty.setValue(values["repetition_penalty"])
        self._list_presets(name)

    def _selected_own(self) -> str | None:
        name = self.preset.currentData()
        if name is None or is_built_in(name):
            QMessageBox.information(self, "Presets", "Choose one of your own presets first; "
                                    "the shipped ones can't be changed.")
            return None
        return name

    def _ask_name(self, title: str, text: str = "") -> str | None:
        name, ok = QInputDialog.getText(self, title, "Preset name:", text=text)
        return name if ok else None

    def save_preset(self, name: str | None = None) -> bool:
        """Save the fields as a new preset of the user's (asks for its name)."""
        name = self._ask_name("Save preset") if name is None else name
        if name is None:
            return False
        problem = name_problem(name, tuple(self.user_presets))
        if problem:
            QMessageBox.warning(self, "Presets", problem)
            return False
        self.user_presets.append({"name": name.strip(), **self._preset_values()})
        self._list_presets(name.strip())
        return True

    def rename_preset(self, new_name: str | None = None) -> bool:
        old = self._selected_own()
        if old is None:
            return False
        new_name = self._ask_name("Rename preset", old) if new_name is None else new_name
        if new_name is None:
            return False
        problem = name_problem(new_name, tuple(self.user_presets), renaming=old)
        if problem:
            QMessageBox.warning(self, "Presets", problem)
            return False
        for preset in self.user_presets:
            if preset["name"] == old:
                preset["name"] = new_name.strip()
        self._list_presets(new_name.strip())
        return True

    def delete_preset(self) -> bool:
        name = self._selected_own()
        if name is None:
            return False
        self.user_presets = [p for p in self.user_presets if p["name"] != name]
        self._list_presets()
        return True

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
