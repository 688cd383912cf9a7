"""Speculative decoding: lossless greedy against plain decoding (float32, tiny
random models with the two real tokenizers), sampling, cancellation."""

import collections
import itertools
import math
import time

import pytest
import torch
from omnidraft.core.decoding.sampling import (
    GenerationConfig,
    penalize,
    penalize_rows,
    probabilities,
)
from omnidraft.core.decoding.speculative import SpecOptions, generate_speculative
from omnidraft.core.decoding.verification import verify_sampling
from omnidraft.core.decoding.vocab_bridge import VocabBridge
from omnidraft.core.events import TokenChunk, TurnFinished
from omnidraft.core.models.lean_llama import LeanLlama
from omnidraft.core.models.target_runtime import TargetRunner

from tests.tiny import PROMPTS, lean_drafter, run_plain, tiny_llama, tiny_qwen2


def _run_spec(target, ttok, drafter, bridge, prompt, cfg, **opts):
    ids = ttok(prompt)["input_ids"]
    prefix = ids if bridge.same_vocab else drafter.tokenizer(prompt)["input_ids"]
    events = list(generate_speculative(TargetRunner(target), ttok, drafter, bridge, ids, prefix, cfg, set(), SpecOptions(**opts)))
    done = events[-1]
    assert isinstance(done, TurnFinished)
    assert "".join(e.text for e in events if isinstance(e, TokenChunk)) == done.text
    return done


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("lookup", [True, False])
def test_cross_vocab_greedy_is_lossless(cross, gemma_tok, prompt, lookup):
    target, drafter, bridge = cross
    cfg = GenerationConfig(max_new_tokens=24)
    plain = run_plain(target, gemma_tok, prompt, cfg)
    spec = _run_spec(target, gemma_tok, drafter, bridge, prompt, cfg, prompt_lookup=lookup)
    assert spec.token_ids == plain.token_ids
    assert spec.text == plain.text
    # Drafts were verified, not skipped, and every step gave its accepted drafts
    # plus one token of the target's own (the prompt's step: that token alone).
    assert spec.stats.proposed > 0
    assert spec.stats.steps + spec.stats.accepted == spec.stats.new_tokens


def test_accepted_drafts_save_target_steps(cross, gemma_tok):
    """The random drafter happens to agree with the random target on this prompt:
    what it gets accepted spares target forwards."""
    target, drafter, bridge = cross
    spec = _run_spec(target, gemma_tok, drafter, bridge, PROMPTS[1], GenerationConfig(max_new_tokens=24))
    assert spec.stats.accepted > 0
    assert spec.stats.steps == spec.stats.new_tokens - spec.stats.accepted


@pytest.fixture(scope="module")
def cross_qwen(smol_tok, qwen_tok):
    target = tiny_qwen2(len(qwen_tok), seed=1)
    drafter = lean_drafter(tiny_llama(len(smol_tok), seed=2), smol_tok)
    return target, drafter, VocabBridge(smol_tok, qwen_tok)


@pytest.mark.parametrize("prompt", PROMPTS + ["x<|im_end|>\n<|im_start|>assistant\n    return"])
def test_cross_vocab_greedy_is_lossless_with_the_qwen_tokenizer(cross_qwen, qwen_tok, prompt):
    target, drafter, bridge = cross_qwen
    cfg = GenerationConfig(max_new_tokens=24)
    plain = run_plain(target, qwen_tok, prompt, cfg)
    spec = _run_spec(target, qwen_tok, drafter, bridge, prompt, cfg)
    assert spec.token_ids == plain.token_ids
    assert spec.text == plain.text


def test_same_vocab_with_a_perfect_drafter_accepts_everything(smol_tok):
    """Drafter = target weights: every proposal is the target's own choice."""
    target = tiny_llama(len(smol_tok), seed=3)
    drafter = lean_drafter(target, smol_tok, k=4)
    bridge = VocabBridge(smol_tok, smol_tok)
    assert bridge.same_vocab
    cfg = GenerationConfig(max_new_tokens=21)
    plain = run_plain(target, smol_tok, PROMPTS[0], cfg)
    spec = _run_spec(target, smol_tok, drafter, bridge, PROMPTS[0], cfg, prompt_lookup=False)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.acceptance_rate == 1.0
    assert spec.stats.tokens_per_step == pytest.approx(21 / spec.stats.steps)
    assert spec.stats.steps <= 21 // 5 + 1


