"""omnidraft-bench end to end on a tiny random model with the real SmolLM2 tokenizer."""

import json
from pathlib import Path

import pytest
from omnidraft.bench import cli, runners
from omnidraft.bench.report import decoding, drafting_figures, engine_totals, first_difference
from omnidraft.core.decoding import adaptive_drafting
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine, LearnSettings
from omnidraft.core.events import TurnFinished, TurnStats
from omnidraft.core.stopping import ShouldStop, never

from tests.tiny import tiny_llama

DEV_PROMPTS = Path(__file__).resolve().parents[1] / "eval" / "dev.jsonl"
PROMPTS = ["def fibonacci(n):\n    ", "The capital of France is"]


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory, smol_tok):
    folder = tmp_path_factory.mktemp("tiny-target")
    tiny_llama(len(smol_tok)).save_pretrained(folder)
    smol_tok.save_pretrained(folder)
    return folder


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [json.dumps({"id": f"p{i}", "prompt": p}) for i, p in enumerate(PROMPTS)]
    path.write_text("\n".join(lines + ["", json.dumps({"prompt": "never read"})]) + "\n")
    return path


def _run(args: list[str]) -> int:
    # No `home` fixture: the bench runs in its own temporary OMNIDRAFT_HOME whose cache
    # links to the session's, so the drafter the engine loads comes from .test-cache
    # instead of being converted again for every test.
    return cli.main([str(a) for a in args])


