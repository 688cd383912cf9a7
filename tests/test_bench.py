"""omnidraft-bench end to end on a tiny random model with the real SmolLM2 tokenizer."""

import copy
import json
from pathlib import Path

import pytest
import torch
from omnidraft.bench import cli, runners
from omnidraft.bench.report import decoding, drafting_figures, engine_totals, first_difference
from omnidraft.core.decoding import adaptive_drafting
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine, LearnSettings
from omnidraft.core.events import TurnFinished, TurnStats
from omnidraft.core.stopping import ShouldStop, never

from tests.tiny import tiny_llama, tiny_smol_target

DEV_PROMPTS = Path(__file__).resolve().parents[1] / "eval" / "dev.jsonl"
PROMPTS = ["def fibonacci(n):\n    ", "The capital of France is"]


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory, smol_tok):
    folder = tmp_path_factory.mktemp("tiny-target")
    tiny_smol_target(folder, smol_tok)
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
    """The report of target, omnidraft and the variants (--draft each; fp32:
    exact), after checking every variant decoded plain decoding's tokens and drafted."""
    out = tmp_path / "bench.json"
    drafts = [a for v in variants for a in ("--draft", v)]
    assert _run(["--target", tiny_target, "--prompts", prompts_file, "--max-new-tokens", 12,
                 "--methods", "target,omnidraft", *drafts, "--dtype", "fp32", "--json", out]) == 0  # fmt: skip
    report = json.loads(out.read_text())
    assert list(report["methods"]) == ["target", "omnidraft", *(f"omnidraft[{v}]" for v in variants)]
    for v in variants:
        name = f"omnidraft[{v}]"
        assert report["outputs"][name] == report["outputs"]["target"] == report["outputs"]["omnidraft"]
        assert report["methods"][name]["engine"]["proposed"] > 0
        assert report["methods"][name]["settings"] == runners.DraftVariant.parse(v).settings
    return report


def test_fixed_draft_lengths_draft_exactly_k_and_change_no_token(tiny_target, prompts_file, tmp_path):
    report = _drafting_variants(tiny_target, prompts_file, tmp_path, ["k=1", "k=3"])
    for name, k in (("omnidraft[k=1]", 1), ("omnidraft[k=3]", 3)):
        assert report["methods"][name]["settings"] == {"k": k}
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
                       ["head_bits=4", "head_bits=8", "head_tokens=256", "layers=1", "q4k=1",
                        "layers=1,head_bits=8,k=2"])


def test_the_untrained_variant_decodes_plain_decodings_tokens(tiny_target, prompts_file, tmp_path):
    _drafting_variants(tiny_target, prompts_file, tmp_path, ["untrained=1", "untrained=1,head_tokens=256"])


def test_draft_options_parse_into_settings_with_a_label():
    v = runners.DraftVariant.parse("head_bits=8, k=3")
    assert (v.k, v.head_bits, v.max_k, v.untrained) == (3, 8, None, False)
    assert v.label == "omnidraft[head_bits=8,k=3]" and v.settings == {"head_bits": 8, "k": 3}
    assert v.draft_overrides() == {"k": 3, "min_confidence": 0.0, "gamma": None, "priced": False}
    assert runners.DraftVariant.parse("untrained=1").settings == {"untrained": 1}
    assert runners.DraftVariant.parse("max_k=7,priced=0,read=64,drawn=1").draft_overrides() == {
        "k": 7, "priced": False, "prompt_tokens": 64, "draw_drafts": True}
    assert runners.DraftVariant.parse("layers=2,q4k=1").net_args()["num_layers"] == 2
    assert runners.DraftVariant.parse("k=16").k == 16 and runners.DraftVariant.parse("read=4096").read == 4096
    for bad, why in [("k=0", "from 1 to 16"), ("k=17", "from 1 to 16"), ("max_k=0", "from 1 to 16"),
                     ("read=0", "from 1 to 4096"), ("read=4097", "from 1 to 4096"), ("head_bits=6", "4 or 8"),
                     ("head_tokens=255", "from 256 to 65536"), ("layers=0", "from 1 to 99"),
                     ("priced=2", "0 or 1"), ("k=x", "not an integer"), ("vocab=256", "unknown key"),
                     ("k3", "not KEY=VALUE"), ("k=3,k=4", "given twice"), ("k=3,max_k=4", "exclude"),
                     ("k=3,priced=1", "does not apply")]:
        with pytest.raises(ValueError, match=why):
            runners.DraftVariant.parse(bad)


