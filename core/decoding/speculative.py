"""Cross-vocabulary speculative decoding (OMNIDRAFT.md §1), as a generator of
the same events plain decoding yields.

One step: the drafter drafts k tokens in its own vocabulary; the vocabulary
bridge merges them into m target-space proposals (n-gram cache by longest
match, else direct mapping); ONE target forward over [pending token] +
proposals scores them all; verification accepts a prefix and adds the target's
own next token; both KV caches roll back to the accepted prefix; the bridge
learns n-grams from the accepted text; the drafter re-syncs on that text.

The prompt's own forward picks the first reply token, as plain decoding does.
From then on the target's cache lags one token behind the accepted ids: the
newest token ("pending") is fed at the start of the next verification, whose
first logits row is then the distribution for the first proposal.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ..events import TokenChunk, TurnFinished, TurnStats
from ..learning.acceptance_head import proposal_chances
from .adaptive_drafting import DRAFTER, DraftPolicy, lookup_source
from .drafter import Drafter
from .plain import Cancel, ReplyStream, _never, forward
from .prompt_lookup import lookup
from .sampling import GenerationConfig, pick
from .verification import verify_greedy, verify_sampling
from .vocab_bridge import VocabBridge, merged_spans

# How many target tokens before the new ones the bridge re-reads when learning,
# so n-grams that straddle a step boundary are still seen whole.
LEARN_LOOK_BEHIND = 4


@dataclass
class SpecOptions:
    k: int = 4
    prompt_lookup: bool = True  # use context n-gram lookup before asking the drafter
    lookup_min_tokens: int = 2  # a lookup continuation shorter than this is not used
    max_proposals: int = 8  # cap after merging (a many-target n-gram can add tokens)
    use_ngram_cache: bool = True
    text_proposals: bool = True  # greedy, cross-vocabulary: re-tokenize the drafted text


def generate_speculative(
    target,
    target_tokenizer,
    drafter: Drafter,
    bridge: VocabBridge,
    prompt_ids: list[int],
    drafter_prefix: list[int],
    cfg: GenerationConfig,
    stop_ids: set[int],
    options: SpecOptions | None = None,
    cancel: Cancel = _never,
    policy: DraftPolicy | None = None,
    learn_policy: bool = True,
) -> Iterator[TokenChunk | TurnFinished]:
    """policy chooses between a lookup and the drafter (None: lookup whenever one
    is found); learn_policy: record each step's outcome in it."""
    opts = options or SpecOptions()
    stats = TurnStats(method="omnidraft", prompt_tokens=len(prompt_ids))
    stream = ReplyStream(target_tokenizer, cfg, stop_ids)
    gen = cfg.generator()
    start = time.perf_counter()

    cache = DynamicCache()
    cache.activate_past_recording()  # lets sliding-window layers roll back too
    # The prompt's forward already decides the first reply token: it is streamed
    # before the drafter reads the prompt, so a reply starts after one prefill.
    first = pick(forward(target, prompt_ids, cache, last=1)[-1], cfg, gen)
    stats.steps += 1
    yield from stream.push([first])
    pending = first
    context = list(prompt_ids) + [first]  # target ids: prompt + accepted reply
    if opts.use_ngram_cache:
        bridge.learn_text(context)  # the prompt is accepted text too
    synced = None  # accepted target ids the drafter's context covers (None: not started)
    target_bytes = bridge.direct.target_bytes
    # Greedy verification needs no draft probabilities, so the drafted text can be
    # re-tokenized by the target and the drafter's context healed (see
    # VocabBridge.propose_text); sampling keeps the paper's token mapping (Eq. 1-2).
    text_proposals = cfg.greedy and opts.text_proposals and not bridge.same_vocab

    while not stream.reason and not cancel():
        # ---- draft
        t0 = time.perf_counter()
        room = cfg.max_new_tokens - len(stream.ids) - 1
        k = max(0, min(opts.k, room))
        proposals, spans, q_prime, draft, source = [], [], [], None, DRAFTER
        once = 0.0  # the drafter's one-time read of the prompt: not a cost of this step's source
        if k and opts.prompt_lookup:
            found, match = lookup(context, k)
            if len(found) >= opts.lookup_min_tokens and (policy is None or policy.use_lookup(match)):
                # A lookup is a point-mass draft: q' = 1 on the proposed token.
                proposals, source = found, lookup_source(match)
                spans, q_prime = [()] * len(proposals), [1.0] * len(proposals)
        if k and not proposals:
            if synced is None:  # the drafter reads the prompt only once it is needed
                drafter.start(drafter_prefix)
                synced = len(prompt_ids)
                once = time.perf_counter() - t0
            if synced < len(context):  # ... and catches up only when it is needed
                reply = context[len(prompt_ids):]
                if bridge.same_vocab:
                    drafter.sync_ids(reply)
                else:
                    drafter.sync_text(_text(target_bytes, reply), heal=text_proposals)
                synced = len(context)
            draft = drafter.draft(cfg, gen, k)
            if text_proposals:
                merged = bridge.propose_text(draft.ids, draft.held)
            else:
                merged = bridge.propose(draft.ids, opts.use_ngram_cache, single_target=not cfg.greedy)
            proposals = merged.target_ids[: opts.max_proposals]
            spans = merged.spans[: len(proposals)]
            stats.ngram_hits += merged.ngram_hits
            # Eq. 1: q'(t) = q(d) for a direct mapping, the product over an n-gram's pieces.
            q_prime = [float(torch.tensor([draft.q[j] for j in s]).prod()) for s in spans]
        t1 = time.perf_counter()

        # ---- verify: one target forward over the pending token and all proposals
        logits = forward(target, [pending] + proposals, cache)
        if cfg.greedy:
            n, nxt = verify_greedy(proposals, logits)
        else:
            n, nxt = verify_sampling(
                proposals, q_prime, logits, cfg, gen,
                lambda i: _q_prime_dist(bridge, draft, spans[i], proposals[i], q_prime[i], logits.shape[-1]),
            )
        cache.crop(-(len(proposals) - n))  # forget rejected proposals
        t2 = time.perf_counter()

        stats.steps += 1
        stats.proposed += len(proposals)
        stats.accepted += n
        stats.draft_seconds += t1 - t0
        stats.verify_seconds += t2 - t1
        if source != DRAFTER:
            stats.lookup_steps += 1
            stats.lookup_proposed += len(proposals)
            stats.lookup_accepted += n
        if draft is not None:
            stats.add_drafted(proposal_chances(draft.p, spans), merged_spans(spans), n)
        if k and policy is not None and learn_policy:
            policy.record(source, n + 1, t2 - t0 - once)

        new = proposals[:n] + [nxt]
        yield from stream.push(new, drafted=n)
        context += new
        pending = nxt
        if stream.reason:
            break
        # ---- learn n-grams from the accepted text
        if opts.use_ngram_cache and not bridge.same_vocab:
            bridge.learn_text(context[-(len(new) + LEARN_LOOK_BEHIND):])

    stats.new_tokens = len(stream.ids)
    stats.seconds = time.perf_counter() - start
    yield TurnFinished(stream.text, stream.reason or "cancelled", stats, list(stream.ids))


def _text(target_bytes: list[bytes | None], ids: list[int]) -> str:
    """The accepted reply as text, exactly as the target spelled it (an incomplete
    UTF-8 character at the end waits for the next step)."""
    raw = b"".join(target_bytes[i] or b"" for i in ids)
    return raw.decode("utf-8", errors="ignore") if raw else ""


def _q_prime_dist(bridge: VocabBridge, draft, span: tuple[int, ...], token: int, q_token: float, vocab: int):
    """q' over the target vocabulary at one position (Eq. 2): the drafter's
    distribution carried over by direct mapping; for an n-gram, the merged token
    gets the product of its pieces and its first piece's token only the remainder.
    A lookup proposal (empty span) is a point mass on its token."""
    out = torch.zeros(vocab)
    if not span:
        out[token] = 1.0
        return out
    first_id = draft.ids[span[0]]
    q = draft.dists[span[0]].float()
    mapped = bridge.direct.to_target[: q.numel()]
    ok = mapped >= 0
    out.index_add_(0, mapped[ok], q[ok])
    if len(span) > 1:
        first = int(mapped[first_id])
        if first >= 0:
            out[first] = max(0.0, float(q[first_id]) - q_token)
        out[token] = q_token
    return out