def test_target_and_hf_report(tiny_target, prompts_file, tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = _run(
        ["--target", tiny_target, "--prompts", prompts_file, "--limit", 2,
         "--max-new-tokens", 8, "--methods", "target,hf", "--dtype", "fp32", "--json", out]
    )  # fmt: skip
    assert rc == 0
    report = json.loads(out.read_text())

    assert report["prompts"] == 2 and report["max_new_tokens"] == 8
    assert report["dtype"] == "fp32" and isinstance(report["target"], str)
    assert report["drafter"] is None  # no drafter method ran
    assert report["greedy_identical"] is None  # omnidraft did not run
    assert set(report["methods"]) == {"target", "hf"}
    for s in report["methods"].values():
        assert s["tokens_per_s"] > 0 and s["new_tokens"] > 0
        assert s["acceptance_rate"] is None
        assert 0 < s["tokens_per_step"] <= 1.0  # plain decoding: one token per target forward
    assert report["methods"]["target"]["speedup"] == 1.0
    assert (
        report["methods"]["target"]["engine"]["new_tokens"]
        == report["methods"]["target"]["new_tokens"]
    )
    # Decoding proper, past each reply's first token, for the engine's methods only.
    plain = report["methods"]["target"]["decoding"]
    assert plain["speedup"] == 1.0 and plain["tokens_per_s"] > 0
    engine_s = report["methods"]["target"]["engine"]["seconds"]
    assert 0 < plain["first_token_s"] * 2 < engine_s  # two replies, each read its prompt first
    assert report["methods"]["hf"]["decoding"] is None

    # hf decodes the same prompt ids greedily with the same stop ids: identical output.
    target, hf = report["outputs"]["target"], report["outputs"]["hf"]
    assert len(target) == 2 and all(len(ids) <= 8 for ids in target)
    assert hf == target
    assert report["methods"]["hf"]["identical_to_target"] == 1.0
    assert report["divergences"] == [] and report["divergences_by_method"] == {"hf": []}
    assert report["prompt_ids"] == ["p0", "p1"]
    assert report["machine"]["torch_threads"] >= 1

    # The replies themselves, readable: each is the decoding of its token ids.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_target)
    assert report["texts"]["target"] == [tok.decode(ids, skip_special_tokens=True) for ids in target]
    assert report["texts"]["hf"] == report["texts"]["target"] and report["chat"] is False

    table = capsys.readouterr().out
    assert "target" in table and "hf" in table and "1.00x" in table


def test_chat_prompts_go_through_the_chat_template(tiny_target, prompts_file, tmp_path):
    out = tmp_path / "bench.json"
    args = ["--target", tiny_target, "--prompts", prompts_file, "--limit", 1,
            "--max-new-tokens", 6, "--methods", "target,hf,omnidraft", "--dtype", "fp32"]
    assert _run(args + ["--chat", "--json", out]) == 0
    chat = json.loads(out.read_text())
    assert _run(args + ["--json", out]) == 0
    raw = json.loads(out.read_text())
    assert chat["chat"] is True
    # Another prompt (template around it): another continuation; every method agrees within a run.
    assert chat["outputs"]["target"] != raw["outputs"]["target"]
    assert chat["outputs"]["hf"] == chat["outputs"]["target"] == chat["outputs"]["omnidraft"]
    assert chat["methods"]["omnidraft"]["engine"]["prompt_tokens"] > raw["methods"]["omnidraft"]["engine"]["prompt_tokens"]


def _drafting_variants(tiny_target, prompts_file, tmp_path, variants: list[str]) -> dict:
    """The report of target, the variants and omnidraft (fp32: exact), after
    checking every variant decoded plain decoding's tokens and drafted."""
    out = tmp_path / "bench.json"
    assert _run(["--target", tiny_target, "--prompts", prompts_file, "--max-new-tokens", 12,
                 "--methods", ",".join(["target", *variants, "omnidraft"]), "--dtype", "fp32",
                 "--json", out]) == 0  # fmt: skip
    report = json.loads(out.read_text())
    for name in variants:
        assert report["outputs"][name] == report["outputs"]["target"] == report["outputs"]["omnidraft"]
        assert report["methods"][name]["engine"]["proposed"] > 0
    return report


def test_fixed_draft_lengths_draft_exactly_k_and_change_no_token(tiny_target, prompts_file, tmp_path):
    report = _drafting_variants(tiny_target, prompts_file, tmp_path, ["omnidraft-k1", "omnidraft-k3"])
    for name, k in (("omnidraft-k1", 1), ("omnidraft-k3", 3)):
        e = report["methods"][name]["engine"]
        drafter_steps = e["steps"] - report["prompts"] - e["lookup_steps"]  # each prompt's first forward reads it
        drafted = e["proposed"] - e["lookup_proposed"]  # same vocabulary: drafter tokens = target tokens
        assert drafter_steps > 0
        # k every step but where fewer tokens are left to generate (the random tiny
        # drafter is never confident: its confidence rule would stop after one).
        assert (k - 1) * drafter_steps < drafted <= k * drafter_steps


def test_the_drafter_heads_precision_and_a_shorter_or_coarser_drafter_change_no_token(tiny_target, prompts_file,
                                                                                     tmp_path):
    _drafting_variants(tiny_target, prompts_file, tmp_path,
                       ["omnidraft-head4", "omnidraft-head8", "omnidraft-vocab256", "omnidraft-layers1", "omnidraft-q4k"])
    assert runners.is_method("omnidraft-layers99") and not runners.is_method("omnidraft-layers0")
    assert runners.head_rows("omnidraft-vocab65536") == 65536 and not runners.is_method("omnidraft-vocab255")


def test_the_untrained_variant_decodes_plain_decodings_tokens(tiny_target, prompts_file, tmp_path):
    _drafting_variants(tiny_target, prompts_file, tmp_path, ["omnidraft-untrained"])


def test_the_untrained_variant_drafts_without_what_was_learned_and_restores_it(home, monkeypatch):
    from types import SimpleNamespace

    from omnidraft.core.decoding.vocab_bridge import NgramCache

    class FakeDrafter:  # what the variant builds: the shipped weights, nothing learned
        def __init__(self, loaded, settings, max_len):
            self.loaded, self.max_len, self.head = loaded, max_len, None

    monkeypatch.setattr(runners, "Drafter", FakeDrafter)
    monkeypatch.setattr(runners, "keep_shared_context", lambda *args: None)  # no caches to keep here
    learned = SimpleNamespace(max_len=99, head=object())  # the engine's drafter, with its adapter and head
    learned_merges = {(7,): (8,)}
    seen = []

    class Recording(Engine):
        def complete(self, prompt, cfg, should_stop: ShouldStop = never, speculative: bool = False):
            d = self.drafter
            seen.append((d, d.head, dict(self.bridge.cache.entries), self.draft_policy))
            self.bridge.cache.entries[(1,)] = (2,)  # what a call merges stays with its method
            yield TurnFinished("x", "length", TurnStats(method="omnidraft", new_tokens=1), [5])

    engine = Recording()
    own = engine.draft_policy
    engine.drafter = learned
    engine.drafter_model = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(hidden_size=8)))
    engine.bridge = SimpleNamespace(cache=NgramCache())
    engine.bridge.cache.entries.update(learned_merges)
    untrained, omnidraft = runners.untrained_runner(engine), runners.engine_runner(engine, True)
    for run in (untrained, omnidraft, untrained):
        run("p", GenerationConfig(max_new_tokens=1))
        engine.bridge.cache.entries.pop((1,), None)  # omnidraft's own merge, not a learned one
    (d1, head1, merges1, policy1), (d2, head2, merges2, policy2), (d3, head3, merges3, policy3) = seen
    assert isinstance(d1, FakeDrafter) and d3 is d1 and d1.loaded is engine.drafter_model and d1.max_len == 99
    assert head1 is head3 and head1 is not None and head1 is not learned.head  # a fresh acceptance head
    assert merges1 == merges3 == {} and merges2 == learned_merges
    assert policy1 is policy3 and policy1 is not own and policy2 is own  # a fresh drafting policy of its own
    assert (d2, head2) == (learned, learned.head)
    assert engine.drafter is learned and engine.draft_policy is own and dict(engine.bridge.cache.entries) == learned_merges
    assert runners.is_method("omnidraft-untrained")


