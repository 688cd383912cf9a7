"""A conversation as a file a person can keep or share: JSON (everything) or Markdown.

JSON holds the conversation exactly as the store keeps it (Conversation.to_dict:
every message with its fields, the other versions of a forked chat), so it
re-imports identically. Markdown is for reading: the title, the system prompt
and the messages shown, each under a "You" / "Assistant" heading, text
verbatim. Before each part an HTML comment (invisible when rendered) names its
role and length, so our own Markdown imports back exactly even when a message
itself contains headings or such comments; a part edited by hand by someone
(its length no longer matching) is read up to the next part instead.

Import never trusts the file: its size is capped, its shape checked field by
field (the chat view formats these fields, a wrong type would break it later),
and anything wrong is a ChatImportError with a sentence for the user. Nothing
here writes to the store; the caller adds the checked result as a new chat.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from .conversations import DEFAULT_TITLE, ROLES, Conversation, _valid_versions

FORMAT = "omnidraft-chat"
VERSION = 1
MAX_IMPORT_BYTES = 20 * 1024 * 1024  # far beyond any chat; a bigger file is not one of ours
HEADINGS = {"user": "You", "assistant": "Assistant", "system": "System prompt"}
_MARK = re.compile(r"^<!-- omnidraft (user|assistant|system) (\d+) chars -->$", re.MULTILINE)
# Message fields the chat view reads, and the types it needs of them.
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "author": (str,), "note": (str,), "finish_reason": (str,), "drafted": (list,),
    "context_from": (int,), "baseline_tokens_per_s": (int, float, type(None)), "stats": (dict,),
}
_NUMERIC_STATS = ("new_tokens", "tokens_per_s", "tokens_per_step", "acceptance_rate")
# Versions of versions (an edit of a reply to an edited message...): far more than
# anyone makes, and few enough that checking and saving them never nears Python's
# recursion limit.
MAX_VERSION_DEPTH = 64


class ChatImportError(ValueError):
    """A file that cannot be imported; the message is written for the user."""


@dataclass
class ImportedChat:
    title: str
    messages: list[dict]
    system_prompt: str = ""
    model_id: str | None = None
    created: float | None = None
    warnings: list[str] = field(default_factory=list)


# ------------------------------------------------------------------ export


def to_json(conv: Conversation) -> str:
    record = conv.to_dict()
    record.pop("id")  # an import is always a new chat with its own id
    return json.dumps({"format": FORMAT, "version": VERSION, "conversation": record},
                      ensure_ascii=False, indent=1)


def to_markdown(conv: Conversation, assistant_name: str | None = None) -> str:
    """The conversation as shown (the current version of each message)."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(conv.created))
    parts = [f"# {_one_line(conv.title) or DEFAULT_TITLE}\n",
             f"*Exported from OmniDraft Desktop · chat started {when}"
             + (f" · model {assistant_name}" if assistant_name else "") + "*\n"]
    if conv.system_prompt:
        parts.append(_part("system", conv.system_prompt, HEADINGS["system"]))
    for message in conv.messages:
        if message["role"] == "system":
            continue  # the conversation's own system prompt is the one above
        heading = HEADINGS[message["role"]]
        if message["role"] == "assistant" and message.get("author"):
            heading += f" ({_one_line(message['author'])})"
        parts.append(_part(message["role"], message["content"], heading))
    return "\n".join(parts)


def _part(role: str, text: str, heading: str) -> str:
    return f"<!-- omnidraft {role} {len(text)} chars -->\n### {heading}\n\n{text}\n"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def write_export(conv: Conversation, path: Path, kind: str, assistant_name: str | None = None) -> None:
    """Write `conv` to `path` as "json" or "markdown" (UTF-8)."""
    text = to_json(conv) if kind == "json" else to_markdown(conv, assistant_name)
    Path(path).write_text(text, encoding="utf-8")


# ------------------------------------------------------------------ import


def read_chat_file(path: Path) -> ImportedChat:
    """The chat in an exported file (JSON or our Markdown), checked."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_IMPORT_BYTES:
            raise ChatImportError(f"{path.name} is {size / 2**20:.0f} MB; a chat file is at most "
                                  f"{MAX_IMPORT_BYTES // 2**20} MB.")
        with path.open("rb") as f:
            data = f.read(MAX_IMPORT_BYTES + 1)  # the file may have grown since stat
    except OSError as exc:
        raise ChatImportError(f"{path.name} could not be read: {exc.strerror or exc}.") from exc
    if len(data) > MAX_IMPORT_BYTES:
        raise ChatImportError(f"{path.name} is over {MAX_IMPORT_BYTES // 2**20} MB.")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ChatImportError(f"{path.name} is not a text file (not UTF-8).") from exc
    if path.suffix.lower() == ".json" or text.lstrip().startswith("{"):
        return parse_json(text, path.name)
    return parse_markdown(text, path.name)


def _finite(text: str) -> float | None:
    """A JSON number; one beyond float's range (1e999) reads as unknown (None)."""
    value = float(text)
    return value if math.isfinite(value) else None


