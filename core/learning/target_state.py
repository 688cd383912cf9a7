"""What was learned for each target, kept apart per target: its n-gram cache and
drafting statistics (files in its state folder), its replay buffer (in the same
folder), and its acceptance head (saved with its LoRA adapter, core/learning/adapters.py).

A damaged file is moved aside, never deleted, and learning starts over; a file
encrypted with a key this machine lacks is left untouched and not overwritten
this session. Either way the user is told (the engine's warnings).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from ..decoding.adaptive_drafting import DraftPolicy
from ..decoding.vocab_bridge import NgramCache
from ..storage import paths
from ..storage.persistence import CorruptStateError
from ..storage.secure_store import KeyUnavailableError
from .acceptance_head import AcceptanceHead
from .replay_buffer import ReplayBuffer

if TYPE_CHECKING:
    from .adapters import AdapterStore

# Learned per-target state files (encrypted), and where versions before encryption
# kept them as plaintext JSON (migrated on first load).
NGRAM_FILE, NGRAM_LEGACY = "ngram_cache.bin", "ngram_cache.json"
POLICY_FILE, POLICY_LEGACY = "draft_policy.bin", "draft_policy.json"
REPLAY_FILE = "replay.bin"


def state_folder(drafter_id: str, target_id: str) -> Path:
    """Where what a drafter learned for a target is kept (its adapter aside)."""
    return paths.data_dir() / "state" / f"{drafter_id}--{target_id}"


class TargetState:
    """Loads, saves and forgets each target's learned state (in its `folder`,
    state_folder()); keeps the acceptance heads of the targets met in this session."""

    def __init__(self, warnings: list[str]):
        self.warnings = warnings  # what reaches the user (the engine's list)
        self._heads: dict[str, AcceptanceHead] = {}  # per target, trained with its adapter
        # (target id, file name) of files under a key this machine lacks: not overwritten.
        self._unsaved: set[tuple[str, str]] = set()

    def ngram_cache(self, target_id: str, folder: Path) -> NgramCache:
        return self._load(target_id, folder, NGRAM_FILE, NGRAM_LEGACY, NgramCache, "n-gram cache")

    def draft_policy(self, target_id: str, folder: Path) -> DraftPolicy:
        return self._load(target_id, folder, POLICY_FILE, POLICY_LEGACY, DraftPolicy, "drafting statistics")

    def _load(self, target_id: str, folder: Path, name: str, legacy: str, kind, what: str):
        """kind.load(state file), or a fresh kind() with a warning when the file is
        damaged (moved aside, never deleted) or under another key (left as it is)."""
        self._unsaved.discard((target_id, name))
        try:
            return kind.load(folder / name, legacy=folder / legacy)
        except KeyUnavailableError:
            self._unsaved.add((target_id, name))
            self.warnings.append(
                f"The file of learned {what} ({name}) was encrypted with a key that is not "
                "available now; it was left untouched and is not updated this session."
            )
            return kind()
        except CorruptStateError as exc:
            kept = exc.quarantine()
            self.warnings.append(f"The file of learned {what} was damaged; it starts over (kept as {kept.name}).")
            return kind()

    def save(self, target_id: str, folder: Path, cache: NgramCache, policy: DraftPolicy) -> None:
        """The target's n-gram cache and drafting statistics, except a file under another key."""
        for name, state in ((NGRAM_FILE, cache), (POLICY_FILE, policy)):
            if (target_id, name) not in self._unsaved:
                state.save(folder / name)

    def replay_buffer(self, folder: Path, max_samples: int) -> ReplayBuffer:
        buffer = ReplayBuffer.load(folder / REPLAY_FILE, max_samples)
        if buffer.warning:
            self.warnings.append(buffer.warning)
        return buffer

    def head(self, target_id: str, adapters: AdapterStore, width: int) -> AcceptanceHead:
        """The target's acceptance head for a drafter of hidden size `width`: the one
        learning in this session, else the one saved with its adapter, else a fresh
        one (which drafts as if none)."""
        if target_id not in self._heads:
            state = adapters.head_state(target_id)
            head = AcceptanceHead(width)
            if state is not None:
                try:
                    head = AcceptanceHead.from_state(state, width)
                except ValueError as exc:
                    self.warnings.append(f"The acceptance head learned for {target_id} does not fit "
                                         f"this drafter ({exc}); it starts over.")
            self._heads[target_id] = head
        return self._heads[target_id]

    def take_adapter_warnings(self, adapters: AdapterStore | None) -> None:
        """The adapter store's reports (damaged files set aside) reach the user."""
        if adapters is not None and adapters.warnings:
            self.warnings.extend(adapters.warnings)
            adapters.warnings.clear()

    def forget(self, target_id: str, folder: Path) -> None:
        """Delete the target's state folder and its head (its adapter is the store's)."""
        shutil.rmtree(folder, ignore_errors=True)
        self._heads.pop(target_id, None)
        self._unsaved = {k for k in self._unsaved if k[0] != target_id}
