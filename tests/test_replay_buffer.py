"""The learner's replay buffer: encrypted, bounded, and never fatal when damaged."""

import json
import random

import pytest
from keyring.backends import fail
from omnidraft.core.learning.replay_buffer import ReplayBuffer, Sample
from omnidraft.core.storage.secure_store import KeyStore, save_encrypted

SECRET = " my bank PIN is 4417 and my diary says I love marmalade"


@pytest.fixture
def keys(tmp_path):
    return KeyStore(tmp_path / "keys", backend=fail.Keyring())


def _sample(tok, text=SECRET) -> Sample:
    prompt = tok("User says:")["input_ids"]
    reply = tok(text, add_special_tokens=False)["input_ids"]
    return Sample(prompt + reply, len(prompt), prompt + reply, len(prompt), proposed=7, accepted=5)


def test_saved_encrypted_and_roundtrips(tmp_path, keys, smol_tok):
    path = tmp_path / "buffer.bin"
    buf = ReplayBuffer(path, keys=keys)
    sample = buf.add(_sample(smol_tok))
    buf.save()
    raw = path.read_bytes()
    assert b"marmalade" not in raw and b"4417" not in raw
    ids = json.dumps(sample.target_ids, separators=(",", ":")).encode()
    assert ids[1:40] not in raw  # not even the token ids are readable
    loaded = ReplayBuffer.load(path, keys=keys)
    assert loaded.warning is None
    assert loaded.samples() == [sample]
    assert loaded.total_added == 1
    assert smol_tok.decode(loaded.samples()[0].target_reply) == SECRET


def test_bounded_drops_oldest_and_counts(tmp_path, keys, smol_tok):
    buf = ReplayBuffer(tmp_path / "b.bin", max_samples=3, keys=keys)
    for n in range(5):
        buf.add(_sample(smol_tok, f" turn {n}"))
    assert len(buf) == 3
    assert [s.seq for s in buf.samples()] == [2, 3, 4]
    buf.save()
    loaded = ReplayBuffer.load(tmp_path / "b.bin", max_samples=3, keys=keys)
    assert loaded.total_added == 5 and [s.seq for s in loaded.samples()] == [2, 3, 4]
    assert loaded.add(_sample(smol_tok)).seq == 5  # seqs never repeat


def test_remove_keeps_samples_added_meanwhile(tmp_path, keys, smol_tok):
    buf = ReplayBuffer(tmp_path / "b.bin", keys=keys)
    for _ in range(4):
        buf.add(_sample(smol_tok))
    buf.remove({0, 2})
    assert [s.seq for s in buf.samples()] == [1, 3]
    buf.clear()
    assert len(buf) == 0


def test_add_rejects_inconsistent_sample(tmp_path, keys):
    buf = ReplayBuffer(tmp_path / "b.bin", keys=keys)
    with pytest.raises(ValueError):
        buf.add(Sample([1, 2], 3, [1], 0))


def test_samples_saved_before_temperatures_were_recorded_load_as_greedy(tmp_path, keys, smol_tok):
    path = tmp_path / "buffer.bin"
    old = {k: v for k, v in vars(_sample(smol_tok)).items() if k != "temperature"}
    save_encrypted(path, {"version": 1, "total_added": 1, "samples": [{**old, "seq": 0}]}, keys)
    buf = ReplayBuffer.load(path, keys=keys)
    assert buf.warning is None and buf.samples()[0].temperature == 0.0
    buf.add(_sample(smol_tok)).temperature = 0.7  # a sampled turn keeps its temperature
    buf.save()
    assert [s.temperature for s in ReplayBuffer.load(path, keys=keys).samples()] == [0.0, 0.7]


def test_sampled_turns_saved_before_drawn_was_recorded_load_as_drawn(tmp_path, keys, smol_tok):
    """Records from before the `drawn` flag: every sampled turn's drafts were drawn from the drafter's
    distribution, which decides its head labels."""
    path = tmp_path / "buffer.bin"
    old = {k: v for k, v in vars(_sample(smol_tok)).items() if k != "drawn"}
    samples = [{**old, "seq": 0}, {**old, "temperature": 0.7, "seq": 1}]
    save_encrypted(path, {"version": 1, "total_added": 2, "samples": samples}, keys)
    loaded = ReplayBuffer.load(path, keys=keys).samples()
    assert [(s.temperature, s.drawn) for s in loaded] == [(0.0, False), (0.7, True)]


@pytest.mark.parametrize("damage", ["garbage", "wrong-shape", "bad-sample", "bad-temperature", "bad-drawn"])
def test_damaged_file_is_quarantined(tmp_path, keys, damage):
    path = tmp_path / "buffer.bin"
    if damage == "garbage":
        path.write_bytes(b"\x00not encrypted at all")
    elif damage == "wrong-shape":
        save_encrypted(path, ["not", "a", "buffer"], keys)
    elif damage in ("bad-temperature", "bad-drawn"):
        bad = {"temperature": "hot"} if damage == "bad-temperature" else {"drawn": "yes"}
        sample = {**vars(Sample([1, 2], 1, [3], 1)), **bad}
        save_encrypted(path, {"total_added": 1, "samples": [sample]}, keys)
    else:
        save_encrypted(path, {"total_added": 1, "samples": [{"target_ids": "abc"}]}, keys)
    buf = ReplayBuffer.load(path, keys=keys)
    assert len(buf) == 0 and buf.total_added == 0
    assert "damaged" in buf.warning
    assert not path.exists() and (tmp_path / "buffer.bin.corrupt").exists()
    buf.save()  # and it works from there on
    assert ReplayBuffer.load(path, keys=keys).warning is None


