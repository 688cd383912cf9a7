"""What a decode loop yields. Plain and speculative decoding yield the same
events, so the worker and the GUI never care which one ran."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenChunk:
    text: str
    drafted: bool = False  # True when this text came from accepted draft tokens


@dataclass
class TurnStats:
    method: str  # "target" (plain) or "omnidraft"
    new_tokens: int = 0
    seconds: float = 0.0
    prompt_tokens: int = 0
    steps: int = 0  # target forwards after the prompt
    proposed: int = 0  # target-space draft tokens offered for verification
    accepted: int = 0
    ngram_hits: int = 0  # proposals that came from merging through the n-gram cache
    lookup_steps: int = 0  # steps whose proposals came from prompt lookup (the rest: the drafter)
    lookup_proposed: int = 0
    lookup_accepted: int = 0
    draft_seconds: float = 0.0
    # Of draft_seconds, the drafter's one read of the prompt: a cost of the reply
    # (plain decoding has none), not of the steps it is spread over.
    drafter_prompt_seconds: float = 0.0
    verify_seconds: float = 0.0
    # From the request to the first reply token picked: the prompt's read (prefill).
    # The rest of `seconds` is decoding proper, what drafting speeds up.
    first_token_seconds: float = 0.0
    # Drafter proposals merged from several drafter tokens, or sharing one (n-gram).
    ngram_proposed: int = 0
    ngram_accepted: int = 0
    # Drafter proposals verified with everything before them accepted, the stop
    # rule's predicted chance of acceptance summed over them (the acceptance head's,
    # or the drafter's confidence; as calibrated online, and before), and how many
    # were accepted: its calibration.
    chance_checked: int = 0
    chance_sum: float = 0.0
    chance_raw_sum: float = 0.0
    chance_accepted: int = 0
    # What plain decoding would have taken for this reply here (the engine's
    # estimate: the same prompt read, then its measured step for each later token);
    # 0 until the target's plain step was measured. The app's speedup for the reply.
    plain_seconds: float = 0.0

    @property
    def speedup(self) -> float | None:
        return self.plain_seconds / self.seconds if self.plain_seconds > 0 and self.seconds > 0 else None

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.proposed if self.proposed else None

    @property
    def tokens_per_step(self) -> float | None:
        return self.new_tokens / self.steps if self.steps else None

    def add_drafted(self, chances: list[float], raw: list[float], merged: list[bool], accepted: int) -> None:
        """Count one drafter step's proposals (their predicted chances, calibrated and
        raw; which were n-gram merges) of which the first `accepted` were accepted."""
        reached = min(len(chances), accepted + 1)  # a proposal after a rejection is never judged
        self.chance_checked += reached
        self.chance_sum += sum(chances[:reached])
        self.chance_raw_sum += sum(raw[:reached])
        self.chance_accepted += accepted
        self.ngram_proposed += sum(merged)
        self.ngram_accepted += sum(merged[:accepted])

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d.update(
            tokens_per_s=self.tokens_per_s,
            acceptance_rate=self.acceptance_rate,
            tokens_per_step=self.tokens_per_step,
            speedup=self.speedup,
        )
        return d


@dataclass
class TurnFinished:
    text: str
    reason: str  # "eos", "stop", "length" or "cancelled"
    stats: TurnStats
    token_ids: list[int] = field(default_factory=list)
    # The oldest messages of the conversation the model did not read (they no
    # longer fit its context), so the GUI can say so.
    omitted_messages: int = 0
