"""The acceptance head: how target proposals get their chance, what it is
trained against, that an untrained head changes nothing, that a trained one
decides when drafting stops but never what the reply is, and that it is kept
with the adapter, encrypted."""

from dataclasses import replace

import pytest
import torch
from keyring.backends import fail
from omnidraft.core.decoding.plain import generate_plain
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.decoding.speculative import SpecOptions, generate_speculative
from omnidraft.core.learning.acceptance_head import (
    LR,
    MIN_LABELS,
    STEPS,
    AcceptanceHead,
    head_example,
    head_loss,
    proposal_chances,
    segment_labels,
)
from omnidraft.core.learning.adapters import HEAD_FILE, AdapterStore
from omnidraft.core.learning.distillation import aligned_segments
from omnidraft.core.learning.learner import Learner
from omnidraft.core.learning.replay_buffer import ReplayBuffer
from omnidraft.core.models.target_runtime import TargetRunner
from omnidraft.core.storage.secure_store import KeyStore

from tests.distill_helpers import PROMPT, REPLIES, cross_bridge, learnable_drafter, make_sample
from tests.tiny import PROMPTS, lean_drafter, tiny_gemma3, tiny_llama

TARGET = "tiny-gemma"


def _head(width: int, bias: float) -> AcceptanceHead:
    """A trained-looking head that predicts about sigmoid(bias) whatever it sees."""
    head = AcceptanceHead(width)
    with torch.no_grad():
        head.confidence.zero_()
        head.hidden.bias.fill_(bias)
    head.labels_seen = MIN_LABELS
    return head


def test_an_ngram_token_gets_the_product_of_its_pieces_and_each_piece_counts_once():
    p = [0.9, 0.5, 0.8, 0.7]
    # target 0 <- drafter 0; target 1 <- drafter 1+2 (merged); drafter 3 spells targets 2 and 3
    chances = proposal_chances(p, [(0,), (1, 2), (3,), (3,)])
    assert chances == pytest.approx([0.9, 0.4, 0.7, 1.0])
    assert torch.tensor(chances).prod() == pytest.approx(torch.tensor(p).prod())


@pytest.fixture(scope="module")
def cross(smol_tok, gemma_tok):
    target = tiny_gemma3(len(gemma_tok), seed=1)
    drafter = lean_drafter(tiny_llama(len(smol_tok), seed=2), smol_tok)
    return target, drafter, cross_bridge(smol_tok, gemma_tok)


def _draft(drafter, ids, head):
    drafter.head = head
    try:
        drafter.start(ids)
        return drafter.draft(GenerationConfig(), None)
    finally:
        drafter.head = None


def test_an_untrained_head_drafts_by_the_drafters_confidence(cross, smol_tok):
    _, drafter, _ = cross
    ids = smol_tok(PROMPTS[0])["input_ids"]
    fresh = AcceptanceHead(drafter.loaded.model.config.hidden_size)
    without, with_fresh = _draft(drafter, ids, None), _draft(drafter, ids, fresh)
    assert with_fresh.ids == without.ids
    assert with_fresh.p == with_fresh.q and without.p == without.q  # greedy: q is the top probability
    assert fresh.chance(torch.zeros(fresh.hidden.in_features), 0.3) is None
    # The untrained head's own formula is the confidence too, so training starts from today's rule.
    fresh.labels_seen = MIN_LABELS
    assert fresh.chance(torch.randn(fresh.hidden.in_features), 0.3) == pytest.approx(0.3)


def test_a_trained_head_decides_when_drafting_stops(cross, smol_tok):
    _, drafter, _ = cross
    ids = smol_tok(PROMPTS[0])["input_ids"]
    width = drafter.loaded.model.config.hidden_size
    drafter.settings.gamma = 0.5
    try:
        assert len(_draft(drafter, ids, _head(width, 8.0)).ids) == 4  # sure of acceptance: the full k
        doubtful = _draft(drafter, ids, _head(width, -8.0))
        assert len(doubtful.ids) == 1 and doubtful.p[0] < 1e-3  # 1 - P > gamma after one token
    finally:
        drafter.settings.gamma = None


