"""Storage: data folders, atomic and encrypted files, conversations, settings."""
