"""Turning a conversation into target token ids.

The model's own chat template is used where it has one; the base Gemma file
has none, so it gets Gemma's turn format. Text the user typed is always
tokenized with special tokens split, so typing `<end_of_turn>` or `<|im_end|>`
yields ordinary text tokens, never a control token that could end the turn or
forge a system message.
"""

from __future__ import annotations

import re
import uuid
from functools import lru_cache

GEMMA_TURNS = (
    "{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
# Extra tokens that end a turn, beyond the tokenizer's eos.
TURN_END_STRINGS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|endoftext|>")


def _template(tokenizer, chat_format: str) -> str:
    if chat_format == "gemma-turns" or not getattr(tokenizer, "chat_template", None):
        return GEMMA_TURNS if chat_format == "gemma-turns" else _PLAIN
    return tokenizer.chat_template


# For a model with neither a template nor a known format: plain role-prefixed text.
_PLAIN = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def encode_text(tokenizer, text: str) -> list[int]:
    """User or document text: never produces special/control tokens."""
    if not text:
        return []
    markers = _template_markers(tokenizer)
    found = markers.search(text) if markers else None
    if found is None:
        return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    # A marker typed as text is split after its first character, so it cannot match.
    start = found.start()
    return (encode_text(tokenizer, text[:start]) + encode_text(tokenizer, text[start : start + 1])
            + encode_text(tokenizer, text[start + 1 :]))


def _template_markers(tokenizer) -> re.Pattern | None:
    """Added tokens not flagged special that the chat template uses as markup
    (Qwen's `<tool_call>`): split_special_tokens leaves them whole, so user text
    typed as `<tool_call>` would otherwise become the model's tool-call token."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return None
    added = tuple(t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values()
                  if not t.special)
    return _markers_in(template, added)


@lru_cache(maxsize=8)
def _markers_in(template: str, added: tuple[str, ...]) -> re.Pattern | None:
    used = sorted((a for a in added if len(a) > 1 and a.strip() and a in template), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, used))) if used else None


def encode_chat(tokenizer, messages: list[dict], chat_format: str = "template") -> list[int]:
    """Token ids for a conversation, ready for the assistant's reply.

    A conversation that ends with an assistant message (a reply cut short at the
    token limit) ends with that message left open, so the reply continues it.
    Each message's content is replaced by a unique placeholder, the template is
    rendered, and the pieces between placeholders (the template's own markup) are
    tokenized with special tokens parsed while the contents are not.
    """
    continuing = bool(messages) and messages[-1]["role"] == "assistant"
    marks = [f"\x00{uuid.uuid4().hex}\x00" for _ in messages]
    placeholders = [{"role": m["role"], "content": mark} for m, mark in zip(messages, marks)]
    rendered = tokenizer.apply_chat_template(
        placeholders,
        chat_template=_template(tokenizer, chat_format),
        tokenize=False,
        add_generation_prompt=not continuing,
    )
    ids: list[int] = []
    bos = getattr(tokenizer, "bos_token", None)
    if chat_format == "gemma-turns" and bos and not rendered.startswith(bos):
        ids.append(tokenizer.bos_token_id)
    rest = rendered
    for mark, message in zip(marks, messages):
        before, sep, rest = rest.partition(mark)
        if not sep:  # a template that drops a message (e.g. system prompt unsupported)
            rest = before
            continue
        ids += tokenizer(before, add_special_tokens=False)["input_ids"] if before else []
        ids += encode_text(tokenizer, message["content"])
    if rest and not continuing:  # continuing: not the markup that closes the last message
        ids += tokenizer(rest, add_special_tokens=False)["input_ids"]
    return ids


def stop_token_ids(tokenizer, model_config=None) -> set[int]:
    """Token ids that end the reply: eos plus the turn-end markers the vocabulary has."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model_config, "generation_config", None), "eos_token_id", None)
    cfg_eos = getattr(model_config, "eos_token_id", None)
    for extra in (gen_eos, cfg_eos):
        if isinstance(extra, int):
            ids.add(extra)
        elif extra:
            ids.update(int(x) for x in extra)
    # added_tokens_encoder is small; get_vocab() would build Gemma's 262k-entry dict.
    added = getattr(tokenizer, "added_tokens_encoder", {})
    for s in TURN_END_STRINGS:
        if s in added:
            ids.add(added[s])
    return ids
