"""The vocabulary bridge between the real SmolLM2 (byte-level BPE) and Gemma
(SentencePiece) tokenizers."""

import json

import pytest
from omnidraft.core.decoding.vocab_bridge import NgramCache, VocabBridge, align
from omnidraft.core.storage.persistence import CorruptStateError
from omnidraft.core.storage.secure_store import MAGIC, save_encrypted


@pytest.fixture(scope="module")
def bridge(smol_tok, gemma_tok):
    return VocabBridge(smol_tok, gemma_tok, max_entries=1000)


def _one(tok, piece):
    return tok.convert_tokens_to_ids(piece)


def test_direct_map_normalises_space_markers_and_bytes(bridge, smol_tok, gemma_tok):
    assert bridge.direct(_one(smol_tok, "Ġreturn")) == _one(gemma_tok, "▁return")
    assert bridge.direct(_one(smol_tok, "Ċ")) == _one(gemma_tok, "\n")
    # A lone UTF-8 lead byte maps to Gemma's byte-fallback token for it.
    lead = smol_tok.convert_tokens_to_ids("Ã")  # byte 0xC3 in GPT-2's byte alphabet
    assert bridge.direct(lead) == _one(gemma_tok, "<0xC3>")
    # A real token beats the byte-fallback token spelling the same byte.
    assert bridge.direct(_one(smol_tok, "(")) == _one(gemma_tok, "(")


def test_special_tokens_never_map(bridge, smol_tok):
    for special in smol_tok.all_special_ids:
        assert bridge.direct(special) == -1
    assert bridge.propose([smol_tok.convert_tokens_to_ids("<|im_end|>")]).target_ids == []


def test_ngram_learned_from_accepted_text_fixes_false_rejections(smol_tok, gemma_tok):
    bridge = VocabBridge(smol_tok, gemma_tok)
    text = " snowflake"
    drafted = smol_tok(text, add_special_tokens=False)["input_ids"]
    target = gemma_tok(text, add_special_tokens=False)["input_ids"]
    assert len(drafted) >= 2 and len(target) == 1
    # Without the cache the pieces map one by one and the target rejects them.
    assert bridge.propose(drafted).target_ids != target
    assert bridge.learn_text(target) >= 1
    merged = bridge.propose(drafted)
    assert merged.target_ids == target and merged.ngram_hits == 1
    assert merged.spans == [tuple(range(len(drafted)))]


def test_indentation_runs_with_different_boundaries_are_learned(smol_tok, gemma_tok):
    bridge = VocabBridge(smol_tok, gemma_tok)
    text = "\n    return x"
    target = gemma_tok(text, add_special_tokens=False)["input_ids"]
    bridge.learn_text(target)
    drafted = smol_tok(text, add_special_tokens=False)["input_ids"]
    assert bridge.propose(drafted).target_ids == target


def test_greedy_text_proposals_follow_the_targets_own_boundaries(bridge, smol_tok, gemma_tok):
    """An indented line: SmolLM2 'ĊĠĠĠĠĠĠĠ','Ġreturn' is Gemma '\\n','▁▁▁▁▁▁▁▁','return',
    with nothing learned first."""
    text = "\n        return x"
    drafted = smol_tok(text, add_special_tokens=False)["input_ids"]
    target = gemma_tok(text, add_special_tokens=False)["input_ids"]
    fresh = VocabBridge(smol_tok, gemma_tok)
    assert fresh.propose(drafted).target_ids != target
    merged = fresh.propose_text(drafted)
    assert merged.target_ids == target
    assert merged.spans[0] == (0,) and merged.spans[1] == (0, 1) and merged.spans[2] == (1,)
    # Held (already accepted) text is not proposed again; a trailing whitespace
    # token may still grow, so it is not proposed either.
    assert fresh.propose_text(drafted, held=b"\n").target_ids == target[1:]
    tail = smol_tok("x:\n", add_special_tokens=False)["input_ids"]
    assert fresh.propose_text(tail).target_ids == gemma_tok("x:", add_special_tokens=False)["input_ids"]
    assert fresh.propose_text(drafted, held=b"  ").target_ids == []  # does not continue the text
    assert fresh.propose_text([smol_tok.convert_tokens_to_ids("<|im_end|>")]).target_ids == []


