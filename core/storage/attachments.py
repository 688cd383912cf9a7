"""Text files given to the model inside a message.

A file goes into the message itself, as the model reads it: a line naming it
(with its size in the model's tokens), then its text fenced in Markdown with the
language its extension names. The message text is the only record, so an edit,
an export (JSON or Markdown) and an import keep the files as they are, and the
chat view finds them again with `split_attachments` to show each as a chip.

    File `reverse.py` (42 tokens):

    ```python
    def reverse(s): ...
    ```

Reading refuses what is not a text file with a sentence saying why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MAX_FILE_BYTES = 512 * 1024  # beyond any context the bundled models read; refused before it is read
_SNIFF_BYTES = 8192
_HEADER = re.compile(r"^File `([^`\n]+)`(?: \((\d[\d,]*) tokens?\))?:\n\n(`{3,})([\w+#.-]*)\n", re.MULTILINE)


class AttachmentError(ValueError):
    """A file that cannot be attached; the message is written for the user."""


@dataclass
class Attachment:
    name: str
    text: str
    tokens: int | None = None  # in the model's tokens, once counted

    @property
    def lang(self) -> str:
        return language_for(self.name)


def language_for(name: str) -> str:
    """The fence's language for a file name ("" when Pygments knows no lexer for it)."""
    from pygments.lexers import get_lexer_for_filename
    from pygments.util import ClassNotFound

    try:
        aliases = get_lexer_for_filename(name).aliases
    except ClassNotFound:
        return ""
    return aliases[0] if aliases and aliases[0] != "text" else ""


def read_attachment(path: Path) -> Attachment:
    """A text file's content, or AttachmentError saying why it is not one."""
    path = Path(path)
    name = path.name.replace("`", "'")
    try:
        if not path.is_file():
            raise AttachmentError(f"{name} is not a file.")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise AttachmentError(f"{name} is {size / 1024:,.0f} KB; a file in a message is at most "
                                  f"{MAX_FILE_BYTES // 1024:,} KB.")
        data = path.read_bytes()[: MAX_FILE_BYTES + 1]
    except OSError as exc:
        raise AttachmentError(f"{name} could not be read: {exc.strerror or exc}.") from exc
    if b"\0" in data[:_SNIFF_BYTES]:
        raise AttachmentError(f"{name} is a binary file, not text; only text and source files can be attached.")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise AttachmentError(f"{name} is not UTF-8 text (byte {exc.start:,} cannot be read as a character); "
                              "only text and source files can be attached.") from exc
    if not text.strip():
        raise AttachmentError(f"{name} is empty.")
    return Attachment(name, text.replace("\r\n", "\n"))


def fenced(attachment: Attachment) -> str:
    """The file as it goes into the message (the module's docstring shows it)."""
    longest = max((len(run) for run in re.findall(r"`+", attachment.text)), default=0)
    fence = "`" * max(3, longest + 1)  # longer than any run in the file, so the file cannot close it
    count = f" ({attachment.tokens:,} token{'s' if attachment.tokens != 1 else ''})" \
        if attachment.tokens is not None else ""
    return f"File `{attachment.name}`{count}:\n\n{fence}{attachment.lang}\n{attachment.text.rstrip(chr(10))}\n{fence}"


def compose(typed: str, attachments: list[Attachment]) -> str:
    """A message: what the user typed, then each file."""
    parts = [typed.strip()] if typed.strip() else []
    return "\n\n".join(parts + [fenced(a) for a in attachments])


def split_attachments(content: str) -> tuple[str, list[Attachment]]:
    """A message's own text and the files in it (as `compose` wrote them)."""
    files: list[Attachment] = []
    kept: list[str] = []
    pos = 0
    for header in _HEADER.finditer(content):
        if header.start() < pos:
            continue
        fence = header.group(3)
        closing = re.compile(rf"^{fence}[ \t]*$", re.MULTILINE).search(content, header.end())
        if closing is None:
            continue
        kept.append(content[pos:header.start()])
        text = content[header.end():closing.start()].removesuffix("\n")
        tokens = int(header.group(2).replace(",", "")) if header.group(2) else None
        files.append(Attachment(header.group(1), text, tokens))
        pos = closing.end()
    kept.append(content[pos:])
    return re.sub(r"\n{3,}", "\n\n", "".join(kept)).strip(), files
