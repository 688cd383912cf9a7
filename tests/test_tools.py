"""The measurement tools' command lines (tools/, run as `python -m omnidraft.tools.NAME`):
each one's defaults, a bad value refused with exit 2 and a message before anything
loads, and --help. Nothing here loads a model or times anything."""

from __future__ import annotations

import importlib
import json
import re
import types
from pathlib import Path

import numpy as np
import pytest
from omnidraft.tools import common

TOOLS = ("step_times", "kernel_ab", "attention_ab", "conversation_speed", "reply_agreement",
         "learning_sweep", "speed_floor", "memory_soak", "gui_check", "bundle_check",
         "make_streams", "load_footprint", "search_index_size", "code_block_stall", "serve_speed",
         "synthetic_gguf")
TOOLS_DIR = Path(common.__file__).parent
REPO = Path(__file__).resolve().parents[1]


def tool(name: str) -> types.ModuleType:
    return importlib.import_module(f"omnidraft.tools.{name}")


def refused(name: str, argv: list[str], capsys) -> str:
    """parse_args' exit status 2 and its message."""
    with pytest.raises(SystemExit) as exit:
        tool(name).parse_args(argv)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err
    return err


def test_the_package_holds_the_kept_tools_and_their_shared_module():
    found = {path.stem for path in TOOLS_DIR.glob("*.py")} - {"__init__"}
    assert found == {*TOOLS, "common"}
    assert not (REPO / "scripts").exists()


@pytest.mark.parametrize("name", TOOLS)
def test_help_exits_0_and_says_what_it_measures_and_how_to_run_it(name, capsys):
    module = tool(name)
    assert f"python -m omnidraft.tools.{name}" in module.__doc__  # how to run it
    with pytest.raises(SystemExit) as exit:
        module.parse_args(["--help"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m omnidraft.tools.{name}")
    assert module.__doc__.splitlines()[0] in out  # what it measures


@pytest.mark.parametrize("name", TOOLS)
def test_main_reads_its_arguments_before_anything_else(name, capsys):
    with pytest.raises(SystemExit) as exit:
        tool(name).main(["--no-such-option"])
    assert exit.value.code == 2
    assert f"python -m omnidraft.tools.{name}: error:" in capsys.readouterr().err


def test_no_tool_imports_another_and_only_common_reaches_the_kernel_loader():
    for path in TOOLS_DIR.glob("*.py"):
        text = path.read_text()
        for other in TOOLS:
            assert not re.search(rf"^\s*(from|import)\s+(\.|omnidraft\.tools\.)?{other}\b", text, re.MULTILINE), \
                f"{path.name} imports {other}"
        if path.stem != "common":
            assert "_library" not in text and "_SOURCES" not in text, path.name


# step_times

def test_step_times_defaults():
    args = tool("step_times").parse_args([])
    assert (args.target, args.context_tokens, args.reps, args.threads, args.json) == (
        "qwen2.5-coder-1.5b-instruct", 200, 15, None, None)


@pytest.mark.parametrize("argv, message", [
    (["--reps", "0"], "--reps: needs a whole number of 1 or more, not '0'"),
    (["--context-tokens", "many"], "--context-tokens: needs a whole number"),
    (["--json", "/no/such/folder/times.json"], "no folder '/no/such/folder'"),
])
def test_step_times_refuses(argv, message, capsys):
    assert message in refused("step_times", argv, capsys)


# kernel_ab

def test_kernel_ab_defaults_by_mode():
    parse = tool("kernel_ab").parse_args
    args = parse(["--against", "HEAD"])
    assert (args.against, args.reps, args.gemm, args.bits, args.shapes, args.rows, args.layers, args.prompt) == (
        "HEAD", 600, False, 4, "qwen", None, None, 0)
    assert parse(["--against", "HEAD", "--gemm"]).reps == 7
    assert parse(["--against", "HEAD", "--prompt", "200"]).reps == 15
    args = parse(["--against", "HEAD", "--gemm", "--rows", "64,200", "--layers", "2", "--reps", "9"])
    assert (args.rows, args.layers, args.reps) == ((64, 200), 2, 9)


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: --against"),
    (["--against", "no-such-revision-here"], "'no-such-revision-here' is not a git revision"),
    (["--against", "HEAD", "--gemm", "--rows", "1,x"], "--rows: needs whole numbers of 1 or more, comma-separated"),
    (["--against", "HEAD", "--gemm", "--bits", "5"], "invalid choice: 5"),
    (["--against", "HEAD", "--layers", "2"], "--layers only with --gemm"),
    (["--against", "HEAD", "--gemm", "--prompt", "200"], "one at a time"),
    (["--against", "HEAD", "--gemm", "--shapes", "gemma", "--layers", "2"], "--layers picks qwen's layers"),
])
def test_kernel_ab_refuses(argv, message, capsys):
    assert message in refused("kernel_ab", argv, capsys)


