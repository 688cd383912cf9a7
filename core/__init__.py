"""Qt-free engine of OmniDraft Desktop. Never imports PySide6."""
