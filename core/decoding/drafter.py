"""The drafter: one small model that drafts for any target.

It keeps its own context of the conversation in its own vocabulary. After each
verification the accepted text is re-tokenized with a short look-behind (the
last few drafter tokens may merge differently once more text follows) and the
drafter's KV cache is rolled back to the longest prefix that still agrees.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..models.lean_llama import LeanLlama
from ..stopping import ShouldStop, never
from .adaptive_drafting import calibrated
from .sampling import GenerationConfig, probabilities
from .vocab_bridge import token_bytes

if TYPE_CHECKING:
    from ..learning.acceptance_head import AcceptanceHead

LOOK_BEHIND = 3  # drafter tokens re-tokenized with each new piece of text
MAX_HELD = 64  # the most trailing whitespace token healing re-drafts
_WHITESPACE = b" \t\n\r\x0b\x0c"


@dataclass
class DraftSettings:
    k: int = 4  # drafter tokens per step
    num_layers: int | None = None  # None = all of the drafter's layers
    int8: bool = True  # int8 weights (row-scaled dynamic int8, as the target's)
    int4: bool = True  # ... its projections in 4 bits where the 4-bit kernel runs (core/kernels/)
    # Stop drafting early once the drafter's own top probability falls below this
    # (chosen by git show 524cea4:scripts/drafter_sweep.py, see git show 524cea4:docs/drafter.md).
    min_confidence: float = 0.5
    # Adaptive drafting (docs/method.md §3): stop once 1 - prod(P_i) > gamma. Without a
    # trained acceptance head, P_i is the drafter's own top probability. None = off.
    # With a trained head, its P_i replaces the top probability in both rules.
    gamma: float | None = None
    # Priced drafting (core/decoding/adaptive_drafting.py, DraftPrices): once this
    # machine's costs are measured, draft on while prod(P_i) * P_i covers them,
    # instead of the two rules above.
    priced: bool = True
    # The most of the prompt the drafter reads before its first draft: its first token
    # and the most recent (None: all of it). Its read of a ~160-token prompt is a
    # one-off cost a reply pays that plain decoding does not (~0.25 s on an AVX2 Zen 4).
    prompt_tokens: int | None = None
    # Attention over a long context: 0 reads every position; else the first 256 and
    # the 256-position parts that hold the last `window` (LeanLlama.window), so a
    # drafted token and the drafter's read of a new message cost the same however
    # long the conversation grows. Its context stays whole for everything else.
    window: int = 1024
    # Under sampling: propose the drafter's most likely tokens, point masses accepted
    # with the target's own p(t) as a lookup's are (and n-gram merges into several
    # target tokens allowed), rather than draw them from its distribution (accepted
    # with min(1, p/q'), Eq. 1). Lossless either way (a rejection draws from the rest
    # of p); undrawn, omnidraft ran 1.27x / 1.36x plain raw / chat at temperature 0.7
    # against 1.19x / 1.30x drawn (git show 524cea4:docs/speed.md, "Sampled replies").
    draw_drafts: bool = False
    # The LM head over the drafter's first N token ids only (None: all). BPE ids run
    # roughly by frequency, and after a target step the head's bytes come from memory
    # with the layers': over SmolLM2's first 32,768 of 49,152 ids a drafted token
    # reads a third less head, drafting 6-7% cheaper a step for a drafter's own
    # acceptance 0.008 lower raw (git show 524cea4:docs/drafter.md, "A shorter LM head").
    head_tokens: int | None = 32768


def first_and_recent(ids: list[int], count: int) -> list[int]:
    """At most count of ids: all of them, or the first (the attention sink every
    context starts with) and the count - 1 most recent."""
    if len(ids) <= count:
        return list(ids)
    return list(ids[:1]) + list(ids[len(ids) - (count - 1):])


def _leading_whitespace(text: bytes) -> bytes:
    return text[: len(text) - len(text.lstrip(_WHITESPACE))]


@dataclass
class Draft:
    ids: list[int]  # drafter token ids
    q: list[float]  # drafter probability of each chosen token (1.0 where undrawn under sampling)
    dists: list[torch.Tensor] | None  # full drafter distributions (drawn drafts only)
    held: bytes = b""  # accepted text the draft starts by re-drafting (token healing)
    # The chance of acceptance the stop rule used for each token: the acceptance
    # head's, or the drafter's top probability while it has none, calibrated
    # (adaptive_drafting.ChanceCalibration) ...
    p: list[float] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)  # ... and before calibration
    forwards: int = 0  # drafter forwards the draft ran (the first token's came with the sync)
    forward_seconds: float = 0.0


class Drafter:
    def __init__(self, loaded, settings: DraftSettings | None = None, max_len: int = 16384):
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.settings = settings or DraftSettings()
        self.special = set(self.tokenizer.all_special_ids)
        self.max_len = max_len
        self.net = LeanLlama(
            loaded.model, num_layers=self.settings.num_layers, max_len=max_len, int8=self.settings.int8,
            int4=self.settings.int4, window=self.settings.window, head_rows=self.settings.head_tokens,
        )
        self.context: list[int] = []  # prefix + reply tokens (the accepted text)
        self.prefix: list[int] = []
        self.reply_text = ""
        self.reply_ids: list[int] = []
        self._logits: torch.Tensor | None = None  # next-token logits after self.context
        self._hidden: torch.Tensor | None = None  # ... and the final hidden state they came from
        # The current target's acceptance head (engine-set; None or untrained: the
        # drafter's own confidence decides when to stop).
        self.head: AcceptanceHead | None = None
        self.adapter_rank: int | None = None  # the rank of the adapter it drafts with
        self.held = b""  # trailing accepted whitespace left out of the context (token healing)
        self._heal_masks: dict[bytes, torch.Tensor] = {}
        # Built here (the byte table takes ~0.25 s for SmolLM2 the first time), not
        # in the middle of a reply.
        self._ws_tokens = {i: b for i, b in enumerate(token_bytes(self.tokenizer)) if b and b[0] in _WHITESPACE}
        # ... grouped by their leading whitespace, for _heal_mask: checked token by token,
        # a new held text cost a pass over half of SmolLM2's vocabulary (its words that
        # start with a space).
        self._ws_leads: dict[bytes, list[int]] = {}
        for i, b in self._ws_tokens.items():
            self._ws_leads.setdefault(_leading_whitespace(b), []).append(i)
        self._ws_only = {b: [i for i in group if self._ws_tokens[i] == b] for b, group in self._ws_leads.items()}

    def load_adapter(self, adapter: dict | None, should_stop: ShouldStop = never) -> bool:
        """Draft with this target's adapter from now on (AdapterStore.low_rank_state;
        None = the drafter's own weights). The context is rebuilt on the next sync.
        Returns False, changing nothing, when should_stop() interrupted it."""
        if not self.net.set_adapter(adapter, should_stop):
            return False
        self.adapter_rank = next(iter(adapter.values()))[0].shape[0] if adapter else None
        self.forget_context()
        return True

    @property
    def description(self) -> str:
        n = self.settings.num_layers or self.loaded.model.config.num_hidden_layers
        quant = ("4-bit weights" if self.net.int4 else "int8 weights") if self.net.int8 else str(
            self.net.dtype).replace("torch.", "")
        return f"{self.loaded.entry.name}, {n} layers, {quant}, k={self.settings.k}"

    def score(self, ids: list[int]) -> torch.Tensor:
        """The drafter's next-token logits after ids, from an empty context (what
        its current weights predict; the next sync rebuilds the drafting context)."""
        self.forget_context()
        logits, _ = self.net.forward(ids, last=1)
        self.net.reset()
        return logits[-1].clone()

    def forget_context(self) -> None:
        """An empty context: nothing cached, nothing to draft from until the next sync."""
        self.net.reset()
        self.context, self._logits = [], None

    # --------------------------------------------------------------- context
    def fit_prefix(self, prefix_ids: list[int], reply_room: int) -> list[int]:
        """The part of a prefix the drafter reads: all of it when reply_room more
        tokens still fit after it, else its first token (the attention sink every
        context starts with) and the most recent tokens. At most half the context
        is set aside for the reply; a longer one drafts until the context is full
        and is verified without drafts from there (see _set_context)."""
        return first_and_recent(prefix_ids, self.max_len - min(reply_room, self.max_len // 2))

    def start(self, prefix_ids: list[int]) -> None:
        keep = self.settings.prompt_tokens
        self.prefix = first_and_recent(prefix_ids, keep) if keep else list(prefix_ids)
        self.reply_text, self.reply_ids, self.held = "", [], b""
        self._set_context(self.prefix)

    def sync_text(self, reply_text: str, heal: bool = False) -> None:
        """Bring the context up to the accepted reply text (cross-vocabulary).

        heal: leave trailing whitespace out of the context and let the next draft
        start by re-drafting it (token healing). The target often ends its tokens
        where the drafter never would: Gemma accepts '\\n' then '▁▁▁▁▁▁▁▁', while
        SmolLM2 always glues an indent's last space to the next word
        ('ĊĠĠĠĠĠĠĠ','Ġreturn'); a context ending in such a split is text the
        drafter never saw, and it drafts badly from it."""
        held = ""
        if heal:
            held = reply_text[len(reply_text.rstrip()):][-MAX_HELD:]
            reply_text = reply_text[: len(reply_text) - len(held)]
        self.held = held.encode("utf-8")
        if reply_text.startswith(self.reply_text):
            keep = max(0, len(self.reply_ids) - LOOK_BEHIND)
            kept_text = self.tokenizer.decode(self.reply_ids[:keep])
            if not reply_text.startswith(kept_text):
                keep, kept_text = 0, ""
        else:
            keep, kept_text = 0, ""
        tail = reply_text[len(kept_text):]
        new_ids = self.tokenizer(tail, add_special_tokens=False)["input_ids"] if tail else []
        self.reply_ids = self.reply_ids[:keep] + new_ids
        self.reply_text = reply_text
        self._set_context(self.prefix + self.reply_ids)

    def sync_ids(self, reply_ids: list[int]) -> None:
        """Same vocabulary: the target's tokens are the drafter's."""
        self.reply_ids = list(reply_ids)
        self._set_context(self.prefix + self.reply_ids)

    def _set_context(self, ids: list[int]) -> None:
        if not ids or len(ids) > self.max_len:
            # Past max_len the reply outgrew the drafter's context: no drafts from here
            # on, each step verifies only the target's own token (a slower reply, not
            # an error).
            self.forget_context()
            return
        # Keep what the net already holds of ids (the last position is rerun for its
        # logits when nothing else is new); only the last row needs the LM head.
        common = self.net.reuse(ids)
        logits, hidden = self.net.forward(ids[common:], last=1)
        self._logits, self._hidden = logits[-1], hidden[-1]
        self.context = list(ids)

    # --------------------------------------------------------------- drafting
    def draft(self, cfg: GenerationConfig, gen: torch.Generator | None, k: int | None = None,
              price: float | None = None, bias: float = 0.0) -> Draft:
        """Up to k drafter tokens continuing the context (sampled like the target).
        price: DraftPrices.threshold() (None: not measured, or priced drafting off):
        draft on while prod(P_i) * P_i is at least it. bias: ChanceCalibration's,
        added to each P_i's logit."""
        k = k or self.settings.k
        point = self.proposes_points(cfg)
        out = Draft([], [], None if point else [], held=self.held)
        logits, hidden = self._logits, self._hidden
        if logits is None:
            return out
        all_accepted = 1.0  # running product of P_i for the adaptive rule
        held = self.held  # still to re-draft (undrawn drafts only: sync_text heals only then)
        for i in range(k):
            if held:  # only tokens that spell the held text, or start with it
                logits = logits.float().masked_fill(~self._heal_mask(held, logits.shape[-1]), float("-inf"))
            probs = torch.softmax(logits.float(), -1) if cfg.greedy else probabilities(logits, cfg)
            tok = int(probs.argmax()) if point else int(torch.multinomial(probs, 1, generator=gen))
            if tok in self.special:
                break
            out.ids.append(tok)
            out.q.append(1.0 if point and not cfg.greedy else float(probs[tok]))
            if held:
                spelled = self._spelling(tok)
                held = b"" if spelled.startswith(held) else held[len(spelled):]
            if out.dists is not None:
                out.dists.append(probs)
            confidence = float(probs.max())
            chance = self.head.chance(hidden, confidence) if self.head is not None else None
            raw = confidence if chance is None else chance
            p = calibrated(raw, bias)
            out.raw.append(raw)
            out.p.append(p)
            all_accepted *= p
            # The last drafted token needs no forward: nothing is drafted after it.
            if i == k - 1 or self._stop(p, all_accepted, price):
                break
            if self.net.length >= self.max_len:  # the context is full: the draft ends here
                break
            start = time.perf_counter()
            logits, hidden = (x[-1] for x in self.net.forward([tok]))
            out.forwards += 1
            out.forward_seconds += time.perf_counter() - start
        return out

    def proposes_points(self, cfg: GenerationConfig) -> bool:
        """Whether drafts are the drafter's most likely tokens (point masses: greedy,
        or undrawn under sampling) rather than draws from its distribution."""
        return cfg.greedy or not self.settings.draw_drafts

    def _stop(self, p: float, all_accepted: float, price: float | None) -> bool:
        """Whether to stop after a token whose chance is p (all_accepted: the product
        of the chances so far, p's included)."""
        if price is not None and self.settings.priced:
            return all_accepted * p < price
        gamma = self.settings.gamma
        return p < self.settings.min_confidence or (gamma is not None and 1.0 - all_accepted > gamma)

    # --------------------------------------------------------------- healing
    def _spelling(self, tok: int) -> bytes:
        return self._ws_tokens.get(tok, b"")

    def _heal_mask(self, held: bytes, width: int) -> torch.Tensor:
        """Tokens that continue the held text: they spell all of it and maybe more,
        or a leading part of it. Cached per held text (indents repeat)."""
        mask = self._heal_masks.get(held)
        if mask is None or mask.numel() != width:
            if _leading_whitespace(held) == held:
                # A token spells all of a whitespace text iff its leading whitespace does,
                # and only whitespace can be a leading part of one.
                ids = [i for lead, group in self._ws_leads.items() if lead.startswith(held) for i in group]
                ids += [i for b, group in self._ws_only.items() if held.startswith(b) for i in group]
                ids = [i for i in ids if i < width]
            else:  # other whitespace (unicode's): token by token
                ids = [i for i, b in self._ws_tokens.items() if i < width and (b.startswith(held) or held.startswith(b))]
            mask = torch.zeros(width, dtype=torch.bool)
            mask[ids] = True
            if len(self._heal_masks) > 256:
                self._heal_masks.clear()
            self._heal_masks[held] = mask
        return mask
