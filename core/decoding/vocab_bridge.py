"""The vocabulary bridge between a drafter and a target with different tokenizers.

docs/method.md section 1. Two parts:

* DirectMap: a drafter token maps to the target token with the same bytes
  (space markers normalised: 'Ġ' in byte-level BPE and '▁' in SentencePiece both
  mean a space; SentencePiece byte-fallback tokens '<0xNN>' are single bytes).
  Special tokens never map, so they are never proposed.
* NgramCache: learned online from accepted text. The accepted target tokens and
  the drafter's tokenization of the same text are aligned at the byte offsets
  they share; every aligned segment that direct mapping cannot express (the
  paper's case: one target token spelled by >=2 drafter tokens, e.g. target
  'flake' = drafter 'f','la','ke'; and also runs whose boundaries differ, e.g.
  target '▁▁','return' = drafter 'Ġ','Ġreturn') becomes an entry
  drafter run -> target run. Proposals merge drafted runs by longest match.
  Bounded, LRU eviction, saved per (drafter, target) pair, encrypted: its
  entries are pieces of the user's prompts and replies.

Sampling needs the draft probabilities in the target's vocabulary too: q' of a
proposed token (Eq. 1, q_prime) and q' over the whole vocabulary for the
residual on a rejection (Eq. 2, VocabBridge.q_prime_dist).
"""

from __future__ import annotations

import json
import math
import re
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from pathlib import Path

import torch

from ..storage.persistence import CorruptStateError
from ..storage.secure_store import KeyStore, load_or_migrate, save_encrypted

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable-character alphabet for bytes, inverted (char -> byte)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _is_byte_level(tokenizer) -> bool:
    try:
        decoder = json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder") or {}
    except AttributeError:
        return False
    parts = decoder.get("decoders", [decoder])
    return any(p.get("type") == "ByteLevel" for p in parts)


# Per tokenizer object: its byte table (~0.25 s for SmolLM2's 49k tokens; Gemma
# has 262k), shared by the drafter and every bridge built on it.
_TOKEN_BYTES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def token_bytes(tokenizer) -> list[bytes | None]:
    """Each token id's raw bytes as it appears in text; None for special tokens.
    Computed once per tokenizer (again if its vocabulary grew); treat as read-only."""
    table = _TOKEN_BYTES.get(tokenizer)
    if table is None or len(table) != len(tokenizer):
        table = _TOKEN_BYTES[tokenizer] = _token_bytes(tokenizer)
    return table


