"""Adaptive drafting: the per-target choice between a prompt lookup and the
drafter, learned from this target's own verification outcomes."""

import json

import pytest
import torch
from omnidraft.core.decoding.adaptive_drafting import (
    DRAFTER,
    EXPLORE_EVERY,
    MIN_STEPS,
    ChanceCalibration,
    DraftPolicy,
    DraftPrices,
    calibrated,
    lookup_source,
)
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.decoding.speculative import SpecOptions, generate_speculative
from omnidraft.core.models.target_runtime import TargetRunner
from omnidraft.core.storage.persistence import CorruptStateError
from omnidraft.core.storage.secure_store import MAGIC, save_encrypted

from tests.tiny import PROMPTS, run_plain


def _feed(policy, source, steps, tokens, seconds):
    for _ in range(steps):
        policy.record(source, tokens, seconds)


def test_lookups_are_used_until_the_drafter_measurably_does_better():
    policy = DraftPolicy()
    assert policy.use_lookup(2)  # nothing measured: a lookup is free, take it
    _feed(policy, lookup_source(2), int(MIN_STEPS) + 5, tokens=2, seconds=0.1)  # 20 tokens/s
    _feed(policy, lookup_source(4), int(MIN_STEPS) + 5, tokens=4, seconds=0.1)  # 40 tokens/s
    assert policy.use_lookup(2)  # the drafter has too few steps to tell yet
    _feed(policy, DRAFTER, int(MIN_STEPS) + 5, tokens=3, seconds=0.12)  # 25 tokens/s
    choices = [policy.use_lookup(2) for _ in range(4 * EXPLORE_EVERY)]
    assert choices.count(True) == 4  # only the exploration steps keep measuring it
    assert all(policy.use_lookup(4) for _ in range(EXPLORE_EVERY))
    # The drafter gets worse (a new target, say): short lookups pay off again.
    _feed(policy, DRAFTER, 400, tokens=1, seconds=0.12)
    assert all(policy.use_lookup(2) for _ in range(EXPLORE_EVERY))


def test_the_policy_is_saved_and_a_damaged_file_is_refused(tmp_path):
    policy = DraftPolicy()
    _feed(policy, DRAFTER, 30, tokens=3, seconds=0.1)
    path = tmp_path / "draft_policy.bin"
    policy.save(path)
    assert path.read_bytes().startswith(MAGIC)
    again = DraftPolicy.load(path)
    assert again.summary() == policy.summary()
    assert again.summary()[DRAFTER]["tokens_per_step"] == 3.0
    assert DraftPolicy.load(tmp_path / "missing.bin").stats == {}
    legacy = tmp_path / "draft_policy.json"
    for bad in ("{not json", json.dumps({"stats": {"drafter": {"steps": "x"}}}),
                json.dumps({"stats": {"drafter": {"steps": -1, "tokens": 1, "seconds": 1}}}),
                json.dumps({"stats": {"drafter": {"steps": 1, "tokens": "inf", "seconds": 1}}}), "[]"):
        legacy.write_text(bad)
        with pytest.raises(CorruptStateError):
            DraftPolicy.load(tmp_path / "new.bin", legacy=legacy)
        save_encrypted(tmp_path / "bad.bin", "x" if bad.startswith("{not") else json.loads(bad))
        with pytest.raises(CorruptStateError):
            DraftPolicy.load(tmp_path / "bad.bin")


def test_plaintext_statistics_from_an_older_version_are_migrated(tmp_path):
    policy = DraftPolicy()
    _feed(policy, DRAFTER, 30, tokens=3, seconds=0.1)
    legacy, path = tmp_path / "draft_policy.json", tmp_path / "draft_policy.bin"
    legacy.write_text(json.dumps({"stats": {k: vars(v) for k, v in policy.stats.items()}}))
    assert DraftPolicy.load(path, legacy=legacy).summary() == policy.summary()
    assert not legacy.exists() and path.read_bytes().startswith(MAGIC)


def test_decoding_records_each_source_and_stays_lossless_when_lookups_are_refused(cross, gemma_tok):
    target, drafter, bridge = cross
    cfg = GenerationConfig(max_new_tokens=24)
    prompt = PROMPTS[0]  # repeats itself: lookups are found
    ids = gemma_tok(prompt)["input_ids"]
    prefix = drafter.tokenizer(prompt)["input_ids"]
    plain = run_plain(target, gemma_tok, prompt, cfg)

    def run(policy, learn=True):
        return list(generate_speculative(TargetRunner(target), gemma_tok, drafter, bridge, ids, prefix, cfg, set(),
                                         SpecOptions(), policy=policy, learn_policy=learn))[-1]

    learning = DraftPolicy()
    done = run(learning)
    assert done.token_ids == plain.token_ids
    recorded = {name: s.steps for name, s in learning.stats.items()}
    assert recorded.get(DRAFTER, 0) + sum(v for k, v in recorded.items() if k != DRAFTER) > 0
    assert done.stats.lookup_steps == round(sum(v for k, v in recorded.items() if k != DRAFTER))
    # A policy that measured the drafter far ahead never takes a lookup.
    sure = DraftPolicy()
    for m in (2, 3, 4):
        _feed(sure, lookup_source(m), 50, tokens=1, seconds=1.0)
    _feed(sure, DRAFTER, 50, tokens=5, seconds=0.01)
    sure._eligible = 1  # away from an exploration step
    frozen = sure.summary()
    done = run(sure, learn=False)
    assert done.token_ids == plain.token_ids
    assert done.stats.lookup_steps <= 1 + done.stats.steps // EXPLORE_EVERY
    assert sure.summary() == frozen  # evaluation does not teach it


