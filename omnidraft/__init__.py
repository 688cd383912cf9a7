"""OmniDraft Desktop: local chat with one cross-vocabulary drafter for any target."""

__version__ = "0.1.0"
