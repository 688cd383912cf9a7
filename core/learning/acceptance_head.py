"""The acceptance head (docs/method.md §3), across vocabularies.

A small head on the drafter's hidden state predicts, for each drafted token,
P_i = P(the target accepts it | everything drafted before it was accepted)
      = sigmoid(w · rms_norm(h_i) + a · logit(c_i) + b)
h_i is the drafter's final hidden state that produced token i's distribution,
c_i the drafter's own top probability there (the confidence today's rule uses).
A fresh head (w = 0, a = 1, b = 0) computes exactly c_i; until it has been
trained on MIN_LABELS labels the drafter uses c_i itself (`chance` says None),
so an untrained head changes nothing.

Drafting stops once 1 − Π P_i > γ (or, with no γ set, once one P_i falls under
the drafter's min_confidence): the rules of core/decoding/drafter.py, with the
head's P_i in place of c_i.

Across vocabularies. The head sees drafter tokens; verification sees target
tokens. The drafted text is cut into target tokens after drafting (the bridge),
so a target token may be spelled by several drafter tokens (an n-gram merge)
and one drafter token may spell several target tokens. The rule: a drafter
token's P is the chance that the text it spells is accepted; a target token's
chance is the product of the P of the drafter tokens that start inside it (so
an n-gram-merged token gets the product of its pieces, like q' in Eq. 1), and
a target token in which no drafter token starts has chance 1 (it stands or
falls with the drafter token that began before it). Every drafter token is
counted once, so Π over target proposals = Π over drafter tokens, and the stop
rule can be applied while drafting, before the bridge has merged anything.

Training (in the idle learner, from the replay records the distillation uses).
A served reply is accepted text, so the drafter's state at each reply position
is the state it would draft from with everything before accepted: the
condition P_i is about. The reply's two tokenizations are aligned into
segments (core/learning/distillation.aligned_segments); each segment gets one
label, the soft label min(1, p/q') of what the drafter would propose there,
with p and q' as the turn's verification saw them:
* temperature 0 (greedy): p and q' are point masses on the argmaxes, so the
  label is 1 when the target's argmax is the drafter's argmax carried to
  target space (direct segment), or when both models' argmaxes spell the
  segment token by token (n-gram segment); else 0;
* temperature T > 0: the drafter proposes its argmax there too (a point mass,
  DraftSettings.draw_drafts), accepted with the target's p_T of it, so a direct
  segment's label is p_T(map argmax q), and an n-gram segment's the product of
  p_T over its target tokens when the drafter's argmaxes spell it, else none
  (what it would propose instead is another text). Turns recorded with
  `drawn` (drafts drawn from q_T) label a direct segment with the expectation
  over the draw, Σ_x min(q_T(x), p_T(map x)), and no n-gram segment.
The segment's predicted chance is the product of its drafter tokens' P; the
loss is BCE of it against the label, averaged per turn and then over the
batch (each turn weighs the same, whatever its length, as in the
distillation loss). There is no class re-weighting: the stop rule multiplies
the P_i as probabilities, and the benchmark compares their mean with the
observed acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .distillation import _partners, _reverse_kl, aligned_segments

MIN_LABELS = 512  # labelled segments before the head replaces the drafter's confidence
# AdamW. Adam moves each of the 576 hidden-state weights by ~lr a step, so at
# 1e-2 the head followed the last batch (its mean chance swung by 0.08 over 8
# batches) and ranked dev replies' drafts worse than the drafter's confidence
# alone; 1e-3 had the lowest log loss (git show 524cea4:scripts/head_sweep.py).
LR = 1e-3
STEPS = 4  # head updates per learner step, over that step's turns (cheap: no model forward)
_EPS = 1e-6


class AcceptanceHead(torch.nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.hidden = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.hidden.weight)
        torch.nn.init.zeros_(self.hidden.bias)
        self.confidence = torch.nn.Parameter(torch.ones(()))
        self.labels_seen = 0  # labelled segments trained on, ever

    def forward(self, hidden: torch.Tensor, confidence: torch.Tensor) -> torch.Tensor:
        """Logits of P for hidden [n, H] and confidence [n]."""
        h = F.rms_norm(hidden.float(), (hidden.shape[-1],))
        c = confidence.float().clamp(_EPS, 1 - _EPS)
        return self.hidden(h).squeeze(-1) + self.confidence * (c.log() - (-c).log1p())

    @property
    def ready(self) -> bool:
        return self.labels_seen >= MIN_LABELS

    @torch.no_grad()
    def chance(self, hidden: torch.Tensor, confidence: float) -> float | None:
        """P for one drafted token, or None while the head is untrained (use the
        drafter's confidence then)."""
        if not self.ready:
            return None
        return float(torch.sigmoid(self(hidden[None], torch.tensor([confidence]))))

    # ------------------------------------------------------------ persistence
    def state(self) -> dict[str, torch.Tensor]:
        return {"hidden.weight": self.hidden.weight.detach().clone(), "hidden.bias": self.hidden.bias.detach().clone(),
                "confidence": self.confidence.detach().clone(), "labels_seen": torch.tensor(self.labels_seen)}

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor], hidden_size: int) -> AcceptanceHead:
        """ValueError when the state is not a head for this hidden size."""
        head = cls(hidden_size)
        expected = {name: tensor.shape for name, tensor in head.state().items()}
        if set(state) != set(expected) or any(state[k].shape != shape for k, shape in expected.items()):
            raise ValueError(f"not an acceptance head for a {hidden_size}-wide drafter")
        if not all(torch.isfinite(state[k]).all() for k in expected) or int(state["labels_seen"]) < 0:
            raise ValueError("the acceptance head holds negative or infinite numbers")
        with torch.no_grad():
            head.hidden.weight.copy_(state["hidden.weight"])
            head.hidden.bias.copy_(state["hidden.bias"])
            head.confidence.copy_(state["confidence"])
        head.labels_seen = int(state["labels_seen"])
        return head


