"""Online hybrid distillation of the drafter toward one target (docs/method.md §2).

Schedule (the paper's, with experience replay): served turns collect in the
replay buffer; a round trains once on every turn not learned yet and on
`reviews` times as many turns learned before, drawn at random from those the
buffer still holds, in batches of 8 (one AdamW step per batch; new turns
first). A turn stays in the buffer after its first pass, marked learned, until
the buffer's cap drops it. So the adapter keeps what all recent turns teach
instead of what the last few do: passes over a batch back to back taught it
less for the same learner time (docs/learning.md). With reviews = 0 (the
paper's schedule) a round's turns leave the buffer at its end.
Each sample costs one target forward (no grad: its logits are recomputed, not
stored) and one drafter forward + backward through the target's LoRA adapter.
The same forwards train the target's acceptance head (core/learning/acceptance_head.py)
on the drafter's hidden states, with its own optimizer, on a turn's first pass
only (as a new turn would be drafted); it is saved with the adapter.

Training runs while the user is idle and must give way at once when a request
arrives: should_stop() is checked between samples and, through hooks on every
decoder layer of both models, inside the forward and backward passes. An
interrupted step changes no parameter. The samples it finished keep their
gradients (_Partial): the next step on the same batch starts at the sample that
was cut off, so idle windows shorter than a step still add up to steps. The cut
sample's partial backward is discarded.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..decoding.vocab_bridge import VocabBridge
from ..kernels.build import cpu_flags
from ..stopping import ShouldStop, never
from ..storage.persistence import save_failure
from .acceptance_head import LR as HEAD_LR
from .acceptance_head import AcceptanceHead, HeadExample, fit_head, head_example, segment_labels
from .adapters import AdapterStore
from .distillation import LAMBDA, clip_sample, hybrid_loss
from .replay_buffer import ReplayBuffer, Sample

Check = Callable[[], None]  # raises _Interrupted when a request is waiting


# CPU flags with which torch multiplies bf16 natively (AVX-512 BF16, AMX).
NATIVE_BF16 = frozenset({"avx512_bf16", "amx_bf16"})


def training_dtype(flags: frozenset[str] | None = None) -> torch.dtype:
    """The dtype the drafter trains in (its HF copy; drafting runs its own 4-bit
    weights): bf16 where the CPU multiplies bf16 natively, else float32. Elsewhere
    torch emulates bf16 products and their backward: on a Zen 3 (AVX2) one LoRA
    forward and backward of SmolLM2-135M over 256 tokens took 6.2 + 32 s in bf16
    against 1.1 + 1.2 s in float32 (git show 524cea4:scripts/training_dtype.py), a learner step
    348 s against ~60, so an idle user's minutes could not finish one."""
    return torch.bfloat16 if (cpu_flags() if flags is None else flags) & NATIVE_BF16 else torch.float32


@dataclass
class LearningStatus:
    """Where learning for one target stands after an idle step (the worker sends
    it on as its LearningProgress event)."""

    model_id: str
    state: str  # "running" (a step trained), "waiting" (gave way to a request), "idle" (nothing to learn)
    steps: int = 0
    samples: int = 0
    loss: float | None = None
    acceptance: float | None = None
    buffered: int = 0


class _Interrupted(Exception):
    """should_stop() said yes in the middle of a step."""


@dataclass
class _Partial:
    """An interrupted step's finished work: its batch (seqs), how many of its samples
    were done, the adapter's summed gradients after them and the running totals."""

    seqs: list[int]
    done: int
    grads: list[torch.Tensor | None]
    totals: dict