def parse_json(text: str, name: str = "The file") -> ImportedChat:
    try:
        # NaN and Infinity (which Python's json writes and reads) are no figures:
        # they read as unknown, so the chat view never shows "nan tok/s".
        raw = json.loads(text, parse_constant=lambda _: None, parse_float=_finite)
    except RecursionError as exc:
        raise ChatImportError(f"{name} is not valid JSON for a chat: it nests its data far deeper "
                              "than any chat does.") from exc
    except ValueError as exc:
        raise ChatImportError(f"{name} is not valid JSON ({_short(exc)}).") from exc
    # Our export wraps the record; a bare conversation record (a .chat file's content) works too.
    if isinstance(raw, dict) and raw.get("format") == FORMAT:
        if not isinstance(raw.get("version"), int) or raw["version"] > VERSION:
            raise ChatImportError(f"{name} was written by a newer OmniDraft (format version "
                                  f"{raw.get('version')!r}); update the app to import it.")
        raw = raw.get("conversation")
    if not isinstance(raw, dict) or not isinstance(raw.get("messages"), list):
        raise ChatImportError(f"{name} is not an OmniDraft chat export (no conversation with messages).")
    title, prompt, model_id = raw.get("title", DEFAULT_TITLE), raw.get("system_prompt", ""), raw.get("model_id")
    if not isinstance(title, str) or not isinstance(prompt, str) or not isinstance(model_id, str | None):
        raise ChatImportError(f"{name}: the title, system prompt or model is not text.")
    created = raw.get("created")
    created = float(created) if isinstance(created, int | float) and not isinstance(created, bool) else None
    for i, message in enumerate(raw["messages"]):
        problem = message_problem(message)
        if problem:
            raise ChatImportError(f"{name}: message {i + 1} {problem}.")
    return ImportedChat(title, raw["messages"], prompt, model_id, created)


def parse_markdown(text: str, name: str = "The file") -> ImportedChat:
    text = text.replace("\r\n", "\n")
    marks = list(_MARK.finditer(text))
    if not marks:
        raise ChatImportError(f"{name} is not a chat exported by OmniDraft (no message markers found).")
    title_line = re.search(r"^# (.+)$", text[: marks[0].start()], re.MULTILINE)
    chat = ImportedChat(title_line.group(1).strip() if title_line else DEFAULT_TITLE, [])
    pos, edited = 0, 0
    while True:
        mark = _MARK.search(text, pos)
        if mark is None:
            break
        role, length = mark.group(1), int(mark.group(2))
        heading_end = text.find("\n", mark.end() + 1)
        start = len(text) if heading_end < 0 else heading_end + 2  # the heading, then one blank line
        end = start + length
        following = _MARK.search(text, end)
        stop = following.start() if following else len(text)
        if text[end:stop].strip() == "" and end <= len(text):
            content, pos = text[start:end], stop
        else:  # edited by hand: the text up to the next marker
            following = _MARK.search(text, start)
            stop = following.start() if following else len(text)
            content, pos = text[start:stop].strip("\n"), stop
            edited += 1
        if role == "system":
            chat.system_prompt = content
        else:
            chat.messages.append({"role": role, "content": content})
    if edited:
        chat.warnings.append(f"{edited} part{'s' if edited > 1 else ''} of {name} had been edited by hand; "
                             "their text was read up to the next message.")
    return chat


def _versions_depth(message: dict) -> int:
    """How deep a message's versions nest (a version's messages may have versions
    of their own), counted without recursion; stops counting past MAX_VERSION_DEPTH."""
    deepest, stack = 0, [(message, 0)]
    while stack and deepest <= MAX_VERSION_DEPTH:
        current, depth = stack.pop()
        deepest = max(deepest, depth)
        versions = current.get("versions") if isinstance(current, dict) else None
        for version in versions if isinstance(versions, list) else ():
            for other in version if isinstance(version, list) else ():
                stack.append((other, depth + 1))
    return deepest


def message_problem(message: object, depth: int = 0) -> str | None:
    """What is wrong with one imported message (and its other versions), or None."""
    if depth == 0 and isinstance(message, dict) and _versions_depth(message) > MAX_VERSION_DEPTH:
        return (f"has versions nested more than {MAX_VERSION_DEPTH} deep (edits of edits); "
                "no chat made here is like that")
    if not isinstance(message, dict):
        return "is not a message record"
    if message.get("role") not in ROLES:
        return f"has no valid role (one of {', '.join(ROLES)})"
    if not isinstance(message.get("content"), str):
        return "has no text"
    for key, types in _FIELD_TYPES.items():
        if key in message and (not isinstance(message[key], types) or isinstance(message[key], bool)):
            return f"has a wrong '{key}' field"
    if not all(isinstance(run, list) and len(run) == 2 and all(type(x) is int for x in run)
               for run in message.get("drafted", [])):
        return "has a wrong 'drafted' field"
    stats = message.get("stats", {})
    if any(not isinstance(stats.get(k, 0), int | float | type(None)) for k in _NUMERIC_STATS):
        return "has wrong figures in its 'stats'"
    if "versions" in message:
        if not _valid_versions(message["versions"]):
            return "has a wrong 'versions' list"
        for version in message["versions"]:
            for other in version or []:
                if (problem := message_problem(other, depth + 1)) is not None:
                    return f"has another version whose message {problem}"
    return None


def _short(exc: Exception) -> str:
    return str(exc).split("\n")[0][:120] or type(exc).__name__