def test_bad_draft_options_and_old_variant_names_are_usage_errors(tiny_target, prompts_file, capsys):
    base = ["--target", tiny_target, "--prompts", prompts_file, "--methods", "target"]
    assert _run([*base, "--draft", "vocab=256"]) == 2
    err = capsys.readouterr().err
    assert "usage:" in err and "argument --draft" in err and "unknown key 'vocab'" in err
    assert _run([*base, "--draft", "k=99"]) == 2
    assert "k must be from 1 to 16" in capsys.readouterr().err
    assert _run(["--target", tiny_target, "--prompts", prompts_file, "--methods", "target,omnidraft-k3"]) == 2
    err = capsys.readouterr().err
    assert "unknown method(s) omnidraft-k3" in err and "--draft KEY=VALUE" in err
    assert _run(["--help"]) == 0
    assert "--draft KEY=VALUE[,KEY=VALUE...]" in capsys.readouterr().out
    args = cli.parse_args([*map(str, base), "--draft", "k=3", "--draft", "k=3", "--draft", "untrained=1"])
    assert [v.label for v in args.draft] == ["omnidraft[k=3]", "omnidraft[untrained=1]"]  # repeats dropped


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
    untrained = runners.variant_runner(engine, runners.DraftVariant.parse("untrained=1"))
    omnidraft = runners.engine_runner(engine, True)
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


def test_a_drafting_variant_runs_with_its_settings_and_restores_the_engines(home):
    from omnidraft.core.decoding.drafter import DraftSettings

    seen = []

    class Recording(Engine):
        def complete(self, prompt, cfg, should_stop: ShouldStop = never, speculative: bool = False):
            s = self.draft_settings
            seen.append((s.k, s.min_confidence, s.gamma, s.priced, s.prompt_tokens))
            yield TurnFinished("x", "length", TurnStats(method="omnidraft", new_tokens=1), [5])

    engine = Recording(draft_settings=DraftSettings(k=4, min_confidence=0.5, gamma=0.6))
    for spec in ("k=6", "max_k=7", "priced=0", "read=64"):
        runners.variant_runner(engine, runners.DraftVariant.parse(spec))("p", GenerationConfig(max_new_tokens=1))
    assert seen == [(6, 0.0, None, False, None), (7, 0.5, 0.6, True, None), (4, 0.5, 0.6, False, None),
                    (4, 0.5, 0.6, True, 64)]
    s = engine.draft_settings
    assert (s.k, s.min_confidence, s.gamma, s.priced, s.prompt_tokens) == (4, 0.5, 0.6, True, None)


def test_a_drafting_variant_learns_its_own_drafting_policy(home):
    seen = []  # (the engine's own policy?, drafter steps it holds after the call's record)

    class Recording(Engine):
        def complete(self, prompt, cfg, should_stop: ShouldStop = never, speculative: bool = False):
            self.draft_policy.record("drafter", tokens=1, seconds=1.0)
            seen.append((self.draft_policy is own, round(self.draft_policy.stats["drafter"].steps, 3)))
            yield TurnFinished("x", "length", TurnStats(method="omnidraft", new_tokens=1), [5])

    engine = Recording()
    own = engine.draft_policy
    variant = runners.variant_runner(engine, runners.DraftVariant.parse("k=2"))  # with a policy of its own
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
    assert "unknown method(s) beam" in capsys.readouterr().err


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