# attention_ab

def test_attention_ab_defaults():
    args = tool("attention_ab").parse_args(["--against", "HEAD"])
    assert (args.target, args.contexts, args.rows, args.reps, args.drafter, args.step) == (
        "qwen2.5-coder-1.5b-instruct", (200, 1000, 2000), (1, 5), 9, False, False)
    assert tool("attention_ab").parse_args(["--against", "HEAD", "--contexts", "200", "--rows", "1,4"]).rows == (1, 4)


@pytest.mark.parametrize("argv, message", [
    (["--against", "HEAD", "--contexts", "200,-1"], "--contexts: needs whole numbers"),
    (["--against", "HEAD", "--reps", "-3"], "--reps: needs a whole number of 1 or more"),
    (["--against", "HEAD", "--step", "--drafter"], "leave out --drafter"),
    (["--against", "no-such-revision-here"], "is not a git revision"),
])
def test_attention_ab_refuses(argv, message, capsys):
    assert message in refused("attention_ab", argv, capsys)


# conversation_speed

def test_conversation_speed_defaults_read_the_dev_prompts_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = tool("conversation_speed").parse_args([])
    assert args.prompts == REPO / "eval" / "dev.jsonl"
    assert (args.target, args.turns, args.max_new_tokens, args.llamacpp, args.window, args.json) == (
        "qwen2.5-coder-1.5b-instruct", 16, 128, False, None, None)
    assert tool("conversation_speed").parse_args(["--window", "0"]).window == 0  # 0: every position


@pytest.mark.parametrize("argv, message", [
    (["--turns", "many"], "--turns: needs a whole number"),
    (["--window", "-1"], "--window: needs a whole number of 0 or more"),
    (["--prompts", "no-such-prompts.jsonl"], "--prompts: no such file: no-such-prompts.jsonl"),
])
def test_conversation_speed_refuses(argv, message, capsys):
    assert message in refused("conversation_speed", argv, capsys)


# reply_agreement

def report(path: Path, outputs: dict) -> Path:
    path.write_text(json.dumps({"outputs": outputs}))
    return path


def test_reply_agreement_reads_two_reports(tmp_path, capsys):
    a = report(tmp_path / "a.json", {"target": [[1, 2, 3], [4, 5], [6]], "hf": [[1]]})
    b = report(tmp_path / "b.json", {"target": [[1, 2, 3], [4, 9], [7]], "omnidraft": [[1]]})
    module = tool("reply_agreement")
    assert module.parse_args([str(a), str(b)]).reports == [a, b]
    assert module.main([str(a), str(b)]) == 0
    assert capsys.readouterr().out == (
        "target: 1/3 the same, 1 part at the first token, on average at token 1.3\n")


@pytest.mark.parametrize("argv, message", [
    (["only-one.json"], "the following arguments are required: reports"),
    (["a.json", "no-such-report.json"], "no such file: no-such-report.json"),
])
def test_reply_agreement_refuses(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    report(tmp_path / "a.json", {})
    assert message in refused("reply_agreement", argv, capsys)


# learning_sweep

def test_learning_sweep_defaults():
    from omnidraft.core.engine import LearnSettings

    args = tool("learning_sweep").parse_args([])
    assert (args.train, args.dev) == (REPO / "eval" / "train.jsonl", REPO / "eval" / "dev.jsonl")
    assert (args.target, args.max_new_tokens, args.lrs, args.passes, args.threads, args.batch_size) == (
        "gemma-3-270m", 64, (1e-4, 3e-4, 1e-3), 2, 2, 8)
    assert (args.online, args.arrive, args.reviews, args.variants, args.variant_temperature) == (
        False, None, LearnSettings.reviews, 0, 0.7)
    assert args.cache == REPO / ".test-cache" / "learning-sweep"
    assert (args.learned, args.oracle, args.state_dir, args.replies, args.reply_ids) == (
        False, False, None, None, None)


def test_learning_sweep_takes_a_report_of_the_same_mode(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"chat": True, "max_new_tokens": 64, "outputs": {"target": [[1, 2]]}}))
    args = tool("learning_sweep").parse_args(["--chat", "--replies", str(path)])
    assert args.reply_ids == [[1, 2]]