def test_a_drafting_variant_runs_with_its_settings_and_restores_the_engines(home):
    from omnidraft.core.decoding.drafter import DraftSettings

    seen = []

    class Recording(Engine):
        def complete(self, prompt, cfg, should_stop: ShouldStop = never, speculative: bool = False):
            s = self.draft_settings
            seen.append((s.k, s.min_confidence, s.gamma, s.priced, s.prompt_tokens))
            yield TurnFinished("x", "length", TurnStats(method="omnidraft", new_tokens=1), [5])

    engine = Recording(draft_settings=DraftSettings(k=4, min_confidence=0.5, gamma=0.6))
    for name in ("omnidraft-k6", "omnidraft-max7", "omnidraft-unpriced", "omnidraft-read64"):
        runners.variant_runner(engine, runners.draft_overrides(name))("p", GenerationConfig(max_new_tokens=1))
    assert seen == [(6, 0.0, None, False, None), (7, 0.5, 0.6, True, None), (4, 0.5, 0.6, False, None),
                    (4, 0.5, 0.6, True, 64)]
    s = engine.draft_settings
    assert (s.k, s.min_confidence, s.gamma, s.priced, s.prompt_tokens) == (4, 0.5, 0.6, True, None)
    assert runners.fixed_length("omnidraft-k16") == 16
    assert runners.fixed_length("omnidraft-k0") is None and runners.fixed_length("omnidraft-k17") is None
    assert not runners.is_method("omnidraft-max0") and runners.is_method("omnidraft-max16")
    assert runners.is_method("omnidraft-read4096") and not runners.is_method("omnidraft-read4097")
    assert not runners.is_method("omnidraft-read0")