def _token_bytes(tokenizer) -> list[bytes | None]:
    special = set(tokenizer.all_special_ids)
    special |= {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    out: list[bytes | None] = []
    if _is_byte_level(tokenizer):
        table = _byte_decoder()
        for i, piece in enumerate(pieces):
            if i in special or piece is None:
                out.append(None)
                continue
            try:
                out.append(bytes(table[c] for c in piece))
            except KeyError:  # an added token stored as plain text
                out.append(piece.encode("utf-8"))
        return out
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            out.append(None)
            continue
        m = _BYTE_FALLBACK.match(piece)
        out.append(bytes([int(m.group(1), 16)]) if m else piece.replace("▁", " ").encode("utf-8"))
    return out


class DirectMap:
    """drafter id -> target id for tokens spelled by the same bytes."""

    def __init__(self, drafter_tokenizer, target_tokenizer, same_vocab: bool = False):
        self.drafter_bytes = token_bytes(drafter_tokenizer)
        self.target_bytes = self.drafter_bytes if same_vocab else token_bytes(target_tokenizer)
        # A byte-fallback token ('<0x28>') duplicates the real token for the same
        # byte ('('); the model emits the real one, so it wins.
        pieces = target_tokenizer.convert_ids_to_tokens(list(range(len(self.target_bytes))))
        fallback = [bool(p and _BYTE_FALLBACK.match(p)) for p in pieces]
        by_bytes: dict[bytes, int] = {}
        for prefer_fallback in (False, True):
            for tid, b in enumerate(self.target_bytes):
                if b and fallback[tid] == prefer_fallback:
                    by_bytes.setdefault(b, tid)
        self.target_by_bytes = by_bytes
        mapping = torch.full((len(self.drafter_bytes),), -1, dtype=torch.long)
        for did, b in enumerate(self.drafter_bytes):
            if b and b in by_bytes:
                mapping[did] = by_bytes[b]
        self.to_target = mapping  # -1: no partner
        self.coverage = float((mapping >= 0).float().mean())

    def __call__(self, drafter_id: int) -> int:
        return int(self.to_target[drafter_id])


@dataclass
class Merge:
    """Target-space tokens merged from one drafted run."""

    target_ids: list[int]
    # For each target id, the drafter positions (indices into the drafted run) it
    # came from; a 1-element span is a direct mapping, longer is an n-gram merge.
    spans: list[tuple[int, ...]]
    # Leading target ids of a run that belong to one cache entry; only the first
    # target id of a many-target entry carries the drafter probability.
    ngram_hits: int = 0


def q_prime(q: list[float], spans: list[tuple[int, ...]]) -> list[float]:
    """Eq. 1: each target token's draft probability, q'(t) = q(d) for a direct
    mapping and the product of its pieces' q(d_j) for an n-gram."""
    return [math.prod(q[j] for j in span) for span in spans]


def merged_spans(spans: list[tuple[int, ...]]) -> list[bool]:
    """Which proposals are n-gram merges: spelled by several drafter tokens, or
    by a drafter token that spells another proposal too."""
    return [len(s) > 1 or (n > 0 and s == spans[n - 1]) or (n + 1 < len(spans) and s == spans[n + 1])
            for n, s in enumerate(spans)]


class NgramCache:
    """Learned drafter-run -> target-run entries, longest match first, LRU-bounded."""

    MAX_DRAFT_RUN = 6
    MAX_TARGET_RUN = 4

    def __init__(self, max_entries: int = 20000):
        self.max_entries = max_entries
        self.entries: OrderedDict[tuple[int, ...], tuple[int, ...]] = OrderedDict()
        self.longest = 1

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, drafter_run: tuple[int, ...], target_run: tuple[int, ...]) -> None:
        if not drafter_run or not target_run:
            return
        if len(drafter_run) > self.MAX_DRAFT_RUN or len(target_run) > self.MAX_TARGET_RUN:
            return
        self.entries[drafter_run] = target_run
        self.entries.move_to_end(drafter_run)
        self.longest = max(self.longest, len(drafter_run))
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)

    def match(self, drafted: list[int], start: int) -> tuple[int, tuple[int, ...]] | None:
        """Longest entry starting at drafted[start]: (run length, target run)."""
        for n in range(min(self.longest, len(drafted) - start), 0, -1):
            key = tuple(drafted[start : start + n])
            hit = self.entries.get(key)
            if hit is not None:
                self.entries.move_to_end(key)
                return n, hit
        return None

    def save(self, path: Path, keys: KeyStore | None = None) -> None:
        save_encrypted(
            path,
            {"max_entries": self.max_entries,
             "entries": [[list(k), list(v)] for k, v in self.entries.items()]},
            keys,
        )

    @classmethod
    def load(
        cls, path: Path, max_entries: int = 20000, keys: KeyStore | None = None,
        legacy: Path | None = None,
    ) -> NgramCache:
        """The saved cache (empty when none). `legacy`: where an older version kept it
        as plaintext JSON (migrated once). CorruptStateError when it is damaged or
        not a cache (valid JSON of the wrong shape included)."""
        return load_or_migrate(
            path, legacy or path, lambda raw, src: cls._from_raw(raw, src, max_entries), keys
        )

    @classmethod
    def _from_raw(cls, raw: object, path: Path, max_entries: int) -> NgramCache:
        cache = cls(max_entries)
        if raw is None:
            return cache
        entries = raw.get("entries") if isinstance(raw, dict) else None
        if not isinstance(entries, list):
            raise CorruptStateError(path, "it does not hold n-gram entries")
        for entry in entries:
            if not (isinstance(entry, list) and len(entry) == 2 and all(_token_run(r) for r in entry)):
                raise CorruptStateError(path, "an n-gram entry is not two runs of token ids")
            cache.add(tuple(entry[0]), tuple(entry[1]))
        return cache