def test_prices_come_from_measured_costs_and_set_how_far_the_drafter_drafts():
    prices = DraftPrices()
    assert prices.threshold() is None  # nothing measured: the drafter's fixed rules apply
    for _ in range(10):
        prices.record_draft(forwards=2, seconds=0.006)  # 3 ms a drafter forward
        prices.record_step(rows=2, verify_seconds=0.040, step_seconds=0.050, tokens=2)
        prices.record_step(rows=4, verify_seconds=0.046, step_seconds=0.050, tokens=2)
    # (3 ms forward + 3 ms a verification row) / 25 ms a target token
    assert prices.threshold() == pytest.approx(0.24)
    # A slower target token is worth more drafting: the bar falls.
    for _ in range(200):
        prices.record_step(rows=2, verify_seconds=0.040, step_seconds=0.100, tokens=2)
        prices.record_step(rows=4, verify_seconds=0.046, step_seconds=0.100, tokens=2)
    assert prices.threshold() == pytest.approx(0.12, rel=1e-3)


def test_an_overconfident_chance_is_brought_to_the_observed_rate():
    """A head that says 0.85 where 70% of proposals are accepted (the Zen 3 adapt
    run's): the calibrated chance settles at the observed rate, and comes back up
    when the head turns right."""
    import random

    rng = random.Random(0)
    cal = ChanceCalibration()

    def serve(raw: float, rate: float, steps: int) -> list[float]:
        used = []
        for _ in range(steps):
            chance = calibrated(raw, cal.bias)
            accepted = 0
            while accepted < 3 and rng.random() < rate:  # a 3-token draft, judged up to its first rejection
                accepted += 1
            cal.record([chance] * 3, accepted)
            used.append(chance)
        return used

    used = serve(0.85, 0.70, 600)
    assert sum(used[-200:]) / 200 == pytest.approx(0.70, abs=0.03)
    used = serve(0.70, 0.70, 600)
    assert sum(used[-200:]) / 200 == pytest.approx(0.70, abs=0.03)
    assert cal.judged > 1000
    assert calibrated(0.5, 0.0) == 0.5 and calibrated(0.5, 10.0) < 1.0


def test_the_engine_corrects_a_wrong_head_as_it_decodes_and_answers_stay_the_same(cross, gemma_tok):
    """A head that says almost no draft is accepted (logit -8): after one reply the
    policy's bias has risen toward what verification accepted; tokens unchanged."""
    from omnidraft.core.learning.acceptance_head import AcceptanceHead

    target, drafter, bridge = cross
    cfg = GenerationConfig(max_new_tokens=24)
    prompt = PROMPTS[1]
    ids = gemma_tok(prompt)["input_ids"]
    plain = run_plain(target, gemma_tok, prompt, cfg)
    head = AcceptanceHead(drafter.loaded.model.config.hidden_size)
    head.labels_seen = 10**6
    with torch.no_grad():
        head.confidence.zero_()
        head.hidden.bias.fill_(-8.0)
    policy = DraftPolicy()
    policy.prices.threshold = lambda: 0.0  # draft the full k: judged proposals every step
    drafter.head = head
    try:
        done = list(generate_speculative(TargetRunner(target), gemma_tok, drafter, bridge, ids,
                                         drafter.tokenizer(prompt)["input_ids"], cfg, set(),
                                         SpecOptions(prompt_lookup=False), policy=policy))[-1]
    finally:
        drafter.head = None
    assert done.token_ids == plain.token_ids
    s = done.stats
    assert s.chance_accepted > 0 and policy.calibration.judged == s.chance_checked
    assert policy.calibration.bias > 0
    assert s.chance_raw_sum < s.chance_sum  # the chances used were raised above the head's


def test_a_priced_drafter_drafts_while_its_chances_cover_the_price_and_answers_stay_the_same(cross, gemma_tok):
    target, drafter, bridge = cross
    cfg = GenerationConfig(max_new_tokens=24)
    prompt = PROMPTS[1]
    ids = gemma_tok(prompt)["input_ids"]
    prefix = drafter.tokenizer(prompt)["input_ids"]
    plain = run_plain(target, gemma_tok, prompt, cfg)
    drafted = {}
    for price in (0.0, 1.0):
        policy = DraftPolicy()
        policy.prices.threshold = lambda price=price: price
        done = list(generate_speculative(TargetRunner(target), gemma_tok, drafter, bridge, ids, prefix, cfg, set(),
                                         SpecOptions(prompt_lookup=False), policy=policy))[-1]
        assert done.token_ids == plain.token_ids  # where drafting stops changes no token
        drafted[price] = done.stats.proposed / max(1, done.stats.steps - 1)
        assert policy.prices.verify  # the engine measures as it goes
        assert (policy.prices.forward.weight > 0) == (price == 0.0)  # a one-token draft runs no forward
    # Free drafting drafts up to k; a price no chance covers stops after one token.
    assert drafted[0.0] > drafted[1.0]
    assert drafted[1.0] <= 1.5