@pytest.mark.parametrize("argv, message", [
    (["--lrs", "1e-4,fast"], "--lrs: needs numbers above 0, comma-separated"),
    (["--passes", "0"], "--passes: needs a whole number of 1 or more"),
    (["--learned"], "--learned needs a --state-dir"),
    (["--arrive", "1"], "--arrive only with --online"),
    (["--dev", "no-such-dev.jsonl"], "--dev: no such file: no-such-dev.jsonl"),
    (["--replies", "{report}"], "--replies needs a report of the same mode"),
    (["--replies", "{broken}"], "is not an omnidraft-bench report"),
])
def test_learning_sweep_refuses(argv, message, tmp_path, capsys):
    (tmp_path / "report.json").write_text(json.dumps(
        {"chat": True, "max_new_tokens": 64, "outputs": {"target": []}}))
    (tmp_path / "broken.json").write_text("{")
    argv = [arg.format(report=tmp_path / "report.json", broken=tmp_path / "broken.json") for arg in argv]
    assert message in refused("learning_sweep", argv, capsys)


# speed_floor

def test_speed_floor_defaults():
    args = tool("speed_floor").parse_args([])
    assert (args.target, args.threads, args.json) == (None, None, None)


def test_speed_floor_refuses(capsys):
    assert "--threads: needs a whole number of 1 or more, not '0'" in refused("speed_floor", ["--threads", "0"], capsys)


# memory_soak

def test_memory_soak_defaults():
    args = tool("memory_soak").parse_args([])
    assert (args.target, args.turns, args.max_new_tokens, args.learn_s, args.no_learning, args.warmup) == (
        "smollm2-135m-instruct", 400, 48, 60.0, False, 50)


@pytest.mark.parametrize("argv, message", [
    (["--learn-s", "-1"], "--learn-s: needs a number of 0 or more"),
    (["--learn-s", "0"], "--learn-s: needs a number above 0"),
    (["--turns", "0"], "--turns: needs a whole number of 1 or more"),
])
def test_memory_soak_refuses(argv, message, capsys):
    assert message in refused("memory_soak", argv, capsys)


# load_footprint

def test_load_footprint_defaults():
    args = tool("load_footprint").parse_args([])
    assert (args.target, args.drafter, args.max_new_tokens, args.threads, args.json, args.child) == (
        "qwen2.5-coder-1.5b-instruct", "smollm2-135m-instruct", 16, None, None, False)


@pytest.mark.parametrize("argv, message", [
    (["--max-new-tokens", "0"], "--max-new-tokens: needs a whole number of 1 or more"),
    (["--threads", "two"], "--threads: needs a whole number of 1 or more, not 'two'"),
])
def test_load_footprint_refuses(argv, message, capsys):
    assert message in refused("load_footprint", argv, capsys)