def test_a_head_that_stops_drafting_early_changes_no_token(cross, gemma_tok):
    """Learning changes speed, never answers: greedy output identical to plain."""
    target, drafter, bridge = cross
    width = drafter.loaded.model.config.hidden_size
    lengths = []
    real_draft = drafter.draft

    def counted(*args, **kw):
        out = real_draft(*args, **kw)
        lengths.append(len(out.ids))
        return out

    cfg = GenerationConfig(max_new_tokens=24)
    drafter.settings.min_confidence = 0.5  # the per-token rule, with the head's P in it
    drafter.draft = counted
    try:
        for prompt in PROMPTS:
            ids = gemma_tok(prompt)["input_ids"]
            plain = list(generate_plain(TargetRunner(target), gemma_tok, ids, cfg, set()))[-1]
            drafter.head = _head(width, -8.0)
            events = generate_speculative(TargetRunner(target), gemma_tok, drafter, bridge, ids, drafter.tokenizer(prompt)["input_ids"],
                                          cfg, set(), SpecOptions(prompt_lookup=False))
            spec = list(events)[-1]
            assert spec.token_ids == plain.token_ids and spec.text == plain.text
            assert spec.stats.chance_checked and spec.stats.chance_sum / spec.stats.chance_checked < 1e-3
    finally:
        drafter.head, drafter.draft, drafter.settings.min_confidence = None, real_draft, 0.0
    assert lengths and set(lengths) == {1}  # every step stopped after its first drafted token


def test_greedy_labels_say_whether_both_argmaxes_spell_the_reply(smol_tok, gemma_tok):
    bridge = cross_bridge(smol_tok, gemma_tok)
    sample = make_sample(smol_tok, gemma_tok, PROMPT, REPLIES[0])
    segments = aligned_segments(sample, bridge)
    assert any(direct for *_, direct in segments) and any(not direct for *_, direct in segments)
    # Logits whose argmax at every position is the next token of the sample: both
    # models would say exactly the reply, so every segment is accepted.
    d_logits = torch.zeros(len(sample.drafter_ids), len(smol_tok))
    d_logits[torch.arange(len(sample.drafter_ids) - 1), torch.tensor(sample.drafter_ids[1:])] = 5.0
    t_logits = torch.zeros(len(sample.target_ids), len(gemma_tok))
    t_logits[torch.arange(len(sample.target_ids) - 1), torch.tensor(sample.target_ids[1:])] = 5.0
    rows_of, labels = segment_labels(sample, bridge, d_logits, t_logits)
    assert len(labels) == len(segments) and set(labels) == {1.0}
    # The drafter would say something else at one direct and at one n-gram segment.
    direct_rows = next(d for d, _, direct in segments if direct)
    ngram_rows = next(d for d, _, direct in segments if not direct)
    for pos in (direct_rows[0], ngram_rows[-1]):
        d_logits[pos - 1] = 0.0
        d_logits[pos - 1, smol_tok.convert_tokens_to_ids("Ġzebra")] = 5.0
    rows_of, labels = segment_labels(sample, bridge, d_logits, t_logits)
    assert [rows_of[n] for n, y in enumerate(labels) if y == 0.0] == [
        [p - 1 for p in direct_rows], [p - 1 for p in ngram_rows]]
    # Sampled turns whose drafts were drawn: a direct segment's label is the expected
    # acceptance, Σ min(q, p), between 0 and 1; n-gram segments get none.
    drawn = replace(sample, temperature=1.0, drawn=True)
    rows_of, labels = segment_labels(drawn, bridge, d_logits, t_logits)
    assert len(labels) == sum(direct for *_, direct in segments) and all(0.0 <= y <= 1.0 for y in labels)
    # Sampled turns whose drafts were the drafter's argmaxes (point masses): the
    # target's p_T of what the drafter proposes (the reply's token, or at one direct
    # segment the zebra), and n-gram segments the drafter spells the product over
    # their target tokens; the one it does not spell gets none.
    hot = replace(sample, temperature=1.0)
    rows_of, labels = segment_labels(hot, bridge, d_logits, t_logits * 3)
    # e^15 against ones (summed in float32: a row rounds apart from another by ~1e-4)
    p_next, p_other = torch.softmax(t_logits[0] * 3, -1).topk(2).values.tolist()
    ngram_lengths = [len(t) for d, t, direct in segments if not direct and d != ngram_rows]
    expected = [p_other] + [p_next] * (sum(direct for *_, direct in segments) - 1) + [p_next**n for n in ngram_lengths]
    assert len(labels) == len(segments) - 1 and sorted(labels) == pytest.approx(sorted(expected), rel=2e-3)


@pytest.fixture
def parts(tmp_path, smol_tok, gemma_tok):
    keys = KeyStore(tmp_path / "keys", backend=fail.Keyring())
    buffer = ReplayBuffer(tmp_path / "buffer.bin", keys=keys)
    drafter = learnable_drafter(len(smol_tok))
    store = AdapterStore(tmp_path / "adapters", drafter, rank=8, alpha=16, keys=keys)
    head = AcceptanceHead(drafter.config.hidden_size)
    learner = Learner(drafter, tiny_gemma3(len(gemma_tok), seed=3), cross_bridge(smol_tok, gemma_tok),
                      buffer, store, TARGET, lr=1e-3, batch_size=4, head=head)
    samples = [make_sample(smol_tok, gemma_tok, PROMPT, r) for r in REPLIES]
    return learner, buffer, store, head, samples


