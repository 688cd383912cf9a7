"""Adaptive drafting (OMNIDRAFT.md §3): a small head that predicts, from the
drafter's state, whether the target will accept the token the drafter is about
to propose; drafting stops once 1 − Π P_i > γ.

One head per target, learned online with the drafter's adapter from the same
replay samples, teacher-forced: at every reply position of a served turn the
drafter's top token either is the next token of the accepted text or is not,
which is exactly what greedy verification decides for a drafted token whose
predecessors were accepted ("P(accept | previous accepted)").

The head is logistic regression over the drafter's final hidden state (divided
by its RMS, so the drafting path's int8 numbers and the learner's bf16 ones
look alike) plus three numbers of its next-token distribution: the top
probability, its log and the gap to the runner-up. Those make the untrained
head's job easy (the top probability alone is the old stopping rule); the
hidden state lets it learn where *this* target disagrees with the drafter. It
is trained with plain (unweighted) BCE: the stopping rule multiplies the
predictions, so they must be calibrated probabilities, which class weights
would distort. The paper's soft label min(1, p/q') matters for sampling; greedy
verification's label is the hard one used here.

The head is cheap: a dot product per drafted token, and a few hundred Adam
iterations over a few thousand examples per learner step (milliseconds).
Its training examples are kept in memory only; the weights are saved with the
target's adapter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

EXTRA_FEATURES = 3  # top probability, its log, gap to the second
MIN_EXAMPLES = 1000  # labelled positions before the head replaces the drafter's confidence
MAX_EXAMPLES = 8192  # the most recent positions the head is fitted on
ITERATIONS = 40  # Adam iterations over those per learner step
LR = 1e-2


def features(hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """[n, H + 3] float32 features of n positions (hidden [n, H], logits [n, V])."""
    h = hidden.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    top2 = torch.softmax(logits.float(), -1).topk(2, dim=-1).values
    top = top2[:, :1]
    return torch.cat([h, top, top.clamp_min(1e-6).log(), top - top2[:, 1:]], dim=-1)


class AcceptanceHead:
    def __init__(self, hidden_size: int):
        self.hidden_size = hidden_size
        self.linear = torch.nn.Linear(hidden_size + EXTRA_FEATURES, 1)
        with torch.no_grad():  # starts as "the drafter's confidence", roughly
            self.linear.weight.zero_()
            self.linear.bias.zero_()
            self.linear.weight[0, hidden_size + 1] = 1.0  # log top probability
        self.examples = 0  # labelled positions ever trained on
        self._x = torch.empty(0, hidden_size + EXTRA_FEATURES)
        self._y = torch.empty(0)
        self._optimizer = torch.optim.Adam(self.linear.parameters(), lr=LR)

    @property
    def ready(self) -> bool:
        return self.examples >= MIN_EXAMPLES

    @torch.no_grad()
    def prob(self, hidden: torch.Tensor, logits: torch.Tensor) -> float:
        """P(accept) of the top token of one position (hidden [H], logits [V])."""
        x = features(hidden.view(1, -1), logits.view(1, -1))
        return float(torch.sigmoid(self.linear(x)))

    @torch.no_grad()
    def probs(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.linear(x)).view(-1)

    def learn(self, x: torch.Tensor, y: torch.Tensor, check=lambda: None) -> float | None:
        """Add labelled positions (x from features(), y 1.0 = accepted) and refit on
        the most recent ones; check() between iterations may raise to stop (the
        weights stay valid, they are only partly refitted). Returns the BCE."""
        if len(y):
            self._x = torch.cat([self._x, x.detach().float()])[-MAX_EXAMPLES:]
            self._y = torch.cat([self._y, y.detach().float()])[-MAX_EXAMPLES:]
            self.examples += len(y)
        if not len(self._y):
            return None
        loss = None
        for _ in range(ITERATIONS):
            check()
            self._optimizer.zero_grad()
            loss = F.binary_cross_entropy_with_logits(self.linear(self._x).view(-1), self._y)
            loss.backward()
            self._optimizer.step()
        return float(loss)

    # ------------------------------------------------------------ persistence
    def state(self) -> dict[str, torch.Tensor]:
        return {
            "weight": self.linear.weight.detach().clone(),
            "bias": self.linear.bias.detach().clone(),
            "examples": torch.tensor([self.examples]),
        }

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor], hidden_size: int) -> AcceptanceHead:
        """Raises ValueError for a state of another shape (another drafter)."""
        head = cls(hidden_size)
        weight, bias = state.get("weight"), state.get("bias")
        if weight is None or bias is None or weight.shape != head.linear.weight.shape or bias.shape != (1,):
            raise ValueError("the acceptance head does not fit this drafter")
        with torch.no_grad():
            head.linear.weight.copy_(weight)
            head.linear.bias.copy_(bias)
        head.examples = int(state.get("examples", torch.tensor([0]))[0])
        return head
