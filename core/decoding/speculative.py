"""Cross-vocabulary speculative decoding (docs/method.md §1), as a generator of
the same events plain decoding yields.

One step (generate_speculative's loop): propose() drafts k tokens in the
drafter's vocabulary and the vocabulary bridge merges them into m target-space
proposals t_1..t_m with their draft probabilities q'(t_i) (n-gram cache by
longest match, else direct mapping; or a prompt lookup instead of the drafter);
verify() runs ONE target forward over [pending token] + t_1..t_m, accepts a
prefix of n proposals and adds the target's own next token; the target's KV
cache rolls back to the accepted prefix; the bridge learns n-grams from the
accepted text; the drafter re-syncs on that text at the next propose().

The prompt's own forward picks the first reply token, as plain decoding does.
From then on the target's cache lags one token behind the accepted ids: the
newest token ("pending") is fed at the start of the next verification, whose
first logits row is then the distribution for the first proposal.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from ..events import TokenChunk, TurnFinished, TurnStats
from ..learning.acceptance_head import proposal_chances
from ..models.target_runtime import TargetRunner
from ..stopping import ShouldStop, never
from .adaptive_drafting import DRAFTER, DraftPolicy, lookup_source
from .drafter import Draft, Drafter
from .plain import Turn
from .prompt_lookup import lookup
from .sampling import GenerationConfig, penalize_rows, pick
from .verification import verify_greedy, verify_sampling
from .vocab_bridge import VocabBridge, merged_spans, q_prime

# How many target tokens before the new ones the bridge re-reads when learning,
# so n-grams that straddle a step boundary are still seen whole.
LEARN_LOOK_BEHIND = 4


@dataclass
class SpecOptions:
    # The draft length k is the drafter's setting (DraftSettings.k); lookups use it too.
    prompt_lookup: bool = True  # use context n-gram lookup before asking the drafter
    lookup_min_tokens: int = 2  # a lookup continuation shorter than this is not used
    max_proposals: int = 8  # cap after merging (a many-target n-gram can add tokens)
    use_ngram_cache: bool = True
    text_proposals: bool = True  # greedy, cross-vocabulary: re-tokenize the drafted text


@dataclass
class Proposals:
    """One step's draft in the target's vocabulary: what verify() consumes."""

    tokens: list[int]  # t_1..t_m, target token ids
    q_prime: list[float]  # q'(t_i) (Eq. 1); 1.0 for a lookup, a point-mass draft
    spans: list[tuple[int, ...]]  # the drafted positions each t_i came from; () for a lookup
    source: str  # DRAFTER or the lookup's source (adaptive drafting's choice)
    draft: Draft | None = None  # the drafter's run the spans index; None for a lookup
    ngram_hits: int = 0  # merges through the n-gram cache
    # Of the time proposing took, the drafter's one-time read of the prompt: not a
    # cost of this step's source.
    setup_seconds: float = 0.0


class SpeculativeDecoder:
    """One reply's speculative decoding state: the target's KV cache, the accepted
    context (prompt + reply, target ids), the pending token, and how much of that
    context the drafter has read."""

    def __init__(
        self,
        target: TargetRunner,
        drafter: Drafter,
        bridge: VocabBridge,
        prompt_ids: list[int],
        drafter_prefix: list[int],
        cfg: GenerationConfig,
        gen,
        options: SpecOptions,
        policy: DraftPolicy | None,
    ):
        self.drafter, self.bridge = drafter, bridge
        self.cfg, self.gen, self.options, self.policy = cfg, gen, options, policy
        self.prompt_len = len(prompt_ids)
        self.drafter_prefix = drafter_prefix
        self.context = list(prompt_ids)
        self.pending: int | None = None  # the newest accepted token, not yet in the target's cache
        self.synced: int | None = None  # context tokens the drafter has read (None: not started)
        self.session = target.session()  # the target's KV cache for this reply
        # Proposals that are point masses (greedy, or the drafter's argmaxes under
        # sampling) need no draft probabilities, so the drafted text can be re-tokenized
        # by the target and the drafter's context healed (see VocabBridge.propose_text);
        # drawn drafts keep the paper's token mapping (Eq. 1-2).
        self.text_proposals = drafter.proposes_points(cfg) and options.text_proposals and not bridge.same_vocab

    def prefill(self) -> int:
        """The prompt's forward; it picks the first reply token."""
        logits = self.session.forward(self.context, last=1)[-1]
        return pick(logits, self.cfg, self.gen, self.context)

    def propose(self, k: int) -> Proposals:
        """Up to k target tokens: a prompt lookup when one is found (and adaptive
        drafting takes it), else the drafter's k tokens merged by the bridge."""
        if k == 0:
            return Proposals([], [], [], DRAFTER)
        if self.options.prompt_lookup:
            found, match = lookup(self.context, k)
            if len(found) >= self.options.lookup_min_tokens and (
                self.policy is None or self.policy.use_lookup(match)
            ):
                return Proposals(found, [1.0] * len(found), [()] * len(found), lookup_source(match))
        return self._draft(k)

    def _draft(self, k: int) -> Proposals:
        start = time.perf_counter()
        setup = 0.0
        if self.synced is None:  # the drafter reads the prompt only once it is needed
            self.drafter.start(self.drafter_prefix)
            self.synced = self.prompt_len
            setup = time.perf_counter() - start
        if self.synced < len(self.context):  # ... and catches up only when it is needed
            reply = self.context[self.prompt_len :]
            if self.bridge.same_vocab:
                self.drafter.sync_ids(reply)
            else:
                self.drafter.sync_text(self.bridge.target_text(reply), heal=self.text_proposals)
            self.synced = len(self.context)
        price = self.policy.prices.threshold() if self.policy is not None else None
        bias = self.policy.calibration.bias if self.policy is not None else 0.0
        draft = self.drafter.draft(self.cfg, self.gen, k, price, bias)
        if self.policy is not None:
            self.policy.prices.record_draft(draft.forwards, draft.forward_seconds)
        if self.text_proposals:
            merged = self.bridge.propose_text(draft.ids, draft.held)
        else:
            merged = self.bridge.propose(
                draft.ids, self.options.use_ngram_cache, single_target=draft.dists is not None
            )
        tokens = merged.target_ids[: self.options.max_proposals]
        spans = merged.spans[: len(tokens)]
        return Proposals(tokens, q_prime(draft.q, spans), spans, DRAFTER, draft, merged.ngram_hits, setup)

    def verify(self, proposals: Proposals) -> tuple[int, int]:
        """One target forward over the pending token and t_1..t_m: how many
        proposals are accepted (n), and the target's own token after them (at the
        first rejection, or the bonus token when all are accepted). The cache
        forgets the rejected ones."""
        t = proposals.tokens
        logits = self.session.forward([self.pending] + t)
        if self.cfg.penalized:
            # Row i picks the token after the context and t_1..t_{i-1}: were those
            # proposals accepted, plain decoding would pick that token with them in
            # its history, so row i is penalized with them (and only them). The
            # verified distribution is then plain decoding's at each position, and
            # q' stays the drafter's own: the output is plain decoding's (greedy) or
            # has its distribution (sampling).
            logits = penalize_rows(logits, self.context, t, self.cfg)
        if self.cfg.greedy:
            n, token = verify_greedy(t, logits)
        else:
            vocab = logits.shape[-1]
            n, token = verify_sampling(
                t, proposals.q_prime, logits, self.cfg, self.gen,
                lambda i: self.bridge.q_prime_dist(
                    proposals.draft, proposals.spans[i], t[i], proposals.q_prime[i], vocab
                ),
            )
        self.session.crop(len(t) - n)
        return n, token

    def accept(self, new: list[int]) -> None:
        """Accepted target tokens join the context; the last one is pending."""
        self.context += new
        self.pending = new[-1]

    def learn(self, new: int) -> None:
        """The n-gram cache learns from the accepted text (docs/method.md §1)."""
        if self.options.use_ngram_cache and not self.bridge.same_vocab:
            self.bridge.learn_text(self.context[-(new + LEARN_LOOK_BEHIND) :])


