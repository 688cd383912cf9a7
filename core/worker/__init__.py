"""The engine process and the typed protocol the GUI speaks with it."""