def test_a_drafting_variant_learns_its_own_drafting_policy(home):
    seen = []  # (the engine's own policy?, drafter steps it holds after the call's record)

    class Recording(Engine):
        def complete(self, prompt, cfg, should_stop: ShouldStop = never, speculative: bool = False):
            self.draft_policy.record("drafter", tokens=1, seconds=1.0)
            seen.append((self.draft_policy is own, round(self.draft_policy.stats["drafter"].steps, 3)))
            yield TurnFinished("x", "length", TurnStats(method="omnidraft", new_tokens=1), [5])

    engine = Recording()
    own = engine.draft_policy
    variant = runners.own_policy(engine, runners.variant_runner(engine, runners.draft_overrides("omnidraft-k2")))
    plain_omnidraft = runners.engine_runner(engine, True)
    for run in (variant, variant, plain_omnidraft, variant):
        run("p", GenerationConfig(max_new_tokens=1))
    twice = round(1 + adaptive_drafting.DECAY, 3)
    assert seen == [(False, 1), (False, twice), (True, 1), (False, round(1 + adaptive_drafting.DECAY * twice, 3))]
    assert engine.draft_policy is own


def test_omnidraft_refuses_the_engines_plain_fallback(home):
    class PlainOnly(Engine):  # an engine whose drafter failed to load decodes plainly
        def complete(self, prompt, cfg, should_stop: ShouldStop = never, speculative: bool = False):
            yield TurnFinished("x", "length", TurnStats(method="target", new_tokens=1), [5])

    engine = PlainOnly()
    engine.warnings.append("Drafting is off: no drafter")
    run = runners.engine_runner(engine, speculative=True)
    with pytest.raises(runners.BenchError, match="decoded plainly.*no drafter"):
        run("hi", GenerationConfig(max_new_tokens=1))