def test_load_footprint_sees_a_passing_peak_of_anonymous_memory():
    """The sampler's peak holds memory that came and went during the load: 256 MiB
    of anonymous pages held a fifth of a second, unmapped (so surely returned to the
    system, whatever malloc keeps) before the sampler stops."""
    import mmap
    import time

    import psutil

    module = tool("load_footprint")
    process = psutil.Process()
    anon_before, file_before = module.split_rss(process)
    assert anon_before > 0 and file_before > 0  # the interpreter's code is file-backed
    with module._Sampler(process) as sampled:
        held = mmap.mmap(-1, 256 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        held.write(b"\1" * (256 << 20))  # every page touched: resident
        time.sleep(0.2)
        held.close()
    assert sampled.peak_anon - anon_before > 200 << 20
    assert module.split_rss(process)[0] < sampled.peak_anon - (200 << 20)


# gui_check

def test_gui_check_defaults():
    module = tool("gui_check")
    args = module.parse_args([])
    assert (args.target, args.prompt, args.max_new_tokens, args.size, args.timeout, args.pause) == (
        "qwen2.5-coder-1.5b-instruct", [module.DEFAULT_PROMPT], 128, (1280, 800), 900.0, 0.0)
    assert (args.cache, args.shots, args.learn_seconds, args.highlight, args.keep_home) == (
        None, None, 0.0, False, False)
    args = module.parse_args(["--prompt", "one", "--prompt", "two", "--size", "800x600"])
    assert (args.prompt, args.size) == (["one", "two"], (800, 600))
    assert (args.attach, args.search) == ([], "reverse")
    args = module.parse_args(["--attach", __file__, "--search", "zebra"])
    assert (args.attach, args.search) == ([Path(__file__)], "zebra")


@pytest.mark.parametrize("argv, message", [
    (["--size", "big"], "--size: needs WIDTHxHEIGHT in pixels"),
    (["--size", "1280x0"], "--size: needs WIDTHxHEIGHT in pixels"),
    (["--timeout", "nan"], "--timeout: needs a number of 0 or more"),
    (["--cache", "/no/such/cache"], "--cache: no such folder: /no/such/cache"),
    (["--attach", "/no/such/file.py"], "--attach: no such file: /no/such/file.py"),
])
def test_gui_check_refuses(argv, message, capsys):
    assert message in refused("gui_check", argv, capsys)


# search_index_size

def test_search_index_size_defaults_and_its_synthetic_chats():
    module = tool("search_index_size")
    args = module.parse_args([])
    assert (args.chats, args.messages, args.user_chars, args.reply_chars, args.seed) == (1000, 20, 300, 1500, 0)
    chats = module.make_chats(module.parse_args(["--chats", "3", "--messages", "4"]))
    assert [len(c.messages) for c in chats] == [4, 4, 4]
    assert [m["role"] for m in chats[0].messages] == ["user", "assistant"] * 2
    assert "```python" in chats[0].messages[1]["content"]
    assert module.make_chats(args)[5].messages == module.make_chats(args)[5].messages  # seeded


@pytest.mark.parametrize("argv, message", [
    (["--chats", "0"], "--chats: needs a whole number of 1 or more"),
    (["--messages", "x"], "--messages: needs a whole number of 1 or more"),
    (["--reply-chars", "-5"], "--reply-chars: needs a whole number of 1 or more"),
])
def test_search_index_size_refuses(argv, message, capsys):
    assert message in refused("search_index_size", argv, capsys)


# code_block_stall

def test_code_block_stall_defaults_and_its_source():
    module = tool("code_block_stall")
    args = module.parse_args([])
    assert (args.lines, args.lang, args.stream_seconds, args.theme) == (2000, "python", 20.0, "light")
    assert module.parse_args(["--lang", ""]).lang == ""
    code = module.python_source(120)
    assert code.count("\n") == 119 and "def " in code


@pytest.mark.parametrize("argv, message", [
    (["--lines", "0"], "--lines: needs a whole number of 1 or more"),
    (["--stream-seconds", "0"], "--stream-seconds: needs a number above 0"),
    (["--theme", "blue"], "--theme: invalid choice"),
])
def test_code_block_stall_refuses(argv, message, capsys):
    assert message in refused("code_block_stall", argv, capsys)


# the shared module

def test_eval_files_come_from_the_checkout_else_the_current_directory(tmp_path, monkeypatch):
    assert common.eval_file("dev.jsonl") == REPO / "eval" / "dev.jsonl"
    monkeypatch.setattr(common, "REPO_ROOT", tmp_path / "installed")
    monkeypatch.chdir(tmp_path)
    assert common.eval_file("dev.jsonl") == Path("eval/dev.jsonl")  # missing: named as given
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "dev.jsonl").write_text('{"prompt": "hi"}\n')
    assert common.eval_file("dev.jsonl") == tmp_path / "eval" / "dev.jsonl"
    assert common.repo_root() == tmp_path


