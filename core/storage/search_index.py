"""Full-text search over every chat's messages, held in memory only.

The chats are encrypted at rest, so the index is never written anywhere: it is
built from the conversations in memory when the app starts and kept current
by `sync`, which re-reads only the chats that changed since it last looked (a
chat's fingerprint is its update time, message count and last message's
length: every change the store makes moves at least one of them). A chat's
entry is its shown messages' text, lower-cased, joined into one string with
each message's offset, so a query is one `str.find` scan per chat (C speed)
instead of a Python loop per message, and finds words inside words ("revers"
finds "reverse"). Every word of the query must be in the same message.

The first build reads every chat (a quarter of a second for 1,000 long ones:
`python -m omnidraft.tools.search_index_size`), so `start_building` does it on a
thread while the window opens; it reads the chats only (their texts are
immutable strings), and the first `sync` waits for it, then re-reads any chat
that changed meanwhile.
"""

from __future__ import annotations

import sys
import threading
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass

# Between messages in a chat's joined text: a query (one line of words) never spans it.
_SEPARATOR = "\n\x00\n"
SNIPPET_CHARS = 90  # the matching line shown, cut around the match


@dataclass(frozen=True)
class Hit:
    conv_id: str
    index: int  # the message's position in the conversation's messages
    role: str
    line: str  # the matching line, cut to about SNIPPET_CHARS around the match


@dataclass
class _Entry:
    stamp: tuple
    text: str  # the shown messages, lower-cased, joined by _SEPARATOR
    starts: list[int]  # where each message begins in `text`
    indices: list[int]  # its position in the conversation's messages
    roles: list[str]
    updated: float


def _stamp(conv) -> tuple:
    last = conv.messages[-1].get("content", "") if conv.messages else ""
    return conv.updated, len(conv.messages), len(last)


def _entry(conv) -> _Entry:
    parts, starts, indices, roles, pos = [], [], [], [], 0
    for i, message in enumerate(conv.messages):
        if message.get("role") == "system":
            continue
        text = message.get("content", "").lower()
        parts.append(text)
        starts.append(pos)
        indices.append(i)
        roles.append(message["role"])
        pos += len(text) + len(_SEPARATOR)
    return _Entry(_stamp(conv), _SEPARATOR.join(parts), starts, indices, roles, conv.updated)


def snippet(content: str, terms: list[str]) -> str:
    """The first line of `content` holding the first term, cut around it."""
    first = terms[0]
    for line in content.splitlines():
        at = line.lower().find(first)
        if at >= 0:
            line = line.strip()
            at = max(0, line.lower().find(first))
            if len(line) <= SNIPPET_CHARS:
                return line
            start = max(0, min(at - SNIPPET_CHARS // 3, len(line) - SNIPPET_CHARS))
            cut = line[start:start + SNIPPET_CHARS]
            return ("…" if start else "") + cut + ("…" if start + SNIPPET_CHARS < len(line) else "")
    return content.strip().splitlines()[0][:SNIPPET_CHARS] if content.strip() else ""


class SearchIndex:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._building: threading.Thread | None = None
        self._built: dict[str, _Entry] = {}

    def __len__(self) -> int:
        self._join()
        return len(self._entries)

    def start_building(self, conversations: Iterable) -> None:
        """Index `conversations` on a background thread (the app's start)."""
        snapshot = list(conversations)

        def build() -> None:
            self._built = {conv.id: _entry(conv) for conv in snapshot}

        self._building = threading.Thread(target=build, name="search-index", daemon=True)
        self._building.start()

    def _join(self) -> None:
        if self._building is not None:
            self._building.join()
            self._building = None
            self._entries.update(self._built)
            self._built = {}

    def sync(self, conversations: Iterable) -> int:
        """Bring the index up to date with `conversations` (every chat there is):
        index the new and changed ones, drop the deleted. Returns how many were
        (re-)indexed."""
        self._join()
        seen, changed = set(), 0
        for conv in conversations:
            seen.add(conv.id)
            entry = self._entries.get(conv.id)
            if entry is None or entry.stamp != _stamp(conv):
                self._entries[conv.id] = _entry(conv)
                changed += 1
        for conv_id in self._entries.keys() - seen:
            del self._entries[conv_id]
        return changed


    def search(self, query: str, contents, limit: int = 200) -> list[Hit]:
        """Messages holding every word of `query` (case-insensitive), newest chat
        first; `contents(conv_id, index)` gives a message's text for its snippet."""
        self._join()
        terms = sorted(set(query.lower().split()), key=len, reverse=True)
        if not terms:
            return []
        hits: list[Hit] = []
        for conv_id, entry in sorted(self._entries.items(), key=lambda kv: kv[1].updated, reverse=True):
            text, starts = entry.text, entry.starts
            pos = text.find(terms[0])
            while pos >= 0:
                m = bisect_right(starts, pos) - 1
                end = starts[m + 1] if m + 1 < len(starts) else len(text)
                if all(text.find(t, starts[m], end) >= 0 for t in terms[1:]):
                    index = entry.indices[m]
                    hits.append(Hit(conv_id, index, entry.roles[m], snippet(contents(conv_id, index), terms)))
                    if len(hits) >= limit:
                        return hits
                pos = text.find(terms[0], end)
        return hits

    def nbytes(self) -> int:
        """About how much memory the index holds (its strings and lists)."""
        total = sys.getsizeof(self._entries)
        for conv_id, e in self._entries.items():
            total += sys.getsizeof(conv_id) + sys.getsizeof(e) + sys.getsizeof(e.text) + sys.getsizeof(e.stamp)
            total += sum(sys.getsizeof(x) for x in (e.starts, e.indices, e.roles))
            total += sum(sys.getsizeof(x) for x in e.starts) + sum(sys.getsizeof(x) for x in e.indices)
        return total