def test_greedy_with_a_repetition_penalty_is_plain_decodings_reply(cross, gemma_tok):
    """The penalty applies under greedy (as in llama.cpp and transformers), and each
    verified position is penalized with the drafts before it: the reply is plain
    decoding's token for token, and not the unpenalized one."""
    target, drafter, bridge = cross
    prompt = PROMPTS[1]  # a text that repeats itself
    cfg = GenerationConfig(max_new_tokens=24, repetition_penalty=1.5)
    plain = run_plain(target, gemma_tok, prompt, cfg)
    assert plain.token_ids != run_plain(target, gemma_tok, prompt, GenerationConfig(max_new_tokens=24)).token_ids
    for lookup in (True, False):
        spec = _run_spec(target, gemma_tok, drafter, bridge, prompt, cfg, prompt_lookup=lookup)
        assert spec.token_ids == plain.token_ids
        assert spec.stats.proposed > 0


@pytest.mark.parametrize("draw", [True, False])
@pytest.mark.parametrize("control", [{"top_k": 1}, {"min_p": 1.0}])
def test_sampling_controls_reach_speculative_verification(smol_tok, control, draw):
    """Top-k 1 and min-p 1 leave only the most likely token, so sampling with either
    gives the greedy reply, drafted or not: the controls reach both the drafter
    and the verification. Same-vocabulary pair, so drawn drafts are used as drawn."""
    target = tiny_llama(len(smol_tok), seed=5)
    drafter = lean_drafter(tiny_llama(len(smol_tok), seed=6), smol_tok, k=3, draw_drafts=draw)
    bridge = VocabBridge(smol_tok, smol_tok)
    greedy = run_plain(target, smol_tok, PROMPTS[0], GenerationConfig(max_new_tokens=16))
    cfg = GenerationConfig(max_new_tokens=16, temperature=1.5, seed=4, **control)
    assert run_plain(target, smol_tok, PROMPTS[0], cfg).token_ids == greedy.token_ids
    spec = _run_spec(target, smol_tok, drafter, bridge, PROMPTS[0], cfg, prompt_lookup=False)
    assert spec.token_ids == greedy.token_ids and spec.stats.proposed > 0
    loose = _run_spec(target, smol_tok, drafter, bridge, PROMPTS[0],
                      GenerationConfig(max_new_tokens=16, temperature=1.5, seed=4), prompt_lookup=False)
    assert loose.token_ids != greedy.token_ids  # without the control, sampling wanders


def test_sampling_is_reproducible_and_stops_at_max_tokens(cross, gemma_tok):
    target, drafter, bridge = cross
    cfg = GenerationConfig(max_new_tokens=16, temperature=0.8, top_p=0.95, seed=11)
    a = _run_spec(target, gemma_tok, drafter, bridge, PROMPTS[1], cfg)
    b = _run_spec(target, gemma_tok, drafter, bridge, PROMPTS[1], cfg)
    assert a.token_ids == b.token_ids
    assert len(a.token_ids) == 16 and a.reason == "length"


# Each sampling control alone, then all together (temperature 1 unless the control is it).
CONTROLS = {
    "temperature": {"temperature": 1.6},
    "top-k": {"top_k": 2},
    "top-p": {"top_p": 0.9},
    "min-p": {"min_p": 0.1},
    # A 2-token window, so each position's history differs (4 tokens would soon all be in a longer one).
    "repetition penalty": {"repetition_penalty": 4.0, "penalty_last_n": 2},
    "all": {"temperature": 0.8, "top_k": 3, "top_p": 0.9, "min_p": 0.1, "repetition_penalty": 4.0,
            "penalty_last_n": 2},
}


@pytest.mark.parametrize("draw", [True, False])
def test_speculative_sampling_emits_the_target_distribution(draw, one_thread):
    """Whatever the drafter proposes, the token verification emits follows the
    target's p: a drawn draft (t ~ q, accepted with min(1, p/q)) or the drafter's
    most likely token (a point mass, accepted with p(t)), the residual drawing the
    rest. 6 tokens, the drafter's likeliest (token 1) the target's second."""
    p = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
    q = torch.tensor([0.10, 0.50, 0.20, 0.10, 0.05, 0.05])
    cfg = GenerationConfig(temperature=1.0)
    logits = p.log().repeat(2, 1)  # the proposal's row, then the bonus row
    gen = torch.Generator().manual_seed(0)
    n, counts = 6000, torch.zeros(6)
    for _ in range(n):
        if draw:
            tok = int(torch.multinomial(q, 1, generator=gen))
            q_tok, q_dist = float(q[tok]), q
        else:
            tok, q_tok, q_dist = 1, 1.0, torch.nn.functional.one_hot(torch.tensor(1), 6).float()
        accepted, own = verify_sampling([tok], [q_tok], logits, cfg, gen, lambda i, d=q_dist: d)
        counts[tok if accepted else own] += 1
    sigma = (n * p * (1 - p)).sqrt()
    assert ((counts - n * p).abs() < 4 * sigma).all(), (counts / n).tolist()