def test_use_build_switches_a_kernel_module_and_gives_its_loader_back():
    module = types.ModuleType("fake_kernels")

    def own(isa=None):
        return "own build"

    module._library = own
    common.use_build("a revision's build", module)
    assert module._library() == module._library("avx2") == "a revision's build"
    common.use_build("another", module)
    assert module._library() == "another"
    common.use_build(None, module)
    assert module._library is own


def test_use_build_switches_the_working_trees_kernels_until_given_back():
    build = common.kernels().build
    default = build.library()
    sentinel = object()
    common.use_build(sentinel)
    assert build.library() is sentinel
    common.use_build(None)
    assert build.library() is default


# make_streams

def _conversations_hold_together(rows: list[dict]) -> None:
    """A conversation's turns are adjacent, and a follow-up follows its conversation's earlier turn."""
    seen = set()
    for before, row in zip([None, *rows], rows):
        continues = before is not None and before["conversation"] == row["conversation"]
        assert continues or row["conversation"] not in seen, row["id"]
        assert row["kind"].endswith("-followup") == continues, row["id"]
        seen.add(row["conversation"])


def test_make_streams_is_deterministic_from_its_seed():
    make = tool("make_streams")
    assert make.build(make.SEED, 40) == make.build(make.SEED, 40)
    assert make.build(make.SEED, 40) != make.build(make.SEED + 1, 40)


def test_the_streams_are_two_realistic_single_user_streams_of_200_turns():
    make = tool("make_streams")
    streams = make.build()
    assert set(streams) == {"code-packaging.jsonl", "docs-click.jsonl"}
    for rows in streams.values():
        assert len(rows) == 200
        assert all(set(r) == {"id", "conversation", "kind", "source", "prompt"} for r in rows)
        assert len({r["id"] for r in rows}) == 200
        _conversations_hold_together(rows)
        assert 60 <= len({r["conversation"] for r in rows}) < 200  # some conversations go on
        assert len({r["prompt"] for r in rows}) > 100  # varied, not one template
        assert sum(len(json.dumps(r)) for r in rows) < 1_000_000
    code = streams["code-packaging.jsonl"]
    firsts = [r for r in code if not r["kind"].endswith("-followup")]
    assert all("```python\ndef " in r["prompt"] or "```python\n@" in r["prompt"] for r in firsts)  # pasted code
    assert max(len(r["prompt"]) for r in code) <= make.MAX_SOURCE_CHARS + 300
    assert {r["kind"] for r in firsts} >= {"explain", "test", "refactor", "add_param", "bug"}
    assert all(r["source"].startswith("packaging ") for r in code)
    # The same functions come back, as when someone works on one codebase.
    sources = [r["source"] for r in firsts]
    assert len(set(sources)) < len(sources) * 0.8
    assert all(r["source"].startswith("click ") for r in streams["docs-click.jsonl"])