class Learner:
    def __init__(
        self,
        drafter_model,
        target_model,
        bridge: VocabBridge,
        buffer: ReplayBuffer,
        adapters: AdapterStore,
        target_id: str,
        lr: float = 1e-4,
        weight_decay: float = 0.01,
        batch_size: int = 8,
        lam: float = LAMBDA,
        threads: int = 1,
        reviews: int = 0,
        max_prompt_tokens: int = 1024,
        max_reply_tokens: int = 256,
        head: AcceptanceHead | None = None,
    ):
        if drafter_model is not adapters.base_model:
            raise ValueError("the learner trains the drafter the AdapterStore wraps")
        self.drafter_model = drafter_model
        self.target_model = target_model
        self.bridge = bridge
        self.buffer = buffer
        self.adapters = adapters
        self.target_id = target_id
        self.lr, self.weight_decay = lr, weight_decay
        self.batch_size, self.lam, self.threads = batch_size, lam, threads
        self.reviews = max(0, reviews)
        # Bound one sample's cost (and the 262k-wide target logits' memory).
        self.max_prompt_tokens, self.max_reply_tokens = max_prompt_tokens, max_reply_tokens
        saved = adapters.meta(target_id)
        self.steps = int(saved.get("steps", 0))  # optimizer steps ever, for this target
        self.samples = int(saved.get("samples", 0))  # samples ever trained on
        self.updates = 0  # optimizer steps in this session (tests watch it)
        self.warnings: list[str] = []
        self._optimizer: torch.optim.AdamW | None = None
        self.head = head  # the target's acceptance head (None: not trained)
        self._head_optimizer: torch.optim.AdamW | None = None
        self._round: list[int] = []  # seqs the current round has still to train, in order
        self._rng = random.Random(0)  # which learned turns a round replays
        self._partial: _Partial | None = None  # an interrupted step's finished samples

    # ------------------------------------------------------------ training
    def step(self, should_stop: ShouldStop = never) -> dict | None:
        """Train on up to batch_size samples of the current round; one optimizer step.

        Returns progress ({steps, samples, loss, dm, ngram, acceptance_estimate,
        greedy_match, head_loss, head_predicted, head_observed, buffered,
        pass_done (the round's end), interrupted}; the loss terms and acceptance figures are this
        batch's, measured before its update; head_predicted / head_observed: the
        acceptance head's mean predicted chance and the mean label), or None
        when the buffer holds nothing to train on."""
        batch = self._next_batch()
        if not batch:
            return None
        first = {s.seq for s in self.buffer.new_samples()}  # the head learns from these
        model = self.adapters.activate(self.target_id)
        optimizer = self._optimizer_for_adapter()
        head_optimizer = self._optimizer_for_head()
        threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        check = _checker(should_stop)
        hooks = _stop_hooks(self.drafter_model, check) + _stop_hooks(self.target_model, check)
        params = self.adapters.parameters(self.target_id)
        partial = self._partial if self._partial and self._partial.seqs == [s.seq for s in batch] else None
        self._partial = None
        try:
            _zero(optimizer, head_optimizer)
            if partial:  # go on from the sample an earlier step was cut off at
                for p, grad in zip(params, partial.grads, strict=True):
                    p.grad = grad
            totals = self._accumulate(model, batch, first, check, partial)
            if totals["used"]:
                for p in params:
                    if p.grad is not None:
                        p.grad /= totals["used"]  # the batch mean of the per-sample losses
                optimizer.step()
                self.steps += 1
                self.updates += 1
            # Not interruptible (a few milliseconds, no model forward): the adapter has stepped.
            head_stats = self._train_head(totals["head_examples"], head_optimizer)
        except _Interrupted:
            _zero(optimizer, head_optimizer)
            return {**self.progress(), "interrupted": True, "pass_done": False}
        finally:
            for h in hooks:
                h.remove()
            torch.set_num_threads(threads)
        _zero(optimizer, head_optimizer)
        self._partial = None
        self.samples += len(batch)
        self.buffer.mark_learned({s.seq for s in batch})
        self._round = self._round[len(batch):]
        pass_done = not self._round
        if pass_done:
            self._finish_round()
        return {**self.progress(), **_means(totals), **head_stats, "interrupted": False, "pass_done": pass_done}

    def _accumulate(self, model, batch: list[Sample], first: set[int], check: Check,
                    partial: _Partial | None = None) -> dict:
        """Backward of each sample's loss (so only one graph is alive at a time),
        from where `partial` left off. After each sample its work is kept
        (self._partial) for a step that is cut off in a later one."""
        totals = partial.totals if partial else {  # a partial is used once: its totals go on here
            "used": 0, "loss": 0.0, "dm": 0.0, "ngram": 0.0, "n_dm": 0, "n_ngram": 0,
            "acceptance_estimate": 0.0, "greedy_match": 0.0, "head_examples": []}
        start = partial.done if partial else 0
        for done, sample in enumerate(batch[start:], start + 1):
            if done > 1:
                self._keep(batch, done - 1, totals)
            check()
            fwd = self.forward(model, sample, check)
            if fwd is None:
                continue
            s, d_logits, t_logits, hidden, d_offset, t_offset = fwd
            loss, stats = hybrid_loss(d_logits, t_logits, s, self.bridge, self.lam, d_offset, t_offset, check)
            if stats["n_dm"] + stats["n_ngram"] == 0:
                continue  # nothing aligned (e.g. an empty reply): nothing to learn
            check()
            totals["used"] += 1
            totals["loss"] += float(loss.detach())
            loss.backward()
            # The head learns from a turn's first pass only: replays label drafts
            # of text the adapter has trained on, which the drafter would accept
            # more often than it does on a new turn (docs/learning.md).
            if self.head is not None and hidden is not None and sample.seq in first:
                rows_of, labels = segment_labels(s, self.bridge, d_logits, t_logits, d_offset, t_offset)
                if labels:
                    totals["head_examples"].append(head_example(hidden, d_logits, s.temperature, rows_of, labels))
            if stats["n_dm"]:  # per-sample means, over the samples that have the term
                totals["n_dm"] += 1
                totals["dm"] += stats["dm"]
                totals["acceptance_estimate"] += stats["acceptance_estimate"]
                totals["greedy_match"] += stats["greedy_match"]
            if stats["n_ngram"]:
                totals["n_ngram"] += 1
                totals["ngram"] += stats["ngram"]
        return totals

    def _keep(self, batch: list[Sample], done: int, totals: dict) -> None:
        """The first `done` samples' gradients and totals, for a step cut off after them
        (a few MB: the adapter's low-rank weights)."""
        grads = [None if p.grad is None else p.grad.clone() for p in self.adapters.parameters(self.target_id)]
        self._partial = _Partial([s.seq for s in batch], done, grads,
                                 dict(totals, head_examples=list(totals["head_examples"])))

    def _train_head(self, examples: list[HeadExample], optimizer) -> dict:
        """acceptance_head.STEPS updates of the acceptance head on this batch's turns (its loss:
        the mean over turns, so each turn weighs the same). Returns the figures
        before the first update: head_loss, head_predicted, head_observed."""
        if not examples:
            return {}
        loss, predicted = fit_head(self.head, optimizer, examples)
        self.head.labels_seen += sum(e.labels.numel() for e in examples)
        return {"head_loss": loss, "head_predicted": predicted,
                "head_observed": sum(float(e.labels.mean()) for e in examples) / len(examples)}

    def sample_loss(self, model, sample: Sample, check: Check = lambda: None) -> tuple[torch.Tensor, dict]:
        """The hybrid loss of one (clipped) sample (see forward)."""
        fwd = self.forward(model, sample, check)
        if fwd is None:
            empty = torch.zeros((), requires_grad=True)
            return empty, {"dm": 0.0, "ngram": 0.0, "n_dm": 0, "n_ngram": 0,
                           "acceptance_estimate": None, "greedy_match": None}
        s, d_logits, t_logits, _, d_offset, t_offset = fwd
        return hybrid_loss(d_logits, t_logits, s, self.bridge, self.lam, d_offset, t_offset, check)

    def forward(self, model, sample: Sample, check: Check = lambda: None):
        """Target forward without grad, drafter forward with grad, logits only from
        the last prompt position on: (clipped sample, drafter logits, target
        logits, the drafter's final hidden states beside its logits, their
        offsets), or None when the sample has nothing to learn from. check() is
        called between the phases (it raises to interrupt)."""
        s = clip_sample(sample, self.bridge, self.max_prompt_tokens, self.max_reply_tokens)
        t_keep, t_offset = _kept_rows(len(s.target_ids), s.target_prompt_len)
        d_keep, d_offset = _kept_rows(len(s.drafter_ids), s.drafter_prompt_len)
        if (not s.target_reply or not s.drafter_reply or t_keep == 0 or d_keep == 0
                or not _in_vocab(s.target_ids, self.target_model)
                or not _in_vocab(s.drafter_ids, self.drafter_model)):
            return None
        with torch.no_grad():
            t_logits = self.target_model(
                input_ids=torch.tensor([s.target_ids]), use_cache=False, logits_to_keep=t_keep
            ).logits[0]
        check()
        hidden = []  # what the LM head reads: the final (normed) hidden states of the kept rows
        hook = self.drafter_model.get_output_embeddings().register_forward_pre_hook(
            lambda module, args: hidden.append(args[0][0].detach()))
        length, keep = _shape_steps(len(s.drafter_ids), d_keep)
        # Right padding: causal attention keeps it out of every real position.
        ids = s.drafter_ids + [s.drafter_ids[-1]] * (length - len(s.drafter_ids))
        first = d_offset - (length - keep)  # the row of position d_offset among the kept ones
        try:
            d_logits = model(input_ids=torch.tensor([ids]), use_cache=False, logits_to_keep=keep).logits[0]
        finally:
            hook.remove()
        d_logits = d_logits[first:first + d_keep]
        hidden = torch.cat(hidden)[first:first + d_keep] if hidden else None
        check()
        return s, d_logits, t_logits, hidden, d_offset, t_offset

    # ------------------------------------------------------------ rounds
    def _next_batch(self) -> list[Sample]:
        live = {s.seq: s for s in self.buffer.samples()}
        # The buffer is bounded: new turns may have pushed some of the round out.
        self._round = [seq for seq in self._round if seq in live]
        if not self._round:
            self._round = self._new_round()
        return [live[seq] for seq in self._round[: self.batch_size]]

    def _new_round(self) -> list[int]:
        """The turns not learned yet, then `reviews` times as many learned ones at
        random (each at most once); empty when no turn is new."""
        new = [s.seq for s in self.buffer.new_samples()]
        if not new:
            return []
        learned = [s.seq for s in self.buffer.learned_samples()]
        return new + self._rng.sample(learned, min(self.reviews * len(new), len(learned)))

    def work_left(self) -> int:
        """Samples to train before the learner rests: the round's rest and new turns."""
        live = {s.seq for s in self.buffer.samples()}
        return len({seq for seq in self._round if seq in live} | {s.seq for s in self.buffer.new_samples()})

    def _finish_round(self) -> None:
        """Save: the adapter first, so a crash in between retrains some samples
        rather than losing what they taught. Without replay nothing needs the
        learned turns any more."""
        if not self.reviews:
            self.buffer.remove({s.seq for s in self.buffer.learned_samples()})
        try:
            self.adapters.save(self.target_id, {"steps": self.steps, "samples": self.samples},
                               head=self.head.state() if self.head is not None else None)
            self.buffer.save()
        except OSError as exc:  # a full disk: a sentence naming the space, the last saved copy kept
            self.warnings.append(save_failure("what the drafter learned", self.adapters.root, exc,
                                              self._adapter_bytes()))

    def _adapter_bytes(self) -> int:
        """About what the adapter's files take: its trainable weights."""
        peft = getattr(self.adapters, "peft", None)
        return sum(p.numel() * p.element_size() for p in peft.parameters() if p.requires_grad) if peft else 0

    def progress(self) -> dict:
        return {"steps": self.steps, "samples": self.samples, "buffered": self.work_left()}

    # ------------------------------------------------------------ optimizer
    def _optimizer_for_adapter(self) -> torch.optim.AdamW:
        """One AdamW per target, rebuilt only if the adapter was reset (new tensors)."""
        params = self.adapters.parameters(self.target_id)
        current = self._optimizer.param_groups[0]["params"] if self._optimizer else []
        if len(current) != len(params) or any(a is not b for a, b in zip(current, params)):
            self._optimizer = torch.optim.AdamW(
                params, lr=self.lr, betas=(0.9, 0.999), weight_decay=self.weight_decay
            )
        return self._optimizer

    def _optimizer_for_head(self) -> torch.optim.AdamW | None:
        """The head's own AdamW (its parameters are few and its lr higher)."""
        if self.head is None:
            return None
        current = self._head_optimizer.param_groups[0]["params"] if self._head_optimizer else []
        if not current or current[0] is not next(self.head.parameters()):
            self._head_optimizer = torch.optim.AdamW(self.head.parameters(), lr=HEAD_LR, weight_decay=0.0)
        return self._head_optimizer

    def snapshot(self) -> dict[str, torch.Tensor]:
        return self.adapters.lora_state(self.target_id)

    def lora_params_changed(self, snapshot: dict[str, torch.Tensor]) -> bool:
        """Whether the adapter's weights differ from an earlier snapshot()."""
        now = self.adapters.lora_state(self.target_id)
        return now.keys() != snapshot.keys() or any(
            not torch.equal(now[k], snapshot[k]) for k in now
        )


