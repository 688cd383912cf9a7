"""The measurement tools' command lines (tools/, run as `python -m omnidraft.tools.NAME`):
each one's defaults, a bad value refused with exit 2 and a message before anything
loads, and --help. Nothing here loads a model or times anything."""

from __future__ import annotations

import importlib
import json
import re
import types
from pathlib import Path

import pytest
from omnidraft.tools import common

TOOLS = ("step_times", "kernel_ab", "attention_ab", "conversation_speed", "reply_agreement",
         "learning_sweep", "speed_floor", "memory_soak", "gui_check")
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


@pytest.mark.parametrize("argv, message", [
    (["--size", "big"], "--size: needs WIDTHxHEIGHT in pixels"),
    (["--size", "1280x0"], "--size: needs WIDTHxHEIGHT in pixels"),
    (["--timeout", "nan"], "--timeout: needs a number of 0 or more"),
    (["--cache", "/no/such/cache"], "--cache: no such folder: /no/such/cache"),
])
def test_gui_check_refuses(argv, message, capsys):
    assert message in refused("gui_check", argv, capsys)


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
