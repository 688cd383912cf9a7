"""What of a conversation the target reads: its window here, and a conversation
encoded to fit it, the oldest turns left out when it outgrows the window.

Imported by the worker when it catches InputError; nothing here needs torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from .chat_format import encode_chat
from .gguf_header import KVShape

MAX_MESSAGE_CHARS = 200_000
# At most this share of the memory free when a target loads goes to its KV cache
# (the weights, the drafter and the app need the rest).
KV_MEMORY_SHARE = 0.25
# Bytes per cached value: the lean runtime keeps an int8 target's cache in float32.
KV_VALUE_BYTES = 4
WINDOW_STEP = 1024  # a window memory bounds is a whole number of these


class InputError(Exception):
    """A request the engine refuses; str(error) is shown to the user."""


@dataclass
class EncodedChat:
    """A conversation as the target reads it."""

    ids: list[int]  # the target's token ids of `messages`
    messages: list[dict]  # the messages kept: the system message, then the latest turns
    omitted: int = 0  # the oldest messages left out to fit the context window


def own_window(config) -> int:
    """The most tokens a model reads by its own design (max_position_embeddings)."""
    return int(getattr(config, "max_position_embeddings", 2048) or 2048)


def config_kv_shape(config) -> KVShape:
    """A transformers config's KV cache shape (per token: a key and a value per
    layer and key/value head); window: its max_position_embeddings, 0 if unset."""
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or int(getattr(config, "hidden_size", 0) or 0) // max(1, heads))
    return KVShape(layers, kv_heads, head_dim, int(getattr(config, "max_position_embeddings", 0) or 0))


def kv_bytes_per_token(config) -> int:
    """What one token of context takes in the target's KV cache."""
    return config_kv_shape(config).bytes_per_token(KV_VALUE_BYTES)


def memory_window(config, available: int) -> int:
    """The most tokens whose KV cache fits KV_MEMORY_SHARE of `available` bytes."""
    per_token = kv_bytes_per_token(config)
    if per_token <= 0:
        return own_window(config)
    return max(WINDOW_STEP, int(available * KV_MEMORY_SHARE) // per_token // WINDOW_STEP * WINDOW_STEP)


def model_window(config, available: int | None = None) -> int:
    """The most tokens (conversation and reply) a target reads here: its own
    window, or less where the memory `available` (bytes; None: not bounded) could
    not hold that much KV cache. The drafter's preallocated context (Drafter
    max_len) should hold the same text and its reply; where it cannot, the drafter
    reads the latest part."""
    window = own_window(config)
    return window if available is None else min(window, memory_window(config, available))


def conversation_limit(window: int, context_tokens: int = 0, reserve: int = 512) -> int:
    """The most tokens of a conversation the target reads: its `window`, or the
    user's context length (`context_tokens`, 0 for the model's own) where smaller,
    less `reserve` kept for the reply."""
    if context_tokens:
        window = min(window, context_tokens)
    return max(64, window - reserve)


def _turn_starts(turns: list[dict]) -> list[int]:
    """Where the kept part of a conversation (without its system message) may
    begin, earliest first: at a user message, so no reply is kept without what it
    answers; after any message over MAX_MESSAGE_CHARS (one refused before, never
    read whole again); at the last message at the latest."""
    last = len(turns) - 1
    floor = max((i + 1 for i in range(last) if len(turns[i].get("content", "")) > MAX_MESSAGE_CHARS), default=0)
    return [i for i in range(floor, last) if turns[i].get("role") == "user"] + [last]


def fit_conversation(
    messages: list[dict], tokenizer, chat_format: str, limit: int, model_name: str
) -> EncodedChat:
    """The conversation as a target (`model_name`, which reads at most `limit`
    tokens of it) reads it. When it outgrows the limit the oldest whole turns are
    left out (the system message stays), and everything up to a message too long
    to ever be read again: a refused over-long message stays in the history the
    GUI sends, and must not make every later turn fail. Only the last message
    being too long is an error (InputError)."""
    # A conversation ending with a reply asks to continue it (encode_chat); only a
    # new message must say something.
    if not messages or (messages[-1].get("role") != "assistant" and not messages[-1].get("content", "").strip()):
        raise InputError("The message is empty; type something first.")
    if len(messages[-1]["content"]) > MAX_MESSAGE_CHARS:
        raise InputError(
            f"The message is too long ({len(messages[-1]['content']):,} characters; "
            f"at most {MAX_MESSAGE_CHARS:,})."
        )
    system = messages[:1] if len(messages) > 1 and messages[0].get("role") == "system" else []
    turns = messages[len(system):]
    starts = _turn_starts(turns)
    encoded: dict[int, list[int]] = {}  # ids of the conversation from starts[i]

    def fits(i: int) -> bool:
        encoded[i] = encode_chat(tokenizer, system + turns[starts[i]:], chat_format)
        return len(encoded[i]) <= limit

    # Usually everything fits (one encoding); otherwise the earliest start that
    # fits, by bisection: leaving out more messages never makes the text longer.
    if fits(0):
        first = 0
    else:
        lo, hi = 1, len(starts)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
        first = lo
    if first == len(starts):  # not even the last message alone fits (the search tried it)
        n = len(encoded[len(starts) - 1])
        what = "The system prompt and the message are" if system else "The message is"
        raise InputError(f"{what} too long for {model_name}: {n:,} tokens, and it reads at most {limit:,}.")
    start = starts[first]
    return EncodedChat(encoded[first], system + turns[start:], omitted=start)