# ---------------------------------------------------------------- decoding
def proposal_chances(p: list[float], spans: list[tuple[int, ...]]) -> list[float]:
    """Each target proposal's chance from its drafter tokens' P (module doc): the
    product over the drafter tokens first seen in its span."""
    seen: set[int] = set()
    out = []
    for span in spans:
        chance = 1.0
        for i in span:
            if i not in seen:
                seen.add(i)
                chance *= p[i]
        out.append(chance)
    return out


# ---------------------------------------------------------------- training
def segment_labels(
    sample, bridge, drafter_logits: torch.Tensor, target_logits: torch.Tensor,
    drafter_offset: int = 0, target_offset: int = 0,
) -> tuple[list[list[int]], list[float]]:
    """For each labelled reply segment: the drafter logits rows that predict its
    drafter tokens, and its label (module doc). Rows as in distillation.hybrid_loss:
    row r holds the next-token logits after position offset + r."""
    d_rows, t_rows = drafter_logits.shape[0], target_logits.shape[0]
    temperature = sample.temperature
    rows_of, labels = [], []
    with torch.no_grad():
        d_best = drafter_logits.argmax(-1)
        t_best = target_logits.argmax(-1)
        if bridge.same_vocab:
            to_target = torch.arange(drafter_logits.shape[-1])
        else:
            to_target = _partners(bridge.direct, drafter_logits.shape[-1], target_logits.shape[-1])[2]
        for d_pos, t_pos, direct in aligned_segments(sample, bridge):
            d_idx = [d - 1 - drafter_offset for d in d_pos]
            t_idx = [t - 1 - target_offset for t in t_pos]
            if min(d_idx + t_idx) < 0 or max(d_idx) >= d_rows or max(t_idx) >= t_rows:
                continue  # the logits that predict this segment were not computed
            # Whether the drafter's argmaxes spell an n-gram segment's drafter tokens.
            spelled = not direct and all(int(d_best[r]) == sample.drafter_ids[d] for r, d in zip(d_idx, d_pos))
            if temperature > 0 and sample.drawn:
                if not direct:
                    continue
                label = float(_reverse_kl(drafter_logits[d_idx].float() / temperature,
                                          target_logits[t_idx].float() / temperature, bridge)[1][0])
            elif temperature > 0:
                p = torch.softmax(target_logits[t_idx].float() / temperature, -1)
                if direct:
                    tok = int(to_target[d_best[d_idx[0]]])
                    label = float(p[0, tok]) if tok >= 0 else 0.0
                elif spelled:
                    label = float(p[torch.arange(len(t_pos)), torch.tensor([sample.target_ids[t] for t in t_pos])].prod())
                else:
                    continue
            elif direct:
                label = float(to_target[d_best[d_idx[0]]] == t_best[t_idx[0]])
            else:
                taken = all(int(t_best[r]) == sample.target_ids[t] for r, t in zip(t_idx, t_pos))
                label = float(spelled and taken)
            rows_of.append(d_idx)
            labels.append(label)
    return rows_of, labels


