"""The hybrid loss (docs/method.md §2) on tiny models with the real tokenizers."""

import pytest
import torch
import torch.nn.functional as F
from omnidraft.core.decoding.vocab_bridge import VocabBridge
from omnidraft.core.learning.adapters import AdapterStore, adapter_name
from omnidraft.core.learning.distillation import clip_sample, hybrid_loss, split_segments

from tests.distill_helpers import PROMPT, REPLIES, cross_bridge, learnable_drafter, make_sample
from tests.tiny import tiny_gemma3, tiny_llama


@pytest.fixture(scope="module")
def cross(smol_tok, gemma_tok):
    return cross_bridge(smol_tok, gemma_tok)


@pytest.fixture(scope="module")
def target(gemma_tok):
    return tiny_gemma3(len(gemma_tok), seed=3)


def _logits(model, ids):
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]


def test_same_model_same_vocab_has_zero_loss(smol_tok):
    bridge = VocabBridge(smol_tok, smol_tok)
    assert bridge.same_vocab
    model = tiny_llama(len(smol_tok), seed=1)
    sample = make_sample(smol_tok, smol_tok, PROMPT, REPLIES[0], same_ids=True)
    with torch.no_grad():
        logits = _logits(model, sample.target_ids)
    loss, stats = hybrid_loss(logits, logits, sample, bridge)
    assert stats["n_dm"] == len(sample.target_reply) and stats["n_ngram"] == 0
    assert abs(float(loss)) < 1e-5
    assert stats["acceptance_estimate"] == pytest.approx(1.0, abs=1e-4)
    assert stats["greedy_match"] == 1.0
    other = tiny_llama(len(smol_tok), seed=2)
    with torch.no_grad():
        loss2, stats2 = hybrid_loss(_logits(other, sample.drafter_ids), logits, sample, bridge)
    assert float(loss2) > 0.01 and stats2["acceptance_estimate"] < 0.99


def test_segments_split_direct_and_ngram(cross, smol_tok, gemma_tok):
    sample = make_sample(smol_tok, gemma_tok, PROMPT, REPLIES[0])
    direct, ngram = split_segments(sample, cross)
    assert direct and ngram
    for d, t in direct:
        assert cross.direct(sample.drafter_ids[d]) == sample.target_ids[t]
    covered = [p for _, p in direct] and sorted([d for d, _ in direct] + [p for s in ngram for p in s])
    assert covered == list(range(sample.drafter_prompt_len, len(sample.drafter_ids)))
    # Every n-gram segment's drafter text matches some target text.
    for seg in ngram:
        text = smol_tok.decode([sample.drafter_ids[p] for p in seg])
        assert text and text in REPLIES[0]


def test_loss_matches_the_formulas(cross, smol_tok, gemma_tok, target):
    """L_DM against an explicit target-vocabulary KL; L_Ngram against plain NLLs."""
    drafter = tiny_llama(len(smol_tok), seed=4)
    sample = make_sample(smol_tok, gemma_tok, PROMPT, REPLIES[1])
    with torch.no_grad():
        q_logits, p_logits = _logits(drafter, sample.drafter_ids), _logits(target, sample.target_ids)
    loss, stats = hybrid_loss(q_logits, p_logits, sample, cross, lam=0.2)
    direct, ngram = split_segments(sample, cross)
    mapped = cross.direct.to_target
    kls = []
    for d, t in direct:
        q = F.softmax(q_logits[d - 1], -1)
        q_prime = torch.zeros(p_logits.shape[-1])
        q_prime.index_add_(0, mapped[mapped >= 0], q[mapped >= 0])
        q_prime /= q_prime.sum()
        log_p = F.log_softmax(p_logits[t - 1], -1)
        nz = q_prime > 0
        kls.append(float((q_prime[nz] * (q_prime[nz].log() - log_p[nz])).sum()))
    nlls = [
        sum(-float(F.log_softmax(q_logits[p - 1], -1)[sample.drafter_ids[p]]) for p in seg) / len(seg)
        for seg in ngram
    ]
    dm, ng = sum(kls) / len(kls), sum(nlls) / len(nlls)
    assert stats["dm"] == pytest.approx(dm, rel=1e-4)
    assert stats["ngram"] == pytest.approx(ng, rel=1e-4)
    assert float(loss) == pytest.approx(dm + 0.2 * ng, rel=1e-4)
    assert stats["n_ngram"] == len(ngram) > 0
    loss0, _ = hybrid_loss(q_logits, p_logits, sample, cross, lam=0.0)
    assert float(loss) - float(loss0) == pytest.approx(0.2 * ng, rel=1e-3)