# A toy pair on 4 tokens: bigram logits (the next token's logits after each token)
# for the target and for a drafter that disagrees with it.
_VOCAB, _REPLY, _PROMPT = 4, 3, (0, 1)
_TARGET = torch.randn(_VOCAB, _VOCAB, generator=torch.Generator().manual_seed(1)) * 1.5 + 1.5 * torch.eye(_VOCAB)


def _target(cfg: GenerationConfig) -> torch.Tensor:
    """Under the penalty, a target keener still to repeat its last token (what the
    penalty is for), so a wrong history shows; elsewhere that would leave too few
    likely replies."""
    return _TARGET + 1.5 * torch.eye(_VOCAB) if cfg.penalized else _TARGET
_DRAFTER = torch.randn(_VOCAB, _VOCAB, generator=torch.Generator().manual_seed(2)) * 1.5


def _plain_reply_distribution(cfg: GenerationConfig) -> dict[tuple[int, ...], float]:
    """Each 3-token reply's exact chance under plain sampling (pick's transforms:
    the penalty with the context so far, then probabilities)."""
    exact, target = {}, _target(cfg)
    for reply in itertools.product(range(_VOCAB), repeat=_REPLY):
        chance, context = 1.0, list(_PROMPT)
        for tok in reply:
            logits = penalize(target[context[-1]], context, cfg) if cfg.penalized else target[context[-1]]
            chance *= float(probabilities(logits, cfg)[tok])
            context.append(tok)
        exact[reply] = chance
    return exact


