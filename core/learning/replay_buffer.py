"""The learner's replay buffer: recent (prompt, reply) turns for one target.

OMNIDRAFT.md section 2: every served turn is appended; every I prompts the
learner makes one pass over the buffer and clears it. The samples are the
user's own conversation (token ids decode straight back to text), so the file
is encrypted with core.storage.secure_store and written atomically. Bounded: when full
the oldest sample is dropped. A damaged file never stops the app: it is moved
aside and an empty buffer is used, with `warning` saying so.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ..storage.persistence import CorruptStateError
from ..storage.secure_store import KeyStore, KeyUnavailableError, load_encrypted, save_encrypted

FORMAT_VERSION = 1
# Fields added after the format's first version, with what older samples get.
OPTIONAL = {"temperature": 0.0}


@dataclass
class Sample:
    """One served turn, in both vocabularies."""

    target_ids: list[int]  # target prompt + reply
    target_prompt_len: int
    # The drafter's own prompt prefix + the drafter's tokenization of the reply text.
    drafter_ids: list[int]
    drafter_prompt_len: int
    proposed: int = 0  # the turn's speculative stats
    accepted: int = 0
    # The turn's sampling temperature (0: greedy), which decides how its verification
    # accepted drafts (the acceptance head's labels). Buffers saved before it was
    # recorded load with 0, the app's default.
    temperature: float = 0.0
    # Assigned by the buffer: a number no other sample of this buffer ever had, so
    # the learner can tell which samples a pass has already trained on.
    seq: int = -1

    @property
    def target_reply(self) -> list[int]:
        return self.target_ids[self.target_prompt_len :]

    @property
    def drafter_reply(self) -> list[int]:
        return self.drafter_ids[self.drafter_prompt_len :]

    @classmethod
    def from_dict(cls, raw: object, path: Path) -> Sample:
        """Checked construction; CorruptStateError says what is wrong."""
        if not isinstance(raw, dict):
            raise CorruptStateError(path, "a sample is not a record")
        try:
            values = {f.name: raw[f.name] for f in fields(cls) if f.name not in OPTIONAL}
        except KeyError as exc:
            raise CorruptStateError(path, f"a sample lacks {exc}") from exc
        values.update({name: raw.get(name, default) for name, default in OPTIONAL.items()})
        for name in ("target_ids", "drafter_ids"):
            ids = values[name]
            if not isinstance(ids, list) or not all(type(i) is int and i >= 0 for i in ids):
                raise CorruptStateError(path, f"a sample's {name} are not token ids")
        for name in ("target_prompt_len", "drafter_prompt_len", "proposed", "accepted", "seq"):
            if type(values[name]) is not int:
                raise CorruptStateError(path, f"a sample's {name} is not an integer")
        t = values["temperature"]
        if type(t) not in (int, float) or not 0 <= t < float("inf"):
            raise CorruptStateError(path, "a sample's temperature is not a temperature")
        values["temperature"] = float(t)
        sample = cls(**values)
        if not 0 <= sample.target_prompt_len <= len(sample.target_ids) or not (
            0 <= sample.drafter_prompt_len <= len(sample.drafter_ids)
        ):
            raise CorruptStateError(path, "a sample's prompt length is out of range")
        return sample


class ReplayBuffer:
    def __init__(self, path: Path, max_samples: int = 256, keys: KeyStore | None = None):
        if max_samples < 1:
            raise ValueError("max_samples must be at least 1")
        self.path = Path(path)
        self.max_samples = max_samples
        self.keys = keys
        self._samples: deque[Sample] = deque(maxlen=max_samples)  # drops the oldest
        self.total_added = 0  # samples ever added, also the next sample's seq
        self.warning: str | None = None
        # False after the file turned out to be encrypted with a key we do not hold:
        # it is left untouched (the key may come back), so nothing is written over it.
        self.persist = True

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, sample: Sample) -> Sample:
        """Append (dropping the oldest when full); returns the sample with its seq."""
        if not 0 <= sample.target_prompt_len <= len(sample.target_ids):
            raise ValueError("target_prompt_len is out of range")
        if not 0 <= sample.drafter_prompt_len <= len(sample.drafter_ids):
            raise ValueError("drafter_prompt_len is out of range")
        sample.seq = self.total_added
        self.total_added += 1
        self._samples.append(sample)
        return sample

    def samples(self) -> list[Sample]:
        """Oldest first."""
        return list(self._samples)

    def remove(self, seqs: set[int]) -> None:
        """Drop the given samples (a finished pass), keeping any added meanwhile."""
        kept = [s for s in self._samples if s.seq not in seqs]
        self._samples.clear()
        self._samples.extend(kept)

    def clear(self) -> None:
        self._samples.clear()

    # ------------------------------------------------------------ persistence
    def save(self) -> None:
        if not self.persist:
            return
        save_encrypted(
            self.path,
            {
                "version": FORMAT_VERSION,
                "total_added": self.total_added,
                "samples": [asdict(s) for s in self._samples],
            },
            self.keys,
        )

    @classmethod
    def load(cls, path: Path, max_samples: int = 256, keys: KeyStore | None = None) -> ReplayBuffer:
        """The saved buffer; an empty one (with `warning`) when the file is unusable."""
        buffer = cls(path, max_samples, keys)
        try:
            raw = load_encrypted(buffer.path, None, keys)
            if raw is not None:
                buffer._restore(raw)
        except KeyUnavailableError:
            buffer._reset()
            buffer.persist = False
            buffer.warning = (
                f"The saved learning samples ({buffer.path.name}) were encrypted with a key "
                "that is not available now; they are left as they are and new ones are not "
                "saved this session."
            )
        except CorruptStateError as exc:
            buffer._reset()
            kept = exc.quarantine()
            buffer.warning = (
                f"The saved learning samples were damaged; learning starts over from new "
                f"samples (the damaged file was kept as {kept.name})."
            )
        return buffer

    def _restore(self, raw: object) -> None:
        if not isinstance(raw, dict) or not isinstance(raw.get("samples"), list):
            raise CorruptStateError(self.path, "not a replay buffer")
        total = raw.get("total_added")
        if type(total) is not int or total < 0:
            raise CorruptStateError(self.path, "the sample counter is not a count")
        samples = [Sample.from_dict(s, self.path) for s in raw["samples"]]
        self._samples.extend(samples)  # a smaller max_samples keeps the newest
        # Keep seqs unique even if the counter and samples disagree.
        self.total_added = max([total] + [s.seq + 1 for s in samples])

    def _reset(self) -> None:
        self._samples.clear()
        self.total_added = 0
