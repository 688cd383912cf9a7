"""Prompt-lookup drafting: a free extra draft source.

If the last few target tokens appeared earlier in the context, propose what
followed them then. Code and quoted text repeat themselves often, and this
costs no model forward at all.
"""

from __future__ import annotations


def lookup(context: list[int], k: int, max_ngram: int = 4, min_ngram: int = 2) -> tuple[list[int], int]:
    """Up to k tokens that followed the latest earlier occurrence of the context's
    tail, and the length of the tail that matched (longest first; 0: none)."""
    for n in range(max_ngram, min_ngram - 1, -1):
        if len(context) <= n:
            continue
        tail = context[-n:]
        # Search backwards: the most recent occurrence is the likeliest to repeat.
        for start in range(len(context) - n - 1, -1, -1):
            if context[start : start + n] == tail:
                follow = context[start + n : start + n + k]
                if follow:
                    return follow, n
    return [], 0