@pytest.mark.parametrize("fails_on", [None, 1])  # None: in its warm-up; 1: on the second prompt
def test_a_method_that_raises_is_recorded_and_the_others_go_on(tiny_target, prompts_file, tmp_path, capsys,
                                                               monkeypatch, fails_on):
    """As uag does on Gemma prompts inside transformers' assisted generation."""
    calls = []

    def hf_runner(*_args, **_kwargs):
        def run(prompt, cfg):
            calls.append(prompt)
            if fails_on is None or len(calls) == 2 + fails_on:  # the warm-up is the first call
                raise RuntimeError("cannot reshape tensor of 0 elements")
            return [5], None

        return run

    monkeypatch.setattr(runners, "hf_runner", hf_runner)
    out = tmp_path / "bench.json"
    assert _run(["--target", tiny_target, "--prompts", prompts_file, "--limit", 2, "--max-new-tokens", 4,
                 "--methods", "target,hf,omnidraft", "--dtype", "fp32", "--json", out]) == 0  # fmt: skip
    report = json.loads(out.read_text())
    hf = report["methods"]["hf"]
    assert hf["failed"] is True and hf["tokens_per_s"] is None and hf["speedup"] is None
    assert hf["error"]["type"] == "RuntimeError" and hf["error"]["message"] == "cannot reshape tensor of 0 elements"
    assert hf["error"]["prompt_index"] == fails_on and "RuntimeError" in hf["error"]["where"]
    assert hf["completed_prompts"] == (0 if fails_on is None else 1)
    assert report["errors"] == {"hf": hf["error"]}
    assert len(calls) == (1 if fails_on is None else 3)  # never asked again once it failed
    for name in ("target", "omnidraft"):  # the run went on without it
        assert report["methods"][name]["failed"] is False and len(report["outputs"][name]) == 2
    assert report["greedy_identical"] == 1.0 and "hf" not in report["divergences_by_method"]
    table = capsys.readouterr().out.splitlines()
    where = "warm-up" if fails_on is None else "prompt 2"
    row = next(line for line in table if line.startswith("hf "))
    assert row.split(None, 1)[1] == f"FAILED at {where}: RuntimeError: cannot reshape tensor of 0 elements"