def generate_speculative(
    target: TargetRunner,
    target_tokenizer,
    drafter: Drafter,
    bridge: VocabBridge,
    prompt_ids: list[int],
    drafter_prefix: list[int],
    cfg: GenerationConfig,
    stop_ids: set[int],
    options: SpecOptions | None = None,
    should_stop: ShouldStop = never,
    policy: DraftPolicy | None = None,
    learn_policy: bool = True,
) -> Iterator[TokenChunk | TurnFinished]:
    """policy chooses between a lookup and the drafter (None: lookup whenever one
    is found); learn_policy: record each step's outcome in it."""
    options = options or SpecOptions()
    turn = Turn("omnidraft", target_tokenizer, prompt_ids, cfg, stop_ids)
    decoder = SpeculativeDecoder(target, drafter, bridge, prompt_ids, drafter_prefix, cfg, turn.gen, options, policy)

    # The first reply token streams before the drafter reads the prompt: a reply
    # starts after one prefill.
    first = decoder.prefill()
    turn.stats.steps += 1
    yield from turn.push([first])
    decoder.accept([first])
    if options.use_ngram_cache:
        bridge.learn_text(decoder.context)  # the prompt is accepted text too

    while not turn.stream.reason and not should_stop():
        room = cfg.max_new_tokens - len(turn.stream.ids) - 1  # the target adds one token itself
        k = max(0, min(drafter.settings.k, room))
        t0 = time.perf_counter()
        proposals = decoder.propose(k)
        t1 = time.perf_counter()
        n, token = decoder.verify(proposals)
        t2 = time.perf_counter()
        _count_step(turn.stats, proposals, n, t1 - t0, t2 - t1)
        if k and policy is not None:
            # Prices are this machine's timings, measured whatever the turn; which
            # source pays off is learned from the user's turns only.
            step_s = t2 - t0 - proposals.setup_seconds
            policy.prices.record_step(len(proposals.tokens) + 1, t2 - t1, step_s, n + 1)
            if learn_policy:
                policy.record(proposals.source, n + 1, step_s)
            if proposals.draft is not None:
                policy.calibration.record(proposal_chances(proposals.draft.p, proposals.spans), n)

        new = proposals.tokens[:n] + [token]
        yield from turn.push(new, drafted=n)
        decoder.accept(new)
        if turn.stream.reason:
            break
        decoder.learn(len(new))

    yield turn.finished()


def _count_step(stats: TurnStats, proposals: Proposals, n: int, draft_s: float, verify_s: float) -> None:
    m = len(proposals.tokens)
    stats.steps += 1
    stats.proposed += m
    stats.accepted += n
    stats.ngram_hits += proposals.ngram_hits
    stats.draft_seconds += draft_s
    stats.drafter_prompt_seconds += proposals.setup_seconds
    stats.verify_seconds += verify_s
    if proposals.source != DRAFTER:
        stats.lookup_steps += 1
        stats.lookup_proposed += m
        stats.lookup_accepted += n
    if proposals.draft is not None:
        spans = proposals.spans
        stats.add_drafted(proposal_chances(proposals.draft.p, spans), proposal_chances(proposals.draft.raw, spans),
                          merged_spans(spans), n)