def _in_vocab(ids: list[int], model) -> bool:
    """A sample saved for another model must not crash (or block) the learner."""
    return max(ids, default=0) < model.get_input_embeddings().num_embeddings


# oneDNN, which runs the drafter's bf16 training matmuls on CPU, keeps what it
# builds for every shape it meets and never frees it: a learner fed replies of
# every length grew the worker by ~8 MiB per new length (git show 524cea4:scripts/memory_shapes.py).
# The drafter's sequence and its kept logits rows are padded to multiples of this,
# so it meets a few dozen shapes at most.
SHAPE_STEP = 32


def _shape_steps(length: int, keep: int) -> tuple[int, int]:
    """(padded length, padded rows kept) for a drafter forward of `length` tokens
    whose last `keep` rows are needed: the padded kept rows still cover them."""
    padded = -(-length // SHAPE_STEP) * SHAPE_STEP
    rows = keep + padded - length
    return padded, min(padded, -(-rows // SHAPE_STEP) * SHAPE_STEP)


def _kept_rows(length: int, prompt_len: int) -> tuple[int, int]:
    """(how many last logits rows to compute, the position of the first): from the
    last prompt position, which predicts the first reply token."""
    keep = min(length, length - prompt_len + 1)
    return keep, length - keep


def _means(totals: dict) -> dict:
    def mean(key: str, count: str) -> float | None:
        return totals[key] / totals[count] if totals[count] else None

    return {
        "loss": mean("loss", "used"),
        "dm": mean("dm", "n_dm"),
        "ngram": mean("ngram", "n_ngram"),
        "acceptance_estimate": mean("acceptance_estimate", "n_dm"),
        "greedy_match": mean("greedy_match", "n_dm"),
    }


def _zero(*optimizers) -> None:
    for optimizer in optimizers:
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)


def _checker(should_stop: ShouldStop) -> Check:
    def check() -> None:
        if should_stop():
            raise _Interrupted

    return check


def _stop_hooks(model, check: Check) -> list:
    """Forward hooks on every decoder layer, and on every part of one, that call
    check(), and, on layer outputs that carry grad, backward hooks that do the same;
    the LM head computed in slices of rows with a check between them (Gemma's 262k-word head over a
    reply is ~0.2 s on one core). So neither a long forward nor a long backward
    delays a request. Returns handles with remove()."""

    def check_grad(grad):
        check()
        return grad

    def after_layer(module, args, output):
        check()
        hidden = output[0] if isinstance(output, tuple) else output
        if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
            hidden.register_hook(check_grad)

    def after_part(module, args, output):
        check()

    layers = _decoder_layers(model)
    handles = [layer.register_forward_hook(after_layer) for layer in layers]
    # And after every part of a layer (each projection, norm, activation): one
    # projection over a long prompt takes ~0.1 s on one core, a whole target layer
    # several times that, more than a reply may wait for learning.
    handles += [part.register_forward_hook(after_part) for layer in layers
                for part in layer.modules() if part is not layer and next(part.children(), None) is None]
    head = model.get_output_embeddings()
    if type(head) is torch.nn.Linear:  # exactly F.linear, so slicing the rows changes nothing
        handles.append(_SlicedHead(head, check, check_grad))
    return handles


class _SlicedHead:
    ROWS = 16

    def __init__(self, head: torch.nn.Linear, check: Check, check_grad):
        self.head = head

        def forward(x: torch.Tensor) -> torch.Tensor:
            parts = []
            for rows in x.split(self.ROWS, dim=-2):
                check()
                part = F.linear(rows, head.weight, head.bias)
                if part.requires_grad:
                    part.register_hook(check_grad)
                parts.append(part)
            return torch.cat(parts, dim=-2)

        head.forward = forward  # an instance attribute shadows Linear.forward

    def remove(self) -> None:
        vars(self.head).pop("forward", None)


def _decoder_layers(model) -> torch.nn.ModuleList:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    return decoder.layers