def test_the_kept_streams_are_what_the_generator_makes(tmp_path):
    """eval/streams/ holds the generator's output for the seed kept, from the
    library versions its rows name."""
    make = tool("make_streams")
    kept = {path.name: [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
            for path in sorted((REPO / "eval" / "streams").glob("*.jsonl"))}
    from importlib.metadata import version

    named = {row["source"].split(":")[0] for rows in kept.values() for row in rows}
    installed = {f"packaging {version('packaging')}", f"click {version('click')}"}
    if named != installed:
        pytest.skip(f"the kept streams come from {sorted(named)}; installed: {sorted(installed)}")
    assert kept == make.build()
    assert make.main(["--out", str(tmp_path), "--turns", "12"]) == 0
    for name in kept:
        assert len((tmp_path / name).read_text(encoding="utf-8").splitlines()) == 12


def test_the_kept_long_pastes_are_what_the_generator_makes(tmp_path):
    """eval/long-paste.jsonl: six pasted modules of about 2,000 tokens (7,200
    characters or less of code, each cut at a top-level statement) with a question."""
    make = tool("make_streams")
    kept = [json.loads(line) for line in (REPO / "eval" / "long-paste.jsonl").read_text(encoding="utf-8").splitlines()]
    from importlib.metadata import version

    if {row["source"].split(":")[0] for row in kept} != {f"packaging {version('packaging')}"}:
        pytest.skip("the kept long pastes come from another packaging version")
    assert kept == make.paste_prompts(make.SEED)
    assert len(kept) == 6 and len({r["prompt"] for r in kept}) == 6
    for row in kept:
        code = row["prompt"].split("```python\n", 1)[1].removesuffix("\n```")
        assert 5000 < len(code) <= make.PASTE_CHARS
        compile(code, row["source"], "exec")  # whole statements: it parses
    assert make.main(["--paste", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "long-paste.jsonl").read_text(encoding="utf-8").splitlines() == \
        (REPO / "eval" / "long-paste.jsonl").read_text(encoding="utf-8").splitlines()


# synthetic_gguf

def test_synthetic_gguf_follows_the_q4_k_m_mix_and_writes_a_file_the_engine_reads(tmp_path, monkeypatch):
    """The 7B plan: llama.cpp's Q4_K_M choice of types; a small file of the same
    recipe (shapes shrunk) carries the source's tokenizer and the new shapes."""
    import gguf
    from omnidraft.core.models.gguf_header import read_header

    syn = tool("synthetic_gguf")
    plan = {name: (shape, kind) for name, shape, kind in syn.tensors(151936)}
    assert sum(kind == "Q6_K" for name, (_, kind) in plan.items() if "ffn_down" in name) == 14
    assert [i for i in range(28) if plan[f"blk.{i}.attn_v.weight"][1] == "Q6_K"] == \
        [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]
    assert plan["output.weight"] == ((151936, 3584), "Q6_K") and plan["token_embd.weight"][1] == "Q4_K"
    assert plan["blk.0.ffn_down.weight"][0] == (3584, 18944) and plan["blk.0.attn_k.bias"][0] == (512,)

    source = tmp_path / "source.gguf"
    writer = gguf.GGUFWriter(str(source), "qwen2")
    writer.add_name("Source")
    writer.add_block_count(1)
    writer.add_embedding_length(64)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(300)])
    writer.add_chat_template("{{ messages }}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for name, value in {"LAYERS": 2, "WIDTH": 256, "MLP": 512, "HEADS": 2, "KV_HEADS": 1}.items():
        monkeypatch.setattr(syn, name, value)
    monkeypatch.setattr(syn, "SHAPE_KEYS", {**syn.SHAPE_KEYS, "block_count": 2, "embedding_length": 256})
    out = tmp_path / "small.gguf"
    assert syn.main(["--out", str(out), "--source", str(source)]) == 0
    header = read_header(out)
    assert header.metadata["qwen2.block_count"] == 2 and header.metadata["qwen2.embedding_length"] == 256
    assert header.metadata["general.name"] == "Qwen2-7B-shaped (random weights)"
    assert header.metadata["tokenizer.chat_template"] == "{{ messages }}"
    types = {t.name: gguf.GGMLQuantizationType(t.ggml_type).name for t in header.tensors}
    assert types["blk.1.ffn_down.weight"] == "Q6_K" and types["blk.0.ffn_down.weight"] == "Q4_K"
    reader = gguf.GGUFReader(out)
    q4k = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    scales = np.frombuffer(bytes(q4k.data.reshape(-1, 144)[:, :4]), np.float16)
    assert np.isfinite(scales).all() and (scales > 0).all()


# serve_speed

def test_serve_speed_defaults_compare_one_and_four_clients_on_the_dev_prompts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = tool("serve_speed").parse_args([])
    assert args.prompts == REPO / "eval" / "dev.jsonl"
    assert (args.target, args.limit, args.max_new_tokens, args.clients, args.llamacpp, args.json) == (
        "qwen2.5-coder-1.5b-instruct", 16, 128, (1, 4), False, None)
    assert tool("serve_speed").parse_args(["--clients", "1,2,8"]).clients == (1, 2, 8)


@pytest.mark.parametrize("argv, message", [
    (["--clients", "0"], "--clients: needs whole numbers of 1 or more"),
    (["--limit", "none"], "--limit: needs a whole number"),
    (["--json", "no-such-folder/out.json"], "--json: no folder 'no-such-folder'"),
    (["--prompts", "no-such-prompts.jsonl"], "--prompts: no such file: no-such-prompts.jsonl"),
])
def test_serve_speed_refuses(argv, message, capsys):
    assert message in refused("serve_speed", argv, capsys)