def test_bad_inputs_are_reported_without_traceback(tiny_target, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt key"}\n')
    assert _run(["--target", tiny_target, "--prompts", bad, "--methods", "target"]) == 2
    assert '"prompt" string' in capsys.readouterr().err
    assert _run(["--target", tiny_target, "--prompts", bad, "--methods", "target,beam"]) == 2
    assert "unknown method" in capsys.readouterr().err


def test_trim_and_first_difference():
    assert runners.trim([5, 6, 2, 7], {2}, 10) == [5, 6]
    assert runners.trim([5, 6, 7], {2}, 2) == [5, 6]
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_temporary_home_links_the_real_cache_and_is_removed(home):
    from omnidraft.core.storage import paths

    real_cache = paths.cache_dir()
    with cli.bench_home(None):
        run_home = paths.data_dir().parent
        assert run_home != home
        assert (run_home / "cache").resolve() == real_cache.resolve()
    assert not run_home.exists() and real_cache.exists()
    assert paths.data_dir().parent == home


def test_uag_with_a_different_vocabulary_drafter(
    tiny_target, prompts_file, tmp_path, gemma_tok, monkeypatch
):
    from omnidraft.core.models.catalog import ModelEntry
    from omnidraft.core.models.loader import LoadedModel

    from tests.tiny import tiny_gemma3

    drafter = LoadedModel(
        ModelEntry("tiny-drafter", "Tiny Gemma drafter", ""), tiny_gemma3(len(gemma_tok)),
        gemma_tok, 0.0,
    )  # fmt: skip
    monkeypatch.setattr(runners, "uag_drafter", lambda *_: drafter)
    out = tmp_path / "bench.json"
    rc = _run(
        ["--target", tiny_target, "--prompts", prompts_file, "--limit", 1,
         "--max-new-tokens", 6, "--methods", "target,uag", "--dtype", "fp32", "--json", out]
    )  # fmt: skip
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["drafter"] == "Tiny Gemma drafter"
    uag = report["methods"]["uag"]
    assert uag["tokens_per_s"] > 0 and uag["speedup"] > 0
    # Greedy assisted generation verifies against the target's argmax: same output.
    assert report["outputs"]["uag"] == report["outputs"]["target"]


def test_uag_gets_a_private_copy_of_the_engines_drafter(home):
    from omnidraft.core.models.catalog import ModelEntry
    from omnidraft.core.models.loader import LoadedModel

    engine = Engine()
    model = tiny_llama(64)
    engine.target = LoadedModel(ModelEntry("t", "T", ""), model, None, 0.0)
    engine.drafter_model = LoadedModel(ModelEntry("d", "D", ""), model, None, 0.0)
    assert runners.shares_embeddings(engine)  # self-drafting: forward counts are not the target's
    copy = runners.uag_drafter(engine, None, None)
    assert copy.entry.name == "D" and copy.model is not model


@pytest.mark.integration
def test_omnidraft_on_gemma_is_lossless_when_greedy(tmp_path):
    """Real cross-vocabulary run over every dev prompt: greedy speculative output
    must equal plain output, token for token.

    fp32, because in bf16 a multi-token verification forward and a one-token
    forward can round a near-tie differently (the report's top2_gap shows it).
    """
    out = tmp_path / "bench.json"
    rc = _run(
        ["--target", "gemma-3-270m", "--prompts", DEV_PROMPTS,
         "--max-new-tokens", 32, "--methods", "target,omnidraft", "--json", out,
         "--drafter", "smollm2-135m-instruct", "--dtype", "fp32"]
    )  # fmt: skip
    assert rc == 0
    report = json.loads(out.read_text())
    spec = report["methods"]["omnidraft"]
    assert report["drafter"] and spec["acceptance_rate"] is not None
    assert report["greedy_identical"] == 1.0, report["divergences"]


def test_state_dir_is_kept_and_reuses_the_cache(home, tmp_path):
    from omnidraft.core.storage import paths

    real_cache = paths.cache_dir()
    state = tmp_path / "state"
    with cli.bench_home(state):
        assert paths.data_dir() == state / "data"
        assert paths.cache_dir().resolve() == real_cache.resolve()
    assert (state / "data").is_dir() and paths.data_dir().parent == home


def test_decoding_rate_leaves_out_each_replys_first_token_and_its_prompt_read():
    a = TurnStats(method="target", new_tokens=5, seconds=3.0, first_token_seconds=2.0)
    b = TurnStats(method="target", new_tokens=3, seconds=2.0, first_token_seconds=1.0)
    empty = TurnStats(method="target", new_tokens=0, seconds=0.5, first_token_seconds=0.0)
    outs = [runners.Output([1] * t.new_tokens, t.seconds, 1, t) for t in (a, b, empty)]
    figures = decoding(outs)
    assert figures["tokens_per_s"] == (4 + 2) / (1.0 + 1.0) and figures["first_token_s"] == 1.5
    assert decoding([runners.Output([1], 1.0, 1, None)]) is None


def test_engine_totals_add_up_turns():
    a = TurnStats(method="omnidraft", new_tokens=4, seconds=1.0, steps=2, proposed=6, accepted=3)
    b = TurnStats(method="omnidraft", new_tokens=2, seconds=0.5, steps=1, proposed=2, accepted=1)
    outs = [runners.Output([1], 1.0, 1, a), runners.Output([1], 1.0, 1, b)]
    total = engine_totals(outs)
    assert total["new_tokens"] == 6 and total["proposed"] == 8 and total["acceptance_rate"] == 0.5


def test_drafting_figures_split_acceptance_by_source_and_compare_predicted_with_observed():
    a = TurnStats(method="omnidraft", new_tokens=12, steps=5, proposed=10, accepted=6,
                  lookup_steps=1, lookup_proposed=4, lookup_accepted=1, ngram_proposed=2, ngram_accepted=2)
    # judged: the first two (the 2nd rejected); raw: the head's before calibration
    a.add_drafted([0.9, 0.5, 0.4], [0.95, 0.6, 0.5], [False, False, False], 1)
    b = TurnStats(method="omnidraft", new_tokens=3, steps=2, proposed=2, accepted=2)
    b.add_drafted([0.8, 0.6], [0.9, 0.7], [False, False], 2)
    outs = [runners.Output([1], 1.0, 1, a), runners.Output([1], 1.0, 1, b)]
    got = drafting_figures(engine_totals(outs), len(outs))
    assert got["acceptance"] == 8 / 12 and got["acceptance_lookup"] == 1 / 4
    assert got["acceptance_drafter"] == 7 / 8 and got["acceptance_ngram"] == 1.0
    assert got["drafted_tokens_per_step"] == 12 / 5  # 7 forwards, 2 of them the prompts'
    assert got["calibration_proposals"] == 4
    assert got["calibration_predicted"] == pytest.approx((0.9 + 0.5 + 0.8 + 0.6) / 4)
    assert got["calibration_raw_predicted"] == pytest.approx((0.95 + 0.6 + 0.9 + 0.7) / 4)
    assert got["calibration_observed"] == 3 / 4
    assert drafting_figures(engine_totals([runners.Output([1], 1.0, 1, TurnStats(method="target"))]), 1) is None


@pytest.mark.parametrize(("chat", "learn_every"), [(False, None), (True, 1)])
def test_adapt_serves_training_prompts_learns_and_measures_before_and_after(tmp_path, smol_tok, gemma_tok,
                                                                             monkeypatch, chat, learn_every):
    """--adapt: before/after in one run, the learner ran, and evaluation taught
    the engine nothing (the replay buffer only ever saw training prompts); with
    --chat the training turns are recorded as chat turns, as the app records them;
    --learn-every 1 learns after every turn."""
    from omnidraft.core.learning.replay_buffer import ReplayBuffer

    from tests.tiny import tiny_gemma3

    recorded = []
    add = ReplayBuffer.add
    monkeypatch.setattr(ReplayBuffer, "add", lambda self, sample: (recorded.append(sample), add(self, sample))[1])

    target = tmp_path / "tiny-gemma"
    tiny_gemma3(len(gemma_tok), seed=1).save_pretrained(target)
    gemma_tok.save_pretrained(target)
    train = tmp_path / "train.jsonl"
    prompts = [f"def f{i}(x):\n    return" for i in range(9)]
    train.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    evals = tmp_path / "dev.jsonl"
    evals.write_text(json.dumps({"prompt": "The cat sat on the"}) + "\n")
    out = tmp_path / "r.json"
    rc = cli.main([
        "--target", str(target), "--prompts", str(evals), "--adapt", str(train), "--dtype", "fp32",
        "--methods", "target,omnidraft", "--max-new-tokens", "8", "--json", str(out),
        "--state-dir", str(tmp_path / "state"), *(["--chat"] if chat else []),
        *(["--learn-every", str(learn_every)] if learn_every else []),
    ])
    assert rc == 0
    report = json.loads(out.read_text())
    adapt = report["adapt"]
    assert [s.target_ids[: s.target_prompt_len] for s in recorded] == [
        runners.prompt_ids(gemma_tok, p, chat) for p in prompts]
    assert adapt["train_prompts"] == 9
    assert adapt["turns_recorded"] == 9  # no warm-up or evaluation turn among them
    if learn_every == 1:  # each turn learned at once, with up to `reviews` earlier ones replayed
        assert adapt["learn_every"] == 1 and adapt["learn_steps"] == 9
        assert adapt["samples_trained"] == sum(1 + min(i, LearnSettings.reviews) for i in range(9))
    else:  # the first 8 turns learned once when they had gathered, then the ninth with `reviews` of them
        assert adapt["learn_every"] == LearnSettings.batch_size and adapt["learn_steps"] >= 2
        assert adapt["samples_trained"] == 8 + 1 + LearnSettings.reviews
    assert set(adapt["before"]) == set(adapt["after"]) == {"target", "omnidraft"}
    assert adapt["greedy_identical_before"] == adapt["greedy_identical_after"] == 1.0
    assert adapt["after"]["target"]["speedup"] == 1.0
    assert 1 <= adapt["adapter_rank"] <= 32 and abs(adapt["calibration_bias"]) <= 4.0
    for when in ("before", "after"):  # what learning should move, both times
        drafting = adapt[when]["omnidraft"]["drafting"]
        assert drafting["calibration_proposals"] > 0 and 0 <= drafting["calibration_predicted"] <= 1
        assert drafting["acceptance"] == adapt[when]["omnidraft"]["acceptance_rate"]