def _token_run(run: object) -> bool:
    return isinstance(run, list) and all(type(t) is int and t >= 0 for t in run)


class VocabBridge:
    """Direct map + n-gram cache for one (drafter, target) pair."""

    def __init__(self, drafter_tokenizer, target_tokenizer, max_entries: int = 20000):
        self.drafter_tokenizer = drafter_tokenizer
        self.target_tokenizer = target_tokenizer
        self.same_vocab = drafter_tokenizer.get_vocab() == target_tokenizer.get_vocab()
        self.direct = DirectMap(drafter_tokenizer, target_tokenizer, self.same_vocab)
        self.cache = NgramCache(max_entries)

    def target_text(self, target_ids: list[int]) -> str:
        """Target tokens as text, exactly as the target spelled them (an incomplete
        UTF-8 character at the end is left out: it waits for the next tokens)."""
        raw = b"".join(self.direct.target_bytes[i] or b"" for i in target_ids)
        return raw.decode("utf-8", errors="ignore") if raw else ""

    def q_prime_dist(self, draft, span: tuple[int, ...], token: int, q_token: float, vocab: int) -> torch.Tensor:
        """q' over the target vocabulary at one position (Eq. 2): the drafter's
        distribution carried over by direct mapping; for an n-gram, the merged token
        gets the product of its pieces and its first piece's token only the remainder.
        A lookup proposal (empty span) or an undrawn draft (no dists: the drafter's
        most likely tokens) is a point mass on its token. draft: the drafted run
        (ids, dists) the span indexes."""
        out = torch.zeros(vocab)
        if not span or draft.dists is None:
            out[token] = 1.0
            return out
        first_id = draft.ids[span[0]]
        q = draft.dists[span[0]].float()
        mapped = self.direct.to_target[: q.numel()]
        ok = mapped >= 0
        out.index_add_(0, mapped[ok], q[ok])
        if len(span) > 1:
            first = int(mapped[first_id])
            if first >= 0:
                out[first] = max(0.0, float(q[first_id]) - q_token)
            out[token] = q_token
        return out

    # ------------------------------------------------------------ proposals
    def propose(self, drafted: list[int], use_cache: bool = True, single_target: bool = False) -> Merge:
        """Merge a drafted run into target proposals; stops at the first drafter
        token that neither the cache nor the direct map can express.

        single_target: only entries whose target run is one token (sampling needs
        a probability per proposed token, Eq. 1).
        """
        out = Merge([], [])
        i = 0
        while i < len(drafted):
            hit = self.cache.match(drafted, i) if use_cache and not self.same_vocab else None
            if hit and (len(hit[1]) == 1 or not single_target):
                n, target_run = hit
                span = tuple(range(i, i + n))
                for tid in target_run:
                    out.target_ids.append(tid)
                    out.spans.append(span)
                out.ngram_hits += 1
                i += n
                continue
            tid = drafted[i] if self.same_vocab else self.direct(drafted[i])
            if tid < 0 or self.direct.drafter_bytes[drafted[i]] is None:
                break
            out.target_ids.append(tid)
            out.spans.append((i,))
            i += 1
        return out

    def propose_text(self, drafted: list[int], held: bytes = b"") -> Merge:
        """Greedy decoding's proposals: the drafted TEXT as the target tokenizes it.

        Token-by-token mapping fails at every boundary the two tokenizers draw
        differently, and code is full of them: SmolLM2 spells an indented line
        'ĊĠĠĠĠĠĠĠ','Ġreturn', Gemma '\\n','▁▁▁▁▁▁▁▁','return'. Greedy verification needs no draft probabilities,
        so the text can simply be re-tokenized (~30 µs). `held` is the accepted
        text the drafter re-drafted (Drafter token healing); it is not proposed
        again. A trailing whitespace token is dropped: more whitespace may
        follow and merge with it. Spans give each target token the drafted
        positions its bytes overlap. Falls back to token mapping of what follows
        `held` when the target tokenizer does not spell the text back byte for byte.
        """
        d_bytes, t_bytes = self.direct.drafter_bytes, self.direct.target_bytes
        pieces = []
        for d in drafted:
            b = d_bytes[d] if d < len(d_bytes) else None
            if b is None:  # a special token ends the text
                break
            pieces.append(b)
        raw = b"".join(pieces)
        if not raw.startswith(held):
            return Merge([], [])
        body = raw[len(held):]
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:  # an unfinished character at the end
            body = body[: exc.start]
            text = body.decode("utf-8", errors="ignore")
        if not text:
            return Merge([], [])
        # Drafted text that reads like a control token ('<end_of_turn>') is text:
        # the target tokenizes it as text, as it does the user's typing.
        ids = self.target_tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        spelled = [t_bytes[t] if t < len(t_bytes) else None for t in ids]
        ends = list(accumulate(len(b) for b in pieces))  # drafted token i covers [ends[i-1], ends[i])
        if any(b is None for b in spelled) or b"".join(spelled) != body:
            return self._propose_after(drafted[: len(pieces)], ends, len(held))
        if ids and not spelled[-1].strip():
            ids, spelled = ids[:-1], spelled[:-1]
        out = Merge([], [])
        start = len(held)
        for tid, b in zip(ids, spelled):
            stop = start + len(b)
            first = next(i for i, e in enumerate(ends) if e > start)
            last = next(i for i, e in enumerate(ends) if e >= stop)
            out.target_ids.append(tid)
            out.spans.append(tuple(range(first, last + 1)))
            start = stop
        return out

    def _propose_after(self, drafted: list[int], ends: list[int], held: int) -> Merge:
        """Token mapping of the drafted tokens after the first `held` bytes (what
        token healing re-drafted was accepted already); nothing when a drafted
        token straddles that boundary. ends: each drafted token's end offset."""
        if held and held not in ends:
            return Merge([], [])
        skip = ends.index(held) + 1 if held else 0
        out = self.propose(drafted[skip:], use_cache=True)
        out.spans = [tuple(i + skip for i in span) for span in out.spans]
        return out

    # ------------------------------------------------------------ learning
    def learn(self, target_ids: list[int], drafter_ids: list[int]) -> int:
        """Add entries from two tokenizations of the same text; returns how many."""
        if self.same_vocab:
            return 0
        added = 0
        for d_run, t_run in align(
            [self.direct.drafter_bytes[d] for d in drafter_ids], drafter_ids,
            [self.direct.target_bytes[t] for t in target_ids], target_ids,
        ):
            if len(d_run) == 1 and len(t_run) == 1 and self.direct(d_run[0]) == t_run[0]:
                continue  # direct mapping already says this
            if self.cache.entries.get(d_run) != t_run:
                self.cache.add(d_run, t_run)
                added += 1
        return added

    def learn_text(self, target_ids: list[int]) -> int:
        """Learn from accepted target tokens: re-tokenize their text with the drafter."""
        pieces = [self.direct.target_bytes[t] for t in target_ids]
        if not target_ids or any(p is None for p in pieces):
            return 0
        try:
            text = b"".join(pieces).decode("utf-8")
        except UnicodeDecodeError:
            return 0
        drafter_ids = self.drafter_tokenizer(text, add_special_tokens=False)["input_ids"]
        return self.learn(target_ids, drafter_ids)


def align(a_bytes, a_ids, b_bytes, b_ids):
    """Yield (a run, b run) pairs spanning the same bytes, split at every byte
    offset where both tokenizations have a token boundary."""
    if None in a_bytes or None in b_bytes:
        return  # special tokens break the text correspondence
    ends_a = {end: n + 1 for n, end in enumerate(accumulate(len(x) for x in a_bytes))}
    ends_b = {end: n + 1 for n, end in enumerate(accumulate(len(x) for x in b_bytes))}
    prev_a = prev_b = 0
    for end in sorted(ends_a.keys() & ends_b.keys()):
        yield tuple(a_ids[prev_a : ends_a[end]]), tuple(b_ids[prev_b : ends_b[end]])
        prev_a, prev_b = ends_a[end], ends_b[end]
