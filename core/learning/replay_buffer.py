"""The learner's replay buffer: recent (prompt, reply) turns for one target.

docs/method.md section 2: every served turn is appended; every I prompts the
learner makes one pass over the buffer and clears it. Ours keeps a turn after
its first pass, marked learned, for the learner to replay among newer ones
(core/learning/learner.py), until the cap drops it. The samples are the
user's own conversation (token ids decode straight back to text), so they are
encrypted with core.storage.secure_store. Bounded: when full the oldest sample
is dropped. A damaged file never stops the app: it is moved aside and an empty
buffer is used, with `warning` saying so.

The file is a log, so that saving after a reply costs that reply's sample, not
the whole buffer (at its cap with long chats, 31 MiB re-encrypted in 5-9 s,
which the reply waited for): LOG_MAGIC, then records, each a 4-byte length
and one encrypted JSON object: {"header": {version, total_added}} first, then
{"sample": {...}} for an added sample, {"learned": [seqs]} when the learner
has had its first pass over them and {"removed": [seqs]} when it dropped them.
Loading replays them into a buffer of the same cap. Each record is appended
and fsynced on its own; a record cut short by a kill is the log's
end and is dropped. Once the log holds twice what is live (samples dropped or
removed), save() rewrites it atomically from the live records' encrypted
bytes, kept from when they were made: no sample is serialised or encrypted
twice. Files of format 1 (one encrypted JSON of the whole buffer) load and
are rewritten as a log at the next save.
"""

from __future__ import annotations

import json
import struct
from collections import deque
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ..storage import paths
from ..storage.persistence import CorruptStateError, append_bytes, atomic_write_bytes
from ..storage.secure_store import (
    KeyStore,
    KeyUnavailableError,
    default_keystore,
    load_encrypted,
)

