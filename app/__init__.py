"""PySide6 shell of OmniDraft Desktop; talks to the engine only through the worker protocol."""