def test_offsets_give_the_same_loss(cross, smol_tok, gemma_tok, target):
    drafter = tiny_llama(len(smol_tok), seed=4)
    sample = make_sample(smol_tok, gemma_tok, PROMPT, REPLIES[2])
    with torch.no_grad():
        q_logits, p_logits = _logits(drafter, sample.drafter_ids), _logits(target, sample.target_ids)
    full, _ = hybrid_loss(q_logits, p_logits, sample, cross)
    d0, t0 = sample.drafter_prompt_len - 1, sample.target_prompt_len - 1
    part, _ = hybrid_loss(q_logits[d0:], p_logits[t0:], sample, cross, drafter_offset=d0, target_offset=t0)
    assert float(part) == pytest.approx(float(full), rel=1e-6)


def test_clip_keeps_the_same_text(cross, smol_tok, gemma_tok):
    sample = make_sample(smol_tok, gemma_tok, PROMPT, REPLIES[0] + REPLIES[1])
    clipped = clip_sample(sample, cross, max_prompt=5, max_reply=9)
    assert 0 < len(clipped.target_reply) <= 9
    assert clipped.target_prompt_len == clipped.drafter_prompt_len == 5
    assert clipped.target_ids[0] == sample.target_ids[0]  # BOS kept
    assert gemma_tok.decode(clipped.target_reply) == smol_tok.decode(clipped.drafter_reply)


def test_training_lowers_the_loss_and_only_lora_learns(tmp_path, cross, smol_tok, gemma_tok, target):
    store = AdapterStore(tmp_path / "adapters", learnable_drafter(len(smol_tok)), rank=8, alpha=16)
    model = store.activate("tiny-gemma")
    samples = [make_sample(smol_tok, gemma_tok, PROMPT, r) for r in REPLIES[:2]]
    with torch.no_grad():
        targets = [_logits(target, s.target_ids) for s in samples]
    opt = torch.optim.AdamW(store.parameters("tiny-gemma"), lr=1e-2)
    history = []
    for step in range(5):
        opt.zero_grad()
        totals = [0.0, 0.0, 0.0]
        for s, t_logits in zip(samples, targets):
            keep = len(s.drafter_ids) - s.drafter_prompt_len + 1  # rows from the last prompt position
            d_logits = model(input_ids=torch.tensor([s.drafter_ids]), logits_to_keep=keep).logits[0]
            loss, stats = hybrid_loss(d_logits, t_logits, s, cross, drafter_offset=len(s.drafter_ids) - keep)
            loss.backward()
            totals = [a + b for a, b in zip(totals, (float(loss.detach()), stats["dm"], stats["acceptance_estimate"]))]
        if step == 0:
            with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
            assert with_grad and all("lora_" in n and adapter_name("tiny-gemma") in n for n in with_grad)
            assert all(p.grad is None for p in target.parameters())
        opt.step()
        history.append(totals)
    (loss0, dm0, acc0), (loss1, dm1, acc1) = history[0], history[-1]
    assert loss1 < 0.8 * loss0
    assert dm1 < 0.8 * dm0  # the reverse KL itself moves, not only the n-gram NLL
    assert acc1 > acc0