FORMAT_VERSION = 3  # 3: "learned" records
LOG_MAGIC = b"OMDLOG1\n"
_LENGTH = struct.Struct(">I")
# The log is rewritten when it holds more than twice the live records and this much.
COMPACT_FLOOR_BYTES = 1 << 20
# Fields added after the format's first version, with what older samples get.
OPTIONAL = {"temperature": 0.0, "drawn": None}


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
    # Whether its drafts were drawn from the drafter's distribution (sampling only;
    # DraftSettings.draw_drafts) rather than its most likely tokens: the head's labels
    # differ. Sampled turns saved before it was recorded were drawn.
    drawn: bool = False
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
        if values["drawn"] is None:
            values["drawn"] = values["temperature"] > 0
        if type(values["drawn"]) is not bool:
            raise CorruptStateError(path, "a sample's drawn is not true or false")
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
        self._records: dict[int, bytes] = {}  # seq -> the live sample's saved log record
        self._learned: set[int] = set()  # seqs of live samples the learner has had a pass over
        # What changed since the last save, in order: a Sample added, or ("removed" or
        # "learned", seqs) (made into records when saved, so a sample can still be amended).
        self._pending: list[Sample | tuple[str, list[int]]] = []
        self._log_bytes = 0  # the log's length on disk, as written or read
        # The next save writes the whole log: there is none yet, or it was cleared,
        # is of format 1, or ends in a record cut short.
        self._rewrite = True

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
        self._append(sample)
        if self.persist:
            self._pending.append(sample)
        return sample

    def samples(self) -> list[Sample]:
        """Oldest first."""
        return list(self._samples)

    def new_samples(self) -> list[Sample]:
        """The samples the learner has not had a pass over yet, oldest first."""
        return [s for s in self._samples if s.seq not in self._learned]

    def learned_samples(self) -> list[Sample]:
        """The samples kept after their first pass (for replay), oldest first."""
        return [s for s in self._samples if s.seq in self._learned]

    def mark_learned(self, seqs: set[int]) -> None:
        """The learner has had its first pass over these samples."""
        marked = [s.seq for s in self._samples if s.seq in seqs and s.seq not in self._learned]
        self._learned.update(marked)
        if marked and self.persist:
            self._pending.append(("learned", marked))

    def remove(self, seqs: set[int]) -> None:
        """Drop the given samples, keeping any added meanwhile."""
        gone = self._drop(seqs)
        if gone and self.persist:
            self._pending.append(("removed", gone))

    def clear(self) -> None:
        self._samples.clear()
        self._records.clear()
        self._learned.clear()
        self._pending.clear()
        self._rewrite = True

    def _append(self, sample: Sample) -> None:
        if len(self._samples) == self.max_samples:  # the deque drops the oldest
            self._records.pop(self._samples[0].seq, None)
            self._learned.discard(self._samples[0].seq)
        self._samples.append(sample)

    def _drop(self, seqs: set[int]) -> list[int]:
        gone = [s.seq for s in self._samples if s.seq in seqs]
        if gone:
            kept = [s for s in self._samples if s.seq not in seqs]
            self._samples.clear()
            self._samples.extend(kept)
            for seq in gone:
                self._records.pop(seq, None)
                self._learned.discard(seq)
        return gone

    # ------------------------------------------------------------ persistence
    def save(self) -> None:
        """Append what changed since the last save, or rewrite the log once it is
        mostly samples no longer live."""
        if not self.persist:
            return
        live_seqs = {s.seq for s in self._samples}
        new = [self._pending_record(change, live_seqs) for change in self._pending]
        self._pending.clear()
        live = sum(map(len, self._records.values()))
        grown = self._log_bytes + sum(map(len, new))
        if self._rewrite or grown > 2 * live + COMPACT_FLOOR_BYTES:
            self._write_log()
        elif new:
            append_bytes(self.path, b"".join(new))
            self._log_bytes = grown

    def _pending_record(self, change: Sample | tuple[str, list[int]], live_seqs: set[int]) -> bytes:
        if isinstance(change, tuple):
            kind, seqs = change
            return self._record({kind: seqs})
        # Every added sample is logged, even one dropped since: replaying the log
        # must drop the same samples at the cap as this buffer did.
        record = self._record({"sample": asdict(change)})
        if change.seq in live_seqs:
            self._records[change.seq] = record
        return record

    def _write_log(self) -> None:
        header = self._record({"header": {"version": FORMAT_VERSION, "total_added": self.total_added}})
        records = [self._records[s.seq] for s in self._samples]
        learned = [s.seq for s in self._samples if s.seq in self._learned]
        if learned:
            records.append(self._record({"learned": learned}))
        data = b"".join([LOG_MAGIC, header, *records])
        paths.private_dir(self.path.parent)
        atomic_write_bytes(self.path, data)
        self._log_bytes = len(data)
        self._rewrite = False

    def _record(self, obj: dict) -> bytes:
        plain = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        blob = (self.keys or default_keystore()).encrypt(plain)
        return _LENGTH.pack(len(blob)) + blob

    @classmethod
    def load(cls, path: Path, max_samples: int = 256, keys: KeyStore | None = None) -> ReplayBuffer:
        """The saved buffer; an empty one (with `warning`) when the file is unusable."""
        buffer = cls(path, max_samples, keys)
        try:
            buffer._read()
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

    def _read(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        if data.startswith(LOG_MAGIC):
            self._replay(data)
            return
        self._restore(load_encrypted(self.path, None, self.keys))  # format 1
        for sample in self._samples:  # the rewrite as a log needs their records
            self._records[sample.seq] = self._record({"sample": asdict(sample)})

    def _replay(self, data: bytes) -> None:
        keys = self.keys or default_keystore()
        pos = len(LOG_MAGIC)
        while pos < len(data):
            end = pos + _LENGTH.size
            if end <= len(data):
                end += _LENGTH.unpack_from(data, pos)[0]
            if end > len(data):  # the last append, cut short by a kill: the log ends before it
                return
            record = data[pos:end]
            try:
                obj = json.loads(keys.decrypt(record[_LENGTH.size :], self.path))
            except (ValueError, UnicodeDecodeError) as exc:
                raise CorruptStateError(self.path, f"a record is not JSON: {exc}") from exc
            self._apply(obj, record)
            pos = end
        self._log_bytes = pos
        self._rewrite = False

    def _apply(self, obj: object, record: bytes) -> None:
        """One log record into the buffer, checked."""
        if not isinstance(obj, dict) or len(obj) != 1:
            raise CorruptStateError(self.path, "not a replay buffer record")
        (kind, value), = obj.items()
        if kind == "sample":
            sample = Sample.from_dict(value, self.path)
            self._append(sample)
            self._records[sample.seq] = record
            self.total_added = max(self.total_added, sample.seq + 1)
        elif kind in ("removed", "learned"):
            if not isinstance(value, list) or not all(type(seq) is int for seq in value):
                raise CorruptStateError(self.path, f"a {kind} record is not a list of samples")
            if kind == "removed":
                self._drop(set(value))
            else:
                live = {s.seq for s in self._samples}
                self._learned.update(seq for seq in value if seq in live)
        elif kind == "header":
            total = value.get("total_added") if isinstance(value, dict) else None
            if type(total) is not int or total < 0:
                raise CorruptStateError(self.path, "the sample counter is not a count")
            self.total_added = max(self.total_added, total)
        else:
            raise CorruptStateError(self.path, f"an unknown record ({kind!r})")

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
        self.clear()
        self.total_added = 0