def _speculative_replies(cfg: GenerationConfig, draw: bool, n: int, k: int = 2) -> collections.Counter:
    """n replies by speculative sampling, as SpeculativeDecoder runs it: k drafter
    tokens drawn from its own transformed distribution (or its likeliest, point
    masses), one target pass over them, its rows penalized each with its own
    history. What depends on no draw is computed once per history."""
    gen = torch.Generator().manual_seed(3)
    target, drafter = _target(cfg), probabilities(_DRAFTER, cfg)  # the drafter knows no history: no penalty
    points = torch.eye(_VOCAB)
    rows: dict[tuple[tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}
    replies: collections.Counter = collections.Counter()
    for _ in range(n):
        context: list[int] = list(_PROMPT)
        while len(context) - len(_PROMPT) < _REPLY:
            tokens: list[int] = []
            for _ in range(k):
                own = drafter[(tokens or context)[-1]]
                tokens.append(int(torch.multinomial(own, 1, generator=gen)) if draw else int(own.argmax()))
            q = [float(drafter[prev, tok]) if draw else 1.0 for prev, tok in zip(context[-1:] + tokens, tokens)]
            dists = [drafter[prev] if draw else points[tok] for prev, tok in zip(context[-1:] + tokens, tokens)]
            key = (tuple(context), tuple(tokens))
            if key not in rows:
                logits = target[[context[-1]] + tokens]
                rows[key] = penalize_rows(logits, context, tokens, cfg) if cfg.penalized else logits
            accepted, own_token = verify_sampling(tokens, q, rows[key], cfg, gen, lambda i, d=dists: d[i])
            context += tokens[:accepted] + [own_token]
        replies[tuple(context[len(_PROMPT):len(_PROMPT) + _REPLY])] += 1
    return replies


@pytest.fixture
def one_thread():
    """Torch ops on 4-token rows: one thread spares each op a hand-off between
    threads (with the CPUs busy, ~10 ms for a softmax)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("draw", [True, False])
@pytest.mark.parametrize("control", list(CONTROLS))
def test_speculative_sampling_under_each_control_emits_plain_samplings_replies(control, draw, one_thread):
    """Under each sampling control and all of them together, speculative sampling's
    3-token replies follow plain sampling's exact distribution over all 64: the
    verification judges drafts by the transformed target distribution (for the
    repetition penalty, row i's history holds the drafts before i), the drafter's
    proposal is what it drew from. A chi-square bound with cells of under 5
    expected replies pooled; a wrong history (row i without the drafts before i)
    or the untransformed target fails it several times over."""
    cfg = GenerationConfig(**{"temperature": 1.0, **CONTROLS[control]})
    exact = _plain_reply_distribution(cfg)
    n = 1000
    seen = _speculative_replies(cfg, draw, n)
    assert set(seen) <= {r for r, c in exact.items() if c > 0}, "a reply plain sampling never gives"
    cells, pooled_expected, pooled_seen = [], 0.0, 0
    for reply, chance in exact.items():
        if n * chance >= 5:
            cells.append((seen[reply], n * chance))
        else:
            pooled_expected += n * chance
            pooled_seen += seen[reply]
    if pooled_expected > 0:
        cells.append((pooled_seen, pooled_expected))
    chi2 = sum((o - e) ** 2 / e for o, e in cells)
    dof = len(cells) - 1
    assert dof >= 5, "too few likely replies to tell distributions apart"
    assert chi2 < dof + 6 * math.sqrt(2 * dof), (chi2, dof)  # p < 1e-6 for a right sampler


def test_a_drafter_with_a_shorter_head_drafts_only_its_first_ids_and_changes_no_token(smol_tok):
    """DraftSettings.head_tokens: the drafter's logits are its full head's over the
    first N ids, it proposes nothing above them, and the reply is plain decoding's."""
    target = tiny_llama(len(smol_tok), seed=3)
    full = lean_drafter(target, smol_tok, head_tokens=None)
    short = lean_drafter(target, smol_tok, k=4, head_tokens=4096)
    context = list(range(5000, 5020))  # the tiny random model repeats its last token
    wide = full.score(context)
    assert wide.numel() == len(smol_tok) and int(wide.argmax()) >= 4096  # the full head's choice is out of reach
    torch.testing.assert_close(short.score(context), wide[:4096])
    proposed = []
    real_draft = short.draft
    short.draft = lambda *a, **kw: proposed.append(d := real_draft(*a, **kw)) or d
    cfg = GenerationConfig(max_new_tokens=16)
    plain = run_plain(target, smol_tok, PROMPTS[0], cfg)
    spec = _run_spec(target, smol_tok, short, VocabBridge(smol_tok, smol_tok), PROMPTS[0], cfg, prompt_lookup=False)
    assert spec.token_ids == plain.token_ids
    ids = [t for d in proposed for t in d.ids]
    assert ids and max(ids) < 4096


def test_sampled_replies_propose_the_drafters_likeliest_tokens(smol_tok):
    """Undrawn drafts under sampling (the default) reach verification and are
    accepted where the target agrees: the tiny random models both repeat the last
    token, which at temperature 0.03 the target does with p ~ 0.999."""
    target = tiny_llama(len(smol_tok), seed=5)
    drafter = lean_drafter(tiny_llama(len(smol_tok), seed=6), smol_tok, k=3)
    assert not drafter.settings.draw_drafts
    bridge = VocabBridge(smol_tok, smol_tok)
    ids = smol_tok("def f(x):")["input_ids"]
    cfg = GenerationConfig(max_new_tokens=12, temperature=0.03, seed=1)
    done = list(generate_speculative(TargetRunner(target), smol_tok, drafter, bridge, ids, ids, cfg, set(),
                                     SpecOptions(prompt_lookup=False)))[-1]
    assert done.stats.proposed > 0 and done.stats.accepted >= done.stats.proposed - 2
    assert done.stats.steps + done.stats.accepted == done.stats.new_tokens


def test_cancel_stops_between_steps(cross, gemma_tok):
    target, drafter, bridge = cross
    ids = gemma_tok(PROMPTS[0])["input_ids"]
    prefix = drafter.tokenizer(PROMPTS[0])["input_ids"]
    seen = []
    events = generate_speculative(
        TargetRunner(target), gemma_tok, drafter, bridge, ids, prefix, GenerationConfig(max_new_tokens=200), set(),
        should_stop=lambda: len(seen) >= 2,
    )
    for e in events:
        seen.append(e)  # noqa: PERF402 - cancel() reads seen as it grows
    assert seen[-1].reason == "cancelled"
    assert len(seen[-1].token_ids) < 200


def test_lean_forward_matches_transformers(smol_tok):
    model = tiny_llama(len(smol_tok), seed=4, layers=3)
    ids = torch.tensor(smol_tok(PROMPTS[0])["input_ids"])
    with torch.no_grad():
        ref = model(ids[None]).logits[0]
    lean = LeanLlama(model, max_len=256)
    first, _ = lean.forward(ids[:10])
    rest = [lean.forward(ids[i : i + 1])[0] for i in range(10, len(ids))]
    got = torch.cat([first] + rest)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    lean.rollback(5)  # rolled back: recomputing from position 5 gives the same logits
    again, _ = lean.forward(ids[5:])
    torch.testing.assert_close(again, ref[5:], atol=1e-4, rtol=1e-4)


def test_draft_length_adapts_to_the_drafters_confidence(smol_tok):
    model = tiny_llama(len(smol_tok), seed=2)  # random: never confident
    ids = smol_tok(PROMPTS[0])["input_ids"]
    cfg = GenerationConfig()
    fixed = lean_drafter(model, smol_tok, k=4, min_confidence=0.0)
    fixed.start(ids)
    assert len(fixed.draft(cfg, None).ids) == 4
    shy = lean_drafter(model, smol_tok, k=4, min_confidence=0.9)
    shy.start(ids)
    assert len(shy.draft(cfg, None).ids) == 1
    adaptive = lean_drafter(model, smol_tok, k=4, min_confidence=0.0, gamma=0.05)
    adaptive.start(ids)
    assert len(adaptive.draft(cfg, None).ids) == 1


def test_a_drafter_told_to_read_part_of_the_prompt_drafts_from_its_start_and_end_alone(smol_tok):
    model = tiny_llama(len(smol_tok), seed=4)
    ids = smol_tok(PROMPTS[0])["input_ids"]
    assert len(ids) > 6
    short = lean_drafter(model, smol_tok, k=4, prompt_tokens=6)
    short.start(ids)
    alone = lean_drafter(model, smol_tok, k=4)
    alone.start(ids[:1] + ids[-5:])  # the first token (the attention sink) and the most recent
    assert short.net.length == 6
    assert short.draft(GenerationConfig(), None).ids == alone.draft(GenerationConfig(), None).ids
    whole = lean_drafter(model, smol_tok, k=4, prompt_tokens=len(ids) + 10)
    whole.start(ids)
    assert whole.net.length == len(ids)


def test_first_text_streams_before_the_drafter_reads_the_prompt(cross, gemma_tok, monkeypatch):
    """A reply starts after the target's prompt pass alone (the reply-latency
    budget): the drafter's own prompt pass comes after the first text."""
    target, drafter, bridge = cross
    started = []

    def start(prefix, _orig=drafter.start):
        started.append(1)
        time.sleep(0.3)  # a slow prompt read, to find in the stats
        _orig(prefix)

    monkeypatch.setattr(drafter, "start", start)
    ids = gemma_tok(PROMPTS[1])["input_ids"]
    prefix = drafter.tokenizer(PROMPTS[1])["input_ids"]
    events = generate_speculative(TargetRunner(target), gemma_tok, drafter, bridge, ids, prefix,
                                  GenerationConfig(max_new_tokens=12), set(), SpecOptions(prompt_lookup=False))
    first = next(e for e in events if isinstance(e, TokenChunk))
    assert first.text and not started
    rest = list(events)
    assert started and isinstance(rest[-1], TurnFinished) and rest[-1].stats.proposed > 0
    # The read is drafting time, told apart: a cost of the reply, not of its steps.
    stats = rest[-1].stats
    assert 0.3 <= stats.drafter_prompt_seconds < stats.draft_seconds


def test_drafting_after_accepted_whitespace_re_drafts_it(smol_tok):
    """Token healing: the context leaves out accepted trailing whitespace, and the
    draft's first tokens spell it (the drafter glues an indent to the next word)."""
    model = tiny_llama(len(smol_tok), seed=3)
    drafter = lean_drafter(model, smol_tok, k=4)
    drafter.start(smol_tok("def f(x):")["input_ids"])
    drafter.sync_text("\n    if x:\n        ", heal=True)
    assert drafter.held == b"\n        "
    assert smol_tok.decode(drafter.reply_ids) == "\n    if x:"
    draft = drafter.draft(GenerationConfig(), None)
    assert draft.held == b"\n        "
    spelled = smol_tok.decode(draft.ids).encode()
    assert spelled.startswith(draft.held) or draft.held.startswith(spelled)
    drafter.sync_text("\n    if x:\n        return", heal=True)
    assert drafter.held == b"" and smol_tok.decode(drafter.reply_ids) == "\n    if x:\n        return"
    drafter.sync_text("\n    if x:\n        return ")  # no healing: everything in the context
    assert drafter.held == b"" and smol_tok.decode(drafter.reply_ids).endswith("return ")