FAKE_SERVER = r'''
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

args = sys.argv[1:]
if args == ["--version"]:
    print("version: 11434 (fake)\nbuilt with a test"); sys.exit(0)
port = int(args[args.index("--port") + 1])
json.dump(args, open(sys.argv[0] + ".args", "w"))

class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/health": self.send({"status": "ok"})
        else: self.send({"build_info": "b11434-fake", "default_generation_settings":
                         {"params": {"speculative.n_max": 16, "temperature": 0.8}}})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(sys.argv[0] + ".requests", "a") as f: f.write(json.dumps(body) + "\n")
        self.send({"tokens": [5, 6, 2, 7][: body["n_predict"]], "stop_type": "eos",
                   "timings": {"prompt_n": len(body["prompt"]), "predicted_n": 3, "draft_n": 2,
                               "draft_n_accepted": 1, "predicted_ms": 3.0}})

HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def _fake_llamacpp(home: Path, monkeypatch) -> Path:
    """A built llama.cpp whose llama-server is FAKE_SERVER (Python, same flags and API)."""
    import sys

    from omnidraft.bench import llamacpp

    bin_dir = llamacpp.bin_dir()
    bin_dir.mkdir(parents=True)
    for name in llamacpp.TOOLS:
        (bin_dir / name).write_text(f"#!{sys.executable}\n" + FAKE_SERVER)
        (bin_dir / name).chmod(0o755)
    llamacpp.build_file().write_text(json.dumps({"release": llamacpp.RELEASE, "build": "native"}))
    return bin_dir / "llama-server"


def test_llamacpp_server_methods_drive_the_servers_api(home, monkeypatch):
    from omnidraft.bench import llamacpp

    assert llamacpp.build_info() is None  # nothing built: the bench names `make peers`
    server_bin = _fake_llamacpp(home, monkeypatch)
    info = llamacpp.build_info()
    assert info["build"] == "native" and info["version"] == "version: 11434 (fake) / built with a test"

    class Tok:  # prompt_ids' tokenizer: text -> ids
        def __call__(self, text, split_special_tokens=True):
            return {"input_ids": [1, 2, 3][: len(text)]}

    # Concurrent clients get a slot each, each slot the bench's context.
    four = llamacpp.Server(Path("t.gguf"), llamacpp.MODES["llamacpp-ngram"], 3, slots=4).command()
    assert four[four.index("-np") + 1] == "4" and four[four.index("-c") + 1] == str(4 * llamacpp.CONTEXT)
    server = llamacpp.Server(Path("t.gguf"), llamacpp.MODES["llamacpp-draft"], 3, draft=Path("d.gguf"))
    server.start(timeout=60)
    try:
        run, calls = llamacpp.runner(server, Tok(), {2}, chat=False)
        ids, timings = run("abc", GenerationConfig(max_new_tokens=4))
        assert ids == [5, 6] and timings["stop_type"] == "eos" and calls == [3 - 1]  # cut at the stop id 2
        assert timings["draft_n_accepted"] == 1
        with pytest.raises(NotImplementedError):
            run("abc", GenerationConfig(max_new_tokens=4, temperature=0.7))
        settings = server.settings()
    finally:
        server.stop()
    assert server.proc is None
    assert settings["command"][settings["command"].index("-np") + 1] == "1"
    sent = json.loads(Path(str(server_bin) + ".requests").read_text().splitlines()[0])
    assert sent == {"prompt": [1, 2, 3], "n_predict": 4, "temperature": 0.0, "top_k": 1, "cache_prompt": True,
                    "return_tokens": True, "stream": False}
    args = json.loads(Path(str(server_bin) + ".args").read_text())
    assert args[args.index("-np") + 1] == "1" and args[args.index("-t") + 1] == "3"
    assert args[args.index("--spec-type") + 1] == "draft-simple" and args[args.index("-md") + 1] == "d.gguf"
    assert settings["draft_model"] == "d.gguf"
    assert "PORT" in settings["command"] and settings["build_info"] == "b11434-fake"


def test_llamacpp_methods_on_a_non_gguf_target_fail_alone(tiny_target, prompts_file, tmp_path, monkeypatch):
    """The tiny target is a transformers folder: the peers cannot run it; the others go on."""
    from omnidraft.bench import llamacpp

    monkeypatch.setattr(llamacpp, "build_info", lambda: {"build": "native"})
    out = tmp_path / "bench.json"
    assert _run(["--target", tiny_target, "--prompts", prompts_file, "--limit", 1, "--max-new-tokens", 3,
                 "--methods", "target,llamacpp,llamacpp-ngram", "--dtype", "fp32", "--json", out]) == 0
    report = json.loads(out.read_text())
    assert report["methods"]["target"]["failed"] is False
    for name in ("llamacpp", "llamacpp-ngram"):
        assert report["methods"][name]["failed"] and "needs a GGUF target" in report["errors"][name]["message"]
    assert report["llamacpp"] == {"build": "native"}


def test_llamacpp_builds_skip_what_the_cpu_lacks():
    from omnidraft.bench import llamacpp

    zen = {"avx", "avx2", "fma", "f16c"}
    assert llamacpp.missing_flags("native", zen) == []
    assert llamacpp.missing_flags("avx2", zen) == []
    assert "avx512f" in llamacpp.missing_flags("avx512", zen)
    assert llamacpp.missing_flags("avx512", None) == []  # unknown flags: the smoke test decides
    # An AMX Xeon's (Sapphire Rapids) and a Zen 4's /proc/cpuinfo flags, as the kernel spells them:
    # avx512vbmi without an underscore, avx512_vnni and avx512_bf16 with one.
    sapphire = {"avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl",
                "avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_vnni", "avx512_bitalg", "avx512_vpopcntdq",
                "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "amx_int8"}
    zen4 = sapphire - {"avx512_fp16", "amx_bf16", "amx_tile", "amx_int8"}
    assert llamacpp.missing_flags("avx512", sapphire) == llamacpp.missing_flags("avx512", zen4) == []
    assert "-DGGML_AMX_INT8=OFF" in llamacpp.BUILDS["avx512"][0]
    with pytest.raises(SystemExit) as exc:
        llamacpp.main(["--builds", "native,sse"])
    assert exc.value.code == 2


# --stream: a person's stream, prequential, the learner against a frozen twin

STREAM_TURNS = [  # (conversation, prompt): follow-ups continue their conversation
    ("c1", "def add(a, b):\n    return a + b\n\nWrite a test for `add`."),
    ("c1", "Use pytest.mark.parametrize."),
    ("c2", "What does `add` return for strings?"),
    ("c3", "def add(a, b):\n    return a + b\n\nAdd type hints to this."),
    ("c3", "Use `int | None`."),
    ("c4", "Explain `add` step by step."),
    ("c5", "def add(a, b):\n    return a - b\n\nFind the bug."),
]


def _stream_file(path: Path) -> Path:
    path.write_text("".join(json.dumps({"id": f"t{i}", "conversation": c, "prompt": p}) + "\n"
                            for i, (c, p) in enumerate(STREAM_TURNS)))
    return path


@pytest.mark.timeout(900)  # the learner trains after every turn
def test_a_stream_is_scored_turn_by_turn_against_a_frozen_twin_and_charted(tiny_target, tmp_path, monkeypatch):
    """--stream then --then: per-turn figures and curves for learner and twin,
    the headline figures, the replies plain decoding's own, the learner's delay
    of the next reply, a second segment's adaptation and a stream met again;
    the report so far on disk after every turn.
    (A budget the learner never runs out of: it trains every turn, however busy the machine.)"""
    from omnidraft.bench import stream as stream_module

    stream = _stream_file(tmp_path / "code-demo.jsonl")
    out, chart = tmp_path / "stream.json", tmp_path / "stream.png"
    partial_turns = []
    write_partial = stream_module._write_partial

    def spy(path, report):
        write_partial(path, report)
        on_disk = json.loads(path.read_text())
        assert on_disk["complete"] is False
        partial_turns.append(on_disk["stream"]["turns"])

    monkeypatch.setattr(stream_module, "_write_partial", spy)
    rc = cli.main(["--target", str(tiny_target), "--stream", str(stream), "--turns", "4", "--then", f"{stream}:2",
                   "--idle-s", "60", "--dtype", "fp32", "--max-new-tokens", "6", "--json", str(out),
                   "--chart", str(chart)])
    assert rc == 0
    report = json.loads(out.read_text())
    s = report["stream"]
    assert report["mode"] == "stream" and report["complete"] and s["turns"] == 6 and s["idle_s"] == 60
    assert partial_turns == [1, 2, 3, 4, 5, 6]
    for key in ("speedup_ratio_last_third", "own_acceptance_first_third", "own_acceptance_last_third",
                "twin_own_acceptance_delta", "speedup_ratio_first_third", "gain_over_twin_last_third"):
        assert key in s, key
    assert s["speedup_ratio_last_third"] > 0
    assert s["learner"]["last_third"]["speedup"] / s["twin"]["last_third"]["speedup"] == pytest.approx(
        s["speedup_ratio_last_third"])
    assert s["greedy_identical"] == {"learner": 6, "twin": 6, "turns": 6}
    assert all(len(curve) == 6 for curve in s["curves"].values())
    assert s["learner_steps"] >= 6 and s["learn_delay_ms_max"] >= 0
    turns = report["turns"]
    assert [t["id"] for t in turns] == [f"t{i}" for i in range(4)] + ["t0", "t1"]
    assert [t["messages"] for t in turns[:3]] == [1, 3, 1]  # a follow-up carries its conversation
    for t in turns:
        assert t["learner"]["identical"] and t["twin"]["identical"]
        assert t["learner"]["forwards"] >= 1 and t["plain"]["seconds"] > 0
        assert t["learner"]["draft_seconds"] > 0 and t["twin"]["verify_seconds"] > 0
        assert t["learn"]["steps"] >= 1 and t["learn"]["delay_ms"] >= 0
    first, again = s["segments"]
    assert first["turns"] == 4 and again["turns"] == 2 and again["first_turn"] == 4
    assert s["own_acceptance_last_third"] == first["own_acceptance_last_third"]  # headline: the first segment
    assert "adaptation" in again and again["returning"]["earlier_segment"] == 0
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(900)
def test_the_twin_stays_frozen_while_the_learner_learns_and_both_reply_as_plain_decoding(target_dir):
    from omnidraft.bench import stream

    from tests.tiny import learning_engine

    engine = learning_engine(target_dir)
    run = stream.StreamRun(engine, max_new_tokens=6, idle_s=60.0)
    context = list(range(5, 25))
    twin_before, learner_before = run.twin.drafter.score(context), engine.drafter.score(context)
    twin_head = {k: v.clone() for k, v in run.twin.drafter.head.state_dict().items()}
    rows = [{"id": f"t{i}", "conversation": c, "prompt": p} for i, (c, p) in enumerate(STREAM_TURNS[:6])]
    run.run(0, rows)

    assert torch.equal(run.twin.drafter.score(context), twin_before)  # no adapter update reached it
    assert run.twin.drafter.adapter_rank is None
    assert all(torch.equal(v, twin_head[k]) for k, v in run.twin.drafter.head.state_dict().items())
    assert engine.drafter.adapter_rank is not None  # the learner drafts with what it learned
    assert not torch.allclose(engine.drafter.score(context), learner_before)
    assert engine.buffer.total_added == 6  # the learner's turns only: the twin records nothing
    assert all(r["learner"]["identical"] and r["twin"]["identical"] for r in run.records)
    assert sum(r["learn"]["steps"] for r in run.records) >= 3


@pytest.mark.timeout(900)
def test_the_oracle_learns_the_stream_s_own_replies_before_it_is_scored(target_dir):
    """--oracle: every turn recorded and trained on, pass after pass, before
    scoring; the n-gram cache and drafting policy learn nothing from it, the twin
    stays untrained, and the scored replies stay plain decoding's."""
    from omnidraft.bench import stream

    from tests.tiny import learning_engine

    engine = learning_engine(target_dir)
    run = stream.StreamRun(engine, max_new_tokens=6, idle_s=0.0)
    context = list(range(5, 25))
    twin_before, learner_before = run.twin.drafter.score(context), engine.drafter.score(context)
    cache_before, policy_before = dict(engine.bridge.cache.entries), copy.deepcopy(engine.draft_policy)
    rows = [{"id": f"t{i}", "conversation": c, "prompt": p} for i, (c, p) in enumerate(STREAM_TURNS[:3])]
    oracle = run.study([rows], passes=2)

    assert oracle["passes"] == 2 and oracle["turns"] == 3 and oracle["learner_steps"] >= 2
    assert dict(engine.bridge.cache.entries) == cache_before
    assert engine.draft_policy == policy_before
    assert not torch.allclose(engine.drafter.score(context), learner_before)  # it drafts with what it learned
    assert torch.equal(run.twin.drafter.score(context), twin_before)
    run.run(0, rows)
    assert all(r["learner"]["identical"] and r["twin"]["identical"] and r["learn"]["steps"] == 0
               for r in run.records)


def test_stream_options_are_checked_before_anything_loads(tmp_path, capsys):
    stream = _stream_file(tmp_path / "s.jsonl")
    assert cli.main(["--target", "x"]) == 2
    assert "give --prompts, or --stream" in capsys.readouterr().err
    assert cli.main(["--target", "x", "--prompts", str(stream), "--turns", "3"]) == 2
    assert "go with --stream" in capsys.readouterr().err
    assert cli.main(["--target", "x", "--stream", str(stream), "--idle-s", "-1"]) == 2
    assert "--idle-s must be 0 or more" in capsys.readouterr().err
    assert cli.main(["--target", "x", "--stream", str(stream), "--then", f"{stream}:0"]) == 2
    assert cli.main(["--target", "x", "--stream", str(stream), "--then", str(tmp_path / "none.jsonl")]) == 2
    assert "none.jsonl does not exist" in capsys.readouterr().err  # before any model loads
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": ""}\n')
    from omnidraft.bench import stream as stream_mod

    with pytest.raises(runners.BenchError, match="empty .prompt"):
        stream_mod.read_stream(stream_mod.segment_arg(str(bad)))
    assert [r["id"] for r in stream_mod.read_stream(stream_mod.segment_arg(f"{stream}:2"))] == ["t0", "t1"]
    # --turns A-B: turns A to B, counted from 1
    middle = stream_mod.Segment(stream, *reversed(stream_mod.turns_arg("3-5")))
    assert [r["id"] for r in stream_mod.read_stream(middle)] == ["t2", "t3", "t4"]
    assert stream_mod.turns_arg("4") == (0, 4)
    for bad_turns in ("0", "5-3", "x", "2-"):
        assert cli.main(["--target", "x", "--stream", str(stream), "--turns", bad_turns]) == 2
    assert cli.main(["--target", "x", "--stream", str(stream), "--turns", "9-10"]) == 2
    assert "none from turn 9 on" in capsys.readouterr().err
    assert cli.main(["--target", "x", "--stream", str(stream), "--oracle", "0"]) == 2
    assert "--oracle needs at least 1 pass" in capsys.readouterr().err
