"""Online distillation in the app (docs/method.md §2): served turns become replay
samples, and in idle time the current target's learner trains a batch at a time,
giving way to a request; what a round learned is merged into the drafting weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .learner import Learner, LearningStatus
from .replay_buffer import Sample

if TYPE_CHECKING:
    from ..decoding.drafter import Drafter
    from ..decoding.vocab_bridge import VocabBridge
    from ..events import TurnFinished
    from ..models.loader import LoadedModel
    from ..stopping import ShouldStop
    from .acceptance_head import AcceptanceHead
    from .adapters import AdapterStore
    from .replay_buffer import ReplayBuffer


@dataclass
class LearnSettings:
    """Online distillation (docs/method.md §2): the paper's settings except lr and
    the replay of learned turns, chosen by tools/learning_sweep.py
    (docs/learning.md): lr 5e-4; three learned turns replayed per new one taught
    the default target's drafter as much as four epochs over all turns, where
    four passes over each batch back to back taught less."""

    enabled: bool = True
    lr: float = 5e-4
    weight_decay: float = 0.01
    batch_size: int = 8
    lam: float = 0.2  # weight of the n-gram NLL against the reverse KL
    rank: int = 32
    threads: int = 1  # the learner leaves a core to the GUI
    reviews: int = 3  # learned turns replayed per new turn (core/learning/learner.py)
    buffer_size: int = 256


def turn_sample(ids: list[int], drafter_prefix: list[int], done: TurnFinished, bridge: VocabBridge,
                drafter_tokenizer, temperature: float = 0.0, draw_drafts: bool = True) -> Sample:
    """A finished turn as a replay sample: prompt + reply in both vocabularies
    (the drafter's reply is its own tokenization of the reply's text)."""
    reply = done.token_ids
    if bridge.same_vocab:
        drafter_reply = list(reply)
    else:
        text = bridge.target_text(reply)
        drafter_reply = drafter_tokenizer(text, add_special_tokens=False)["input_ids"]
    return Sample(
        target_ids=list(ids) + list(reply), target_prompt_len=len(ids),
        drafter_ids=list(drafter_prefix) + drafter_reply, drafter_prompt_len=len(drafter_prefix),
        proposed=done.stats.proposed, accepted=done.stats.accepted, temperature=temperature,
        drawn=temperature > 0 and draw_drafts,
    )


class OnlineLearning:
    """Each target's learner (its optimizer state outlives a switch away and back)
    and the idle steps that run the current one."""

    def __init__(self, settings: LearnSettings):
        self.settings = settings
        self.learners: dict[str, Learner] = {}
        # The drafter lacks the current target's latest learned weights (a refresh
        # was interrupted by a request).
        self.drafter_stale = False

    def learner(self, target: LoadedModel, drafter_model: LoadedModel, bridge: VocabBridge,
                buffer: ReplayBuffer, adapters: AdapterStore, head: AcceptanceHead) -> Learner:
        """The target's learner, bound to the target, bridge and buffer given
        (`head` is the one a new learner trains)."""
        target_id = target.entry.id
        if target_id not in self.learners:
            s = self.settings
            self.learners[target_id] = Learner(
                drafter_model.model, target.model, bridge, buffer, adapters, target_id, lr=s.lr,
                weight_decay=s.weight_decay, batch_size=s.batch_size, lam=s.lam, threads=s.threads,
                reviews=s.reviews, head=head,
            )
        learner = self.learners[target_id]
        learner.target_model, learner.bridge, learner.buffer = target.model, bridge, buffer
        return learner

    def has_work(self, target_id: str | None, buffer: ReplayBuffer | None) -> bool:
        """Samples of `buffer` to train for the target, or learned weights to merge."""
        return bool(self.settings.enabled and buffer is not None
                    and (self._work_left(target_id, buffer) or self.drafter_stale))

    def _work_left(self, target_id: str | None, buffer: ReplayBuffer) -> int:
        """Samples the target's learner has to train before it rests."""
        learner = self.learners.get(target_id) if target_id is not None else None
        if learner is None or learner.buffer is not buffer:  # its round was of another buffer
            return len(buffer.new_samples())
        return learner.work_left()

    def _refresh_drafter(self, drafter: Drafter, adapters: AdapterStore, target_id: str,
                         should_stop: ShouldStop) -> bool:
        """Merge the target's adapter into the drafting weights (~1 s on one core),
        giving way to a request between layers: the reply then drafts with the
        previous weights and the next idle step finishes the refresh."""
        weights = adapters.low_rank_state(target_id, should_stop)
        if weights is None or not drafter.load_adapter(weights, should_stop):
            return False
        self.drafter_stale = False
        return True

    def step(self, learner: Learner, drafter: Drafter, adapters: AdapterStore,
             should_stop: ShouldStop) -> LearningStatus:
        """One batch of `learner`'s round; returns at the next layer boundary once
        should_stop() says a request is waiting."""
        target_id = learner.target_id
        if self.drafter_stale and not self._refresh_drafter(drafter, adapters, target_id, should_stop):
            return LearningStatus(target_id, "waiting", learner.steps, learner.samples,
                                  buffered=learner.work_left())
        out = learner.step(should_stop) if learner.work_left() else None
        if out is None:  # nothing (left) to train on
            return LearningStatus(target_id, "idle", learner.steps, learner.samples, buffered=0)
        if out["interrupted"]:
            return LearningStatus(target_id, "waiting", out["steps"], out["samples"], buffered=out["buffered"])
        if out["pass_done"]:  # what was learned starts drafting now
            self.drafter_stale = True
            self._refresh_drafter(drafter, adapters, target_id, should_stop)
        return LearningStatus(
            target_id, "running", out["steps"], out["samples"], out.get("loss"),
            out.get("acceptance_estimate"), out["buffered"],
        )

    def unbind_targets(self) -> None:
        """A new target loaded: no learner keeps the old model alive (learner() rebinds)."""
        for learner in self.learners.values():
            learner.target_model = None

    def set_threads(self, threads: int) -> None:
        self.settings.threads = threads
        for learner in self.learners.values():
            learner.threads = threads

    def forget(self, target_id: str) -> None:
        self.learners.pop(target_id, None)