def test_the_learner_trains_the_head_toward_its_labels(parts):
    learner, buffer, _, head, samples = parts
    results = []
    passes = 20  # over the same four turns
    for _ in range(passes):
        for s in samples:
            buffer.add(replace(s))
        results.append(learner.step())
    first, last = results[0], results[-1]
    assert last["head_loss"] < 0.7 * first["head_loss"]
    assert abs(last["head_predicted"] - last["head_observed"]) < abs(first["head_predicted"] - first["head_observed"])
    assert head.labels_seen > 0 and head.labels_seen % passes == 0  # the same labels, each pass


def test_the_head_learns_what_the_hidden_state_says_about_acceptance():
    """Turns where acceptance depends on a direction of the hidden state the
    drafter's confidence does not show: the head learns to tell them apart, and
    its mean chance comes to match the observed rate."""
    gen = torch.Generator().manual_seed(0)
    width, turns = 32, []
    for _ in range(2):  # two long turns: the same 320 labels as many short ones, in fewer loss calls
        hidden = torch.randn(160, width, generator=gen)
        labels = (hidden[:, 3] > 0.5).float().tolist()  # ~30% accepted
        logits = torch.randn(160, 100, generator=gen)
        turns.append(head_example(hidden, logits, 0.0, [[r] for r in range(160)], labels))
    head = AcceptanceHead(width)
    optimizer = torch.optim.AdamW(head.parameters(), lr=LR, weight_decay=0.0)
    for _ in range(400 * STEPS):
        optimizer.zero_grad()
        torch.stack([head_loss(head, t)[0] for t in turns]).mean().backward()
        optimizer.step()
    with torch.no_grad():
        chance = torch.cat([torch.sigmoid(head(t.hidden, t.confidence)) for t in turns])
    accepted = torch.cat([t.labels for t in turns]).bool()
    ranked = (chance[accepted][:, None] > chance[~accepted][None, :]).float().mean()  # ROC AUC
    assert ranked > 0.95, ranked
    assert float(chance.mean()) == pytest.approx(float(accepted.float().mean()), abs=0.05)


def test_the_head_is_saved_encrypted_with_the_adapter(parts, gemma_tok):
    learner, buffer, store, head, samples = parts
    for s in samples:
        buffer.add(replace(s))
    assert learner.step()["pass_done"]
    path = store.folder(TARGET) / HEAD_FILE
    assert path.exists() and b"hidden.weight" not in path.read_bytes()
    again = AcceptanceHead.from_state(store.head_state(TARGET), head.hidden.in_features)
    assert again.labels_seen == head.labels_seen > 0
    assert all(torch.equal(a, b) for a, b in zip(again.state().values(), head.state().values()))
    # A save without the head (an older adapter being re-encrypted) keeps the saved head.
    store.save(TARGET)
    assert store.head_state(TARGET)["labels_seen"] == head.labels_seen
    # A damaged head is set aside and reported; the adapter beside it is kept.
    path.write_bytes(b"not a head")
    assert store.head_state(TARGET) is None and "acceptance head" in store.warnings[-1]
    assert not path.exists() and store.has_saved(TARGET)
    assert list(store.root.glob(f"*{HEAD_FILE}.corrupt"))
    with pytest.raises(ValueError, match="not an acceptance head"):
        AcceptanceHead.from_state(head.state(), head.hidden.in_features + 1)


def test_the_head_learns_from_a_turns_first_pass_only(parts):
    """A replayed turn labels drafts of text the adapter has trained on: the
    adapter trains on it again, the head does not."""
    learner, buffer, _, head, samples = parts
    learner.reviews = 1
    for s in samples:
        buffer.add(s)
    first = learner.step()
    seen = head.labels_seen
    assert first["pass_done"] and seen > 0 and "head_loss" in first
    # A new turn with nothing to learn from (no reply) brings one learned turn back.
    empty = replace(samples[0], target_ids=samples[0].target_ids[: samples[0].target_prompt_len],
                    drafter_ids=samples[0].drafter_ids[: samples[0].drafter_prompt_len])
    buffer.add(empty)
    second = learner.step()
    assert second["pass_done"] and learner.updates == 2 and second["samples"] == len(samples) + 2
    assert head.labels_seen == seen and "head_loss" not in second