def test_drafted_text_that_reads_like_a_control_token_is_proposed_as_text(smol_tok, gemma_tok):
    bridge = VocabBridge(smol_tok, gemma_tok)
    drafted = smol_tok("<end_of_turn> x", add_special_tokens=False)["input_ids"]
    proposed = bridge.propose_text(drafted).target_ids
    assert proposed == gemma_tok("<end_of_turn> x", add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert gemma_tok.convert_tokens_to_ids("<end_of_turn>") not in proposed


def test_token_mapping_fallback_never_proposes_the_held_text_again(smol_tok, gemma_tok):
    """When the target cannot spell the drafted text back byte for byte, the draft
    is mapped token by token, starting after what token healing re-drafted."""

    class Unspelling:  # a target tokenizer whose tokens do not spell its input
        def __call__(self, text, **kwargs):
            return {"input_ids": [gemma_tok.pad_token_id]}

    bridge = VocabBridge(smol_tok, gemma_tok)
    drafted = smol_tok("\n    return x", add_special_tokens=False)["input_ids"]  # 'ĊĠĠĠ','Ġreturn','Ġx'
    bridge.target_tokenizer = Unspelling()
    after = bridge.propose_text(drafted, held=b"\n   ")
    assert after.target_ids == bridge.propose(drafted[1:]).target_ids != []
    assert after.spans[0] == (1,)  # positions still index the whole drafted run
    # Held text that ends inside a drafted token: nothing can be mapped.
    assert bridge.propose_text(drafted, held=b"\n ").target_ids == []


def test_longest_match_wins():
    cache = NgramCache()
    cache.add((1, 2), (10,))
    cache.add((1, 2, 3), (20,))
    assert cache.match([1, 2, 3, 4], 0) == (3, (20,))
    assert cache.match([1, 2, 4], 0) == (2, (10,))
    assert cache.match([5], 0) is None


def test_lru_eviction_keeps_recently_used_entries():
    cache = NgramCache(max_entries=2)
    cache.add((1, 2), (10,))
    cache.add((3, 4), (11,))
    cache.match([1, 2], 0)  # touch (1, 2)
    cache.add((5, 6), (12,))
    assert (1, 2) in cache.entries and (3, 4) not in cache.entries and len(cache) == 2


def test_cache_saves_and_restores(tmp_path):
    cache = NgramCache(max_entries=5)
    cache.add((1, 2), (10,))
    cache.add((3, 4, 5), (11, 12))
    cache.save(tmp_path / "c.bin")
    assert (tmp_path / "c.bin").read_bytes().startswith(MAGIC)  # token ids of the user's text
    back = NgramCache.load(tmp_path / "c.bin", max_entries=5)
    assert back.entries == cache.entries and back.longest == 3
    assert NgramCache.load(tmp_path / "c.bin", max_entries=5).entries == cache.entries  # still there
    assert len(NgramCache.load(tmp_path / "missing.bin")) == 0


def test_a_plaintext_cache_from_an_older_version_is_migrated(tmp_path):
    legacy, path = tmp_path / "c.json", tmp_path / "c.bin"
    legacy.write_text(json.dumps({"max_entries": 5, "entries": [[[1, 2], [10]], [[3, 4, 5], [11, 12]]]}, indent=2))
    back = NgramCache.load(path, max_entries=5, legacy=legacy)
    assert back.entries == {(1, 2): (10,), (3, 4, 5): (11, 12)}
    assert not legacy.exists() and path.read_bytes().startswith(MAGIC)
    assert NgramCache.load(path, max_entries=5, legacy=legacy).entries == back.entries


@pytest.mark.parametrize("bad", ["{not json", "[1, 2]", '{"entries": 5}', '{"entries": [[1, 2]]}',
                                 '{"entries": [[["a"], [1]]]}', '{"entries": [[[1], [-3]]]}', '"x"'])
def test_a_damaged_or_wrong_shape_cache_is_refused(tmp_path, bad):
    legacy = tmp_path / "c.json"
    legacy.write_text(bad)
    with pytest.raises(CorruptStateError) as caught:
        NgramCache.load(tmp_path / "c.bin", legacy=legacy)
    assert caught.value.path == legacy  # the caller sets the right file aside
    save_encrypted(tmp_path / "e.bin", json.loads(bad) if bad != "{not json" else "x")
    with pytest.raises(CorruptStateError):
        NgramCache.load(tmp_path / "e.bin")


def test_align_splits_at_shared_boundaries():
    a = [b"ab", b"c", b"de"]
    b = [b"a", b"bc", b"d", b"e"]
    assert list(align(a, [1, 2, 3], b, [7, 8, 9, 10])) == [((1, 2), (7, 8)), ((3,), (9, 10))]


def test_same_vocabulary_is_detected(smol_tok):
    bridge = VocabBridge(smol_tok, smol_tok)
    assert bridge.same_vocab
    ids = smol_tok("hello world", add_special_tokens=False)["input_ids"]
    assert bridge.propose(ids).target_ids == ids