@dataclass
class HeadExample:
    """One turn's training data for the head: per drafter token of a labelled
    segment, its hidden state and confidence; per segment, its label."""

    hidden: torch.Tensor  # [tokens, H], detached
    confidence: torch.Tensor  # [tokens]
    segment: torch.Tensor  # [tokens]: the segment each token belongs to
    labels: torch.Tensor  # [segments]


def head_example(
    hidden: torch.Tensor, drafter_logits: torch.Tensor, temperature: float,
    rows_of: list[list[int]], labels: list[float],
) -> HeadExample:
    """hidden [rows, H] beside drafter_logits [rows, V]; rows_of and labels from
    segment_labels. The confidence is the drafter's top probability, as drafting
    computes it (at the turn's temperature)."""
    rows = [r for seg in rows_of for r in seg]
    with torch.no_grad():
        scale = temperature if temperature > 0 else 1.0
        confidence = torch.softmax(drafter_logits[rows].float() / scale, -1).max(-1).values
    return HeadExample(hidden[rows].detach().float(), confidence,
                       torch.tensor([n for n, seg in enumerate(rows_of) for _ in seg]), torch.tensor(labels))


def segment_log_chances(head: AcceptanceHead, example: HeadExample) -> torch.Tensor:
    """Log of each segment's chance: the sum of its drafter tokens' log P."""
    log_p_token = F.logsigmoid(head(example.hidden, example.confidence))
    return torch.zeros(example.labels.numel()).index_add(0, example.segment, log_p_token)


def head_loss(head: AcceptanceHead, example: HeadExample) -> tuple[torch.Tensor, float]:
    """Mean BCE of each segment's chance (the product of its drafter tokens' P)
    against its label, and the mean predicted chance."""
    log_p = segment_log_chances(head, example).clamp(max=-1e-7)
    # log(1 - P), accurate both near P = 0 and near P = 1
    log_not = torch.where(log_p > -0.693, torch.log(-torch.expm1(log_p)), torch.log1p(-torch.exp(log_p)))
    y = example.labels
    loss = -(y * log_p + (1 - y) * log_not).mean()
    return loss, float(log_p.detach().exp().mean())


def fit_head(head: AcceptanceHead, optimizer: torch.optim.Optimizer, examples: list[HeadExample],
             steps: int = STEPS) -> tuple[float, float]:
    """`steps` updates of the head on these turns (the loss: the mean over turns,
    so each turn weighs the same). Returns the loss and the mean predicted chance
    before the first update."""
    before = (0.0, 0.0)
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        losses, predicted = zip(*(head_loss(head, e) for e in examples))
        loss = torch.stack(losses).mean()
        loss.backward()
        optimizer.step()
        if step == 0:
            before = (float(loss.detach()), sum(predicted) / len(examples))
    return before
