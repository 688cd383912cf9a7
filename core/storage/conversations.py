"""The user's saved conversations: one encrypted file per conversation.

Files live in data_dir()/conversations/<id>.chat, encrypted with secure_store and
written atomically, so a crash mid-save keeps the previous version. A damaged
file is moved aside (quarantined) and reported in `ConversationStore.warnings`;
it never hides the other conversations and nothing the user wrote is deleted.
"""

from __future__ import annotations

import copy
import logging
import re
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import paths
from .persistence import CorruptStateError
from .secure_store import KeyStore, KeyUnavailableError, load_encrypted, save_encrypted

ROLES = ("system", "user", "assistant")
DEFAULT_TITLE = "New chat"
TITLE_CHARS = 60
SUFFIX = ".chat"
_ID = re.compile(r"^[0-9a-f]{32}$")
log = logging.getLogger(__name__)


@dataclass
class Conversation:
    id: str
    title: str
    created: float  # seconds since the epoch
    updated: float
    messages: list[dict] = field(default_factory=list)  # {"role", "content", optional "stats"}
    model_id: str | None = None
    # Sent first, as the system message, through the target's chat template; files of
    # older versions have none ("").
    system_prompt: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: object, path: Path) -> Conversation:
        """Checked construction; CorruptStateError names what is wrong."""
        if not isinstance(raw, dict):
            raise CorruptStateError(path, "not a conversation record")
        try:
            conv = cls(
                id=str(raw["id"]),
                title=str(raw["title"]),
                created=float(raw["created"]),
                updated=float(raw["updated"]),
                messages=list(raw["messages"]),
                model_id=raw.get("model_id"),
                system_prompt=raw.get("system_prompt", ""),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptStateError(path, f"missing or invalid field {exc}") from exc
        if not isinstance(conv.system_prompt, str):
            raise CorruptStateError(path, "its system prompt is not text")
        for m in conv.messages:
            if not _valid_message(m):
                raise CorruptStateError(path, "a message has no valid role or content")
        return conv


def _valid_message(m: object) -> bool:
    return (
        isinstance(m, dict)
        and m.get("role") in ROLES
        and isinstance(m.get("content"), str)
        and isinstance(m.get("stats", {}), dict)
        and ("versions" not in m or _valid_versions(m["versions"]))
    )


def _valid_versions(versions: object) -> bool:
    """The other versions of a branch point: tails of messages, and one None where
    the tail in `messages` goes (see ConversationStore.fork)."""
    return (
        isinstance(versions, list)
        and versions.count(None) == 1
        and all(v is None or (isinstance(v, list) and v and all(map(_valid_message, v))) for v in versions)
    )


def version_of(message: dict) -> tuple[int, int] | None:
    """(position, count) of the version a message starts, or None when it has no other."""
    versions = message.get("versions")
    return (versions.index(None), len(versions)) if versions else None


def title_from(text: str) -> str:
    """A title from the first line of the first user message."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if not line:
        return DEFAULT_TITLE
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


class ConversationStore:
    """All conversations, loaded once; every change is saved to its own file."""

    def __init__(self, folder: Path | None = None, keys: KeyStore | None = None):
        self.folder = Path(folder or paths.data_dir() / "conversations")
        paths.private_dir(self.folder)
        self.keys = keys
        self.warnings: list[str] = []  # shown to the user; nothing here is fatal
        self._convs: dict[str, Conversation] = {}
        self._last_time = 0.0
        self._writer: ThreadPoolExecutor | None = None  # background saves, made on first use
        self._pending: Future | None = None  # the background save in flight
        for path in sorted(self.folder.glob(f"*{SUFFIX}")):
            self._load_one(path)

    def _load_one(self, path: Path) -> None:
        try:
            conv = Conversation.from_dict(load_encrypted(path, None, self.keys), path)
            if conv.id != path.stem or not _ID.match(conv.id):
                raise CorruptStateError(path, "its id does not match its file name")
        except KeyUnavailableError:
            # Intact but not openable with today's key: leave it exactly where it is.
            self.warnings.append(
                f"The conversation in {path.name} was encrypted with a key that is not "
                "available now (is the system keyring locked?); it was left untouched."
            )
            return
        except CorruptStateError as exc:
            kept = exc.quarantine()
            self.warnings.append(
                f"A saved conversation was damaged and could not be opened; "
                f"it was kept as {kept.name} in {kept.parent}."
            )
            return
        self._convs[conv.id] = conv

    def _now(self) -> float:
        """Strictly increasing, so "newest first" holds even within one clock tick."""
        self._last_time = max(time.time(), self._last_time + 1e-6)
        return self._last_time

    def _path(self, conv_id: str) -> Path:
        if not _ID.match(conv_id):  # ids become file names: refuse anything else
            raise KeyError(conv_id)
        return self.folder / f"{conv_id}{SUFFIX}"

    # ------------------------------------------------------------------ queries

    def list(self) -> list[Conversation]:
        """Newest (most recently updated) first."""
        return sorted(self._convs.values(), key=lambda c: (c.updated, c.created), reverse=True)

    def get(self, conv_id: str) -> Conversation:
        """KeyError when there is no such conversation."""
        return self._convs[conv_id]

    def __contains__(self, conv_id: object) -> bool:
        return conv_id in self._convs

    def __len__(self) -> int:
        return len(self._convs)

    # ------------------------------------------------------------------ changes

    def new(
        self, model_id: str | None = None, title: str = DEFAULT_TITLE, system_prompt: str = "",
    ) -> Conversation:
        now = self._now()
        conv = Conversation(
            uuid.uuid4().hex, title.strip() or DEFAULT_TITLE, now, now, [], model_id, system_prompt.strip()
        )
        self._convs[conv.id] = conv
        self.save(conv.id)
        return conv

    def add(
        self, title: str, messages: list[dict], system_prompt: str = "", model_id: str | None = None,
        created: float | None = None,
    ) -> Conversation:
        """A new conversation holding messages from elsewhere (an imported file): a
        new id, so it never replaces one the user has; newest, so it is listed first."""
        now = self._now()
        conv = Conversation(uuid.uuid4().hex, title.strip()[:200] or DEFAULT_TITLE, created or now, now,
                            copy.deepcopy(messages), model_id, system_prompt)
        self._convs[conv.id] = conv
        try:
            self.save(conv.id)
        except BaseException:
            del self._convs[conv.id]  # not saved: not listed either
            raise
        return conv

    def write_new(
        self, title: str, messages: list[dict], system_prompt: str = "", model_id: str | None = None,
        created: float | None = None, now: float | None = None,
    ) -> Conversation:
        """A new conversation written to its own file but not listed yet (adopt
        lists it). It touches nothing the store holds, so a background thread can
        encrypt and write a large imported chat while the window stays responsive.
        `messages` are taken as they are: pass a list nobody else changes."""
        now = now or time.time()
        conv = Conversation(uuid.uuid4().hex, title.strip()[:200] or DEFAULT_TITLE, created or now, now,
                            messages, model_id, system_prompt)
        save_encrypted(self._path(conv.id), conv.to_dict(), self.keys)
        return conv

    def adopt(self, conv: Conversation) -> Conversation:
        """List a conversation write_new saved; newest, so it is listed first."""
        conv.updated = self._now()
        self._convs[conv.id] = conv
        return conv

    def rename(self, conv_id: str, title: str) -> Conversation:
        conv = self.get(conv_id)
        conv.title = title.strip()[:200] or DEFAULT_TITLE
        self._touch_and_save(conv)
        return conv

    def fork(self, conv_id: str, index: int, tail: list[dict]) -> Conversation:
        """Replace the messages from `index` on with `tail` (an edited message, a
        regenerated reply), keeping the old ones as another version to switch back to.

        A branch point is the first message of the tail in `messages`; its
        "versions" list holds every version's tail in order, with None where the
        one in `messages` goes, so older files (no "versions") need nothing new
        and a branch inside a kept version keeps its own versions.
        """
        conv = self.get(conv_id)
        if not 0 <= index < len(conv.messages) or not tail:
            raise ValueError(f"no message {index} to fork from, or nothing to put there")
        old_tail = conv.messages[index:]
        versions = old_tail[0].pop("versions", None) or [None]
        versions[versions.index(None)] = old_tail
        tail[0]["versions"] = versions + [None]
        conv.messages[index:] = tail
        self._touch_and_save(conv)
        return conv

    def switch_version(self, conv_id: str, index: int, position: int) -> Conversation:
        """Show version `position` of the branch point at `index` (see fork)."""
        conv = self.get(conv_id)
        versions = conv.messages[index].get("versions") if 0 <= index < len(conv.messages) else None
        if not versions or not 0 <= position < len(versions):
            raise ValueError(f"message {index} has no version {position}")
        current = versions.index(None)
        if position != current:
            chosen = versions[position]
            old_tail = conv.messages[index:]
            del old_tail[0]["versions"]
            versions[current], versions[position] = old_tail, None
            chosen[0]["versions"] = versions
            conv.messages[index:] = chosen
            self._touch_and_save(conv)
        return conv

    def set_system_prompt(self, conv_id: str, text: str) -> Conversation:
        """The system prompt for this conversation's next replies ("" for none)."""
        conv = self.get(conv_id)
        conv.system_prompt = text.strip()
        self._touch_and_save(conv)
        return conv

    def delete(self, conv_id: str) -> None:
        path = self._path(conv_id)
        self.flush()  # a background save landing after the unlink would bring the chat back
        self._convs.pop(conv_id, None)
        path.unlink(missing_ok=True)

    def append_message(
        self, conv_id: str, role: str, content: str, stats: dict | None = None,
        model_id: str | None = None, extra: dict | None = None,
    ) -> Conversation:
        """Add a message (`extra`: more of its fields, e.g. its author); the first
        user message names a still-untitled conversation."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        conv = self.get(conv_id)
        message: dict = {"role": role, "content": content, **(extra or {})}
        if stats is not None:
            message["stats"] = dict(stats)
        conv.messages.append(message)
        if role == "user" and conv.title == DEFAULT_TITLE:
            conv.title = title_from(content)
        if model_id is not None:
            conv.model_id = model_id
        self._touch_and_save(conv)
        return conv

    def update_last_message(
        self, conv_id: str, content: str, stats: dict | None = None, persist: bool = True
    ) -> Conversation:
        """Replace the last message's text (a streaming reply).

        persist=False only updates memory: saving on every streamed batch would
        re-encrypt and fsync the whole conversation dozens of times a second; call
        save() when the reply finishes.
        """
        conv = self.get(conv_id)
        if not conv.messages:
            raise ValueError("the conversation has no message to update")
        last = conv.messages[-1]
        last["content"] = content
        if stats is not None:
            last["stats"] = dict(stats)
        conv.updated = self._now()
        if persist:
            self.save(conv_id)
        return conv

    def touch(self, conv_id: str) -> Conversation:
        """Save a conversation whose messages were changed in place (a finished reply)."""
        conv = self.get(conv_id)
        self._touch_and_save(conv)
        return conv

    def forget_all(self) -> None:
        """Forget every conversation in memory, files untouched (paths.clear_data
        deletes the folder's files, including those this store never loaded)."""
        self.flush()
        self._convs.clear()

    def save(self, conv_id: str) -> None:
        conv = self.get(conv_id)
        self.flush()  # an older snapshot written in the background must not land after this
        save_encrypted(self._path(conv.id), conv.to_dict(), self.keys)

    def save_in_background(self, conv_id: str) -> None:
        """Save the conversation as it is now from a background thread: a streaming
        reply is saved every second or so, and encrypting and fsyncing a long chat
        must not hold up the window. The snapshot is taken here; one write is in
        flight at a time, so writes land in the order they were asked for."""
        conv = self.get(conv_id)
        snapshot, path = conv.to_dict(), self._path(conv.id)
        self.flush()
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="conversation-save")
        self._pending = self._writer.submit(save_encrypted, path, snapshot, self.keys)

    def flush(self) -> None:
        """Wait for the background save in flight, if any (a failed one is logged: the
        next save writes the same conversation again)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending.result()
            except (OSError, ValueError) as exc:
                log.warning("saving a conversation in the background failed: %s", exc)

    def _touch_and_save(self, conv: Conversation) -> None:
        conv.updated = self._now()
        self.save(conv.id)