def test_foreign_key_leaves_the_file_alone(tmp_path, keys, smol_tok):
    path = tmp_path / "buffer.bin"
    other = KeyStore(tmp_path / "other", backend=fail.Keyring())
    theirs = ReplayBuffer(path, keys=other)
    theirs.add(_sample(smol_tok))
    theirs.save()
    before = path.read_bytes()
    buf = ReplayBuffer.load(path, keys=keys)
    assert len(buf) == 0 and "key" in buf.warning
    buf.add(_sample(smol_tok))
    buf.save()
    assert path.read_bytes() == before


def test_saving_after_a_reply_appends_that_sample_only(tmp_path, keys, smol_tok):
    """A save must not cost the whole buffer (31 MiB, 5-9 s at its cap, waited for
    by every reply): what was written stays byte for byte, one record is added."""
    path = tmp_path / "buffer.bin"
    buf = ReplayBuffer(path, keys=keys)
    for n in range(20):
        buf.add(_sample(smol_tok, f" turn {n}"))
    buf.save()
    before = path.read_bytes()
    buf.add(_sample(smol_tok, " one more turn"))
    buf.save()
    after = path.read_bytes()
    assert after.startswith(before)
    assert 0 < len(after) - len(before) < len(before) / 10
    assert ReplayBuffer.load(path, keys=keys).samples() == buf.samples()


def test_a_save_cut_short_by_a_kill_loses_only_that_sample(tmp_path, keys, smol_tok):
    path = tmp_path / "buffer.bin"
    buf = ReplayBuffer(path, keys=keys)
    kept = [buf.add(_sample(smol_tok, f" turn {n}")) for n in range(3)]
    buf.save()
    whole = path.stat().st_size
    buf.add(_sample(smol_tok, " the turn being saved"))
    buf.save()
    with open(path, "r+b") as f:  # the kill landed in the middle of that append
        f.truncate(whole + (path.stat().st_size - whole) // 2)
    loaded = ReplayBuffer.load(path, keys=keys)
    assert loaded.warning is None and loaded.samples() == kept
    nxt = loaded.add(_sample(smol_tok, " next turn"))
    loaded.save()  # the cut-short tail is not built upon
    again = ReplayBuffer.load(path, keys=keys)
    assert again.warning is None and again.samples() == [*kept, nxt]


def test_the_log_replays_to_the_same_buffer_through_drops_removals_marks_and_rewrites(
    tmp_path, keys, monkeypatch
):
    from omnidraft.core.learning import replay_buffer

    monkeypatch.setattr(replay_buffer, "COMPACT_FLOOR_BYTES", 2000)  # rewrites happen too
    path = tmp_path / "buffer.bin"
    buf = ReplayBuffer(path, max_samples=5, keys=keys)
    rng = random.Random(1)
    rewrites = 0
    for step in range(120):
        action = rng.random()
        if action < 0.6:
            n = rng.randrange(2, 40)
            buf.add(Sample(list(range(n)), n // 2, list(range(n + 1)), n // 2, temperature=0.5))
        elif action < 0.75 and len(buf):
            buf.remove({s.seq for s in rng.sample(buf.samples(), rng.randrange(1, len(buf) + 1))})
        elif action < 0.9 and len(buf):  # the learner's first pass over some
            buf.mark_learned({s.seq for s in rng.sample(buf.samples(), rng.randrange(1, len(buf) + 1))})
        size = path.stat().st_size if path.exists() else 0
        buf.save()
        rewrites += path.exists() and path.stat().st_size < size
        loaded = ReplayBuffer.load(path, max_samples=5, keys=keys)
        assert loaded.warning is None
        assert loaded.samples() == buf.samples(), step
        assert loaded.new_samples() == buf.new_samples(), step
        assert loaded.total_added == buf.total_added
    assert rewrites > 0, "the log was never compacted"


def test_a_buffer_of_the_older_format_is_rewritten_as_a_log(tmp_path, keys, smol_tok):
    from omnidraft.core.learning.replay_buffer import LOG_MAGIC

    path = tmp_path / "buffer.bin"
    sample = {**vars(_sample(smol_tok)), "seq": 4}
    save_encrypted(path, {"version": 1, "total_added": 5, "samples": [sample]}, keys)
    buf = ReplayBuffer.load(path, keys=keys)
    assert [s.seq for s in buf.samples()] == [4] and buf.total_added == 5
    buf.save()
    assert path.read_bytes().startswith(LOG_MAGIC)
    loaded = ReplayBuffer.load(path, keys=keys)
    assert loaded.samples() == buf.samples() and loaded.add(_sample(smol_tok)).seq == 5


def test_a_damaged_record_in_the_log_sets_the_file_aside(tmp_path, keys, smol_tok):
    path = tmp_path / "buffer.bin"
    buf = ReplayBuffer(path, keys=keys)
    for n in range(3):
        buf.add(_sample(smol_tok, f" turn {n}"))
    buf.save()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    loaded = ReplayBuffer.load(path, keys=keys)
    assert len(loaded) == 0 and "damaged" in loaded.warning
    assert (tmp_path / "buffer.bin.corrupt").exists()
