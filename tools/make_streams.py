"""Builds the personalization streams: one person's chats with the assistant, turn by turn.

    .venv/bin/python -m omnidraft.tools.make_streams [--seed N] [--turns 200] [--out eval/streams]

`omnidraft-bench --stream FILE` decodes a stream turn by turn, each turn scored
before the learner sees it (docs/learning.md, "Learning from your own stream").
Two streams, each from a library installed in the venv (no network), licences in
eval/README.md:

  code-packaging.jsonl  someone working on the `packaging` library's source:
                        explain this function, write a test for it, refactor it,
                        add a parameter, find the bug in an edited copy, with
                        the function pasted as a person pastes it; they stay on
                        one module for a while and come back to the same functions
  docs-click.jsonl      documentation questions about `click` while building a
                        command line tool: how do I ..., what does this parameter
                        do, an example from this docstring, the difference between two

`--paste` writes instead eval/long-paste.jsonl: six single turns that each paste
about 2,000 tokens of one `packaging` module (its opening, cut after a whole
statement) and ask one question about it, the long-paste case of
docs/performance.md (time to the first token is the prompt's read).

Follow-up turns continue a conversation (the same `conversation` id; the bench
sends the earlier turns and its own replies with them). The output depends only
on the seed (SEED, kept here) and the installed versions of the two libraries
(each row's `source` names the file). Lines: {"id", "conversation", "kind",
"source", "prompt"}.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import random
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from .common import positive_int, repo_root, tool_parser

SEED = 6301
TURNS = 200
# Pasted code at most this long: a 64-token reply stays the bulk of a turn's compute.
MAX_SOURCE_CHARS = 1200
MIN_LINES, MAX_LINES = 4, 30
CODE_MODULES = ("version.py", "specifiers.py", "requirements.py", "markers.py", "tags.py", "utils.py",
                "_tokenizer.py", "_parser.py", "metadata.py")


# ---------------------------------------------------------------- shared


def pick(rng: random.Random, options, **fields) -> str:
    return rng.choice(options).format(**fields)


def sessions(rng: random.Random, groups: list[str], turns: int, make_conversation) -> list[dict]:
    """Turns in sessions: a stretch of 12-28 turns on one group (a module, a topic),
    drawing conversations from a small working set of its items, so a person
    comes back to what they were working on. Cut to exactly `turns`."""
    rows: list[dict] = []
    previous = None
    n_conv = 0
    while len(rows) < turns:
        group = rng.choice([g for g in groups if g != previous] or groups)
        previous = group
        length = rng.randint(12, 28)
        start = len(rows)
        while len(rows) - start < length and len(rows) < turns:
            n_conv += 1
            rows.extend(make_conversation(group, n_conv)[: turns - len(rows)])
    return rows


def numbered(rows: list[dict], prefix: str) -> list[dict]:
    """Ids in stream order; each conversation's id from its first turn's position."""
    conv_ids: dict = {}
    out = []
    for i, row in enumerate(rows, 1):
        conv = conv_ids.setdefault(row["conversation"], f"{prefix}-c{len(conv_ids) + 1:03d}")
        out.append({"id": f"{prefix}-{i:03d}", "conversation": conv, "kind": row["kind"],
                    "source": row["source"], "prompt": row["prompt"]})
    return out


# ---------------------------------------------------------------- the codebase stream


@dataclass(frozen=True)
class Function:
    module: str  # e.g. specifiers.py
    name: str  # qualified: Class.method or function
    source: str  # dedented, as a person pastes it
    params: tuple[str, ...]


def library_functions(package: str, modules: tuple[str, ...]) -> dict[str, list[Function]]:
    """Functions and methods of a package's modules short enough to paste, by module."""
    root = Path(__import__(package).__file__).parent
    out: dict[str, list[Function]] = {}
    for module in modules:
        path = root / module
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        found = []
        for node, owner in _functions(ast.parse(text)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            count = node.end_lineno - first + 1
            if not MIN_LINES <= count <= MAX_LINES or node.name.startswith("__") and node.name != "__init__":
                continue
            source = textwrap.dedent("\n".join(lines[first - 1 : node.end_lineno]))
            if len(source) > MAX_SOURCE_CHARS:
                continue
            params = tuple(a.arg for a in node.args.args + node.args.kwonlyargs if a.arg not in ("self", "cls"))
            found.append(Function(module, f"{owner}.{node.name}" if owner else node.name, source, params))
        if found:
            out[module] = found
    return out


def _functions(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node, None
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    yield item, node.name


# (old, new): an edit that breaks a function the way a tired person does.
MUTATIONS = ((" <= ", " < "), (" < ", " <= "), (" >= ", " > "), (" == ", " != "), (" is None", " is not None"),
             (" and ", " or "), ("[1:]", "[2:]"), ("[0]", "[-1]"), ("return True", "return False"),
             (" + 1", " - 1"), (" not in ", " in "), ("startswith(", "endswith("), (".lower()", ".upper()"))

INTROS = ("", "", "", "I'm working on packaging's {module}. ", "This is from `packaging/{module}`. ",
          "Still on {module}. ", "Quick one. ", "Another one from {module}: ")

CODE_FIRST = {
    "explain": (
        "{intro}What does this function do?\n\n{code}",
        "{intro}Can you explain `{name}` step by step?\n\n{code}",
        "{intro}I don't quite follow this one. What is it for and when is it called?\n\n{code}",
        "{intro}Explain this to me like I'm new to the codebase:\n\n{code}",
        "{code}\n\nWhat's going on here? Especially the return value.",
        "{intro}Summarise what `{name}` returns for typical inputs.\n\n{code}",
    ),
    "test": (
        "{intro}Write a pytest test for `{name}`.\n\n{code}",
        "{intro}Can you add unit tests for this, covering the edge cases?\n\n{code}",
        "{code}\n\nI need tests for this. pytest, please, no mocks if possible.",
        "{intro}Write a few parametrized pytest cases for this function:\n\n{code}",
        "{intro}How would you test `{name}`? Give me the test code.\n\n{code}",
    ),
    "refactor": (
        "{intro}Refactor this to be more readable, same behaviour.\n\n{code}",
        "{intro}Can `{name}` be simplified?\n\n{code}",
        "{code}\n\nThis feels clunky. How would you rewrite it?",
        "{intro}Refactor `{name}`; keep the signature, reduce the nesting.\n\n{code}",
        "{intro}Clean this up a bit, please:\n\n{code}",
    ),
    "add_param": (
        ("{intro}Add a keyword-only `{param}` parameter to `{name}`: {effect}. The default must keep today's "
         "behaviour.\n\n{code}"),
        "{intro}I want `{name}` to take `{param}` ({effect}). Can you change it?\n\n{code}",
        "{code}\n\nPlease add an optional `{param}` argument here: {effect}.",
    ),
    "bug": (
        "{intro}I edited `{name}` and now the tests fail. Can you spot the bug?\n\n{code}",
        "{code}\n\nSomething is wrong with this version of `{name}`, the results look off. What did I break?",
        "{intro}Find the bug in this:\n\n{code}",
        "{intro}This returns the wrong answer for some inputs. Where's the mistake?\n\n{code}",
    ),
    "docstring": (
        "{intro}Write a docstring for `{name}`.\n\n{code}",
        "{code}\n\nAdd a proper docstring, with the arguments and what it returns.",
    ),
    "typehints": (
        "{intro}Add type hints to this:\n\n{code}",
        "{code}\n\nCan you fully annotate `{name}` so mypy --strict is happy?",
    ),
    "review": (
        "{intro}Review this function. Anything you'd change?\n\n{code}",
        "{code}\n\nCode review, please: correctness first, then style.",
    ),
}
CODE_WEIGHTS = {"explain": 5, "test": 4, "refactor": 3, "add_param": 2, "bug": 3, "docstring": 1,
                "typehints": 1, "review": 1}
CODE_FOLLOW = {
    "explain": ("Now write a test for it.", "What happens with an empty string?",
                "Could you show a short example of calling `{name}`?", "Is there an edge case where it surprises?",
                "Where else in packaging is `{name}` used, do you think?", "OK, and can you add type hints to it?"),
    "test": ("Use pytest.mark.parametrize for those cases.", "Add a case for invalid input.",
             "Trim it to the three most important cases.", "Can the tests avoid touching private helpers?",
             "Add a test for the boundary values too."),
    "refactor": ("Keep the public signature exactly the same, please.", "Add a docstring to your version.",
                 "Does your version behave the same for every input?",
                 "Write a test showing the old and the new version agree."),
    "add_param": ("Update the docstring to mention `{param}`.", "Write tests for the new parameter.",
                  "Can `{param}` be keyword-only?", "Show only the diff, please."),
    "bug": ("Write a regression test for that.", "Thanks. Show the minimal fix as a diff.",
            "Could the same mistake be elsewhere in {module}?"),
    "docstring": ("Use Google style instead.", "Shorter, please: a one-line summary and the arguments."),
    "typehints": ("Use `X | None` instead of Optional.", "Does that work on Python 3.8 too?"),
    "review": ("Which of those would you fix first?", "Show the code with your suggestions applied."),
}
PARAMS = (
    ("strict", "when True, raise ValueError on invalid input instead of falling back"),
    ("logger", "a logging.Logger that gets a debug line for each call, None for no logging"),
    ("max_length", "refuse inputs longer than this many characters"),
    ("normalize", "when False, keep the input exactly as given"),
    ("on_error", "a callback called with the exception instead of raising it"),
)


def code_stream(seed: int, turns: int) -> list[dict]:
    import packaging

    rng = random.Random(seed)
    by_module = library_functions("packaging", CODE_MODULES)
    kinds, weights = zip(*CODE_WEIGHTS.items())
    working: dict[str, list[Function]] = {}

    def conversation(module: str, n: int) -> list[dict]:
        pool = by_module[module]
        if module not in working or rng.random() < 0.3:  # a new stretch, or a new function joins it
            keep = working.get(module, [])[-4:]
            working[module] = [*keep, *rng.sample(pool, min(len(pool), 3 - len(keep) // 2))]
        fn = rng.choice(working[module])
        kind = rng.choices(kinds, weights)[0]
        source = fn.source
        if kind == "bug":
            edits = [(old, new) for old, new in MUTATIONS if old in source]
            if edits:
                old, new = rng.choice(edits)
                source = source.replace(old, new, 1)
            else:
                kind = "explain"
        param, effect = rng.choice(PARAMS)
        fields = {"name": fn.name, "module": module, "param": param, "effect": effect,
                  "code": f"```python\n{source}\n```"}
        fields["intro"] = pick(rng, INTROS, **fields)
        where = f"packaging {packaging.__version__}: packaging/{module}:{fn.name}"
        rows = [{"conversation": n, "kind": kind, "source": where, "prompt": pick(rng, CODE_FIRST[kind], **fields)}]
        for follow in rng.sample(CODE_FOLLOW[kind], _follow_ups(rng)):
            rows.append({"conversation": n, "kind": f"{kind}-followup", "source": where,
                         "prompt": follow.format(**fields)})
        return rows

    return numbered(sessions(rng, sorted(by_module), turns, conversation), "code-packaging")


def _follow_ups(rng: random.Random) -> int:
    """0, 1 or 2 follow-up turns: most questions are answered in one."""
    return rng.choices((0, 1, 2), (0.5, 0.35, 0.15))[0]


# ---------------------------------------------------------------- the documentation stream


@dataclass(frozen=True)
class Entry:
    topic: str  # what the object is about: options, commands, prompts, terminal, files, types
    name: str  # click.option, click.Context.invoke
    doc: str  # the docstring's first paragraph
    params: tuple[tuple[str, str], ...]  # (name, default as written, or "")


TOPICS = {
    "options": ("option", "argument", "Option", "Argument", "Parameter", "version_option", "help_option",
                "password_option", "confirmation_option", "BadParameter", "MissingParameter", "ParameterSource"),
    "commands": ("command", "group", "Command", "Group", "CommandCollection", "Context", "pass_context",
                 "pass_obj", "make_pass_decorator", "get_current_context", "UsageError", "Abort"),
    "terminal": ("echo", "secho", "style", "unstyle", "clear", "pause", "getchar", "echo_via_pager", "progressbar",
                 "prompt", "confirm", "edit", "launch", "wrap_text"),
    "types": ("Choice", "Path", "File", "IntRange", "FloatRange", "DateTime", "Tuple", "ParamType", "UUID",
              "open_file", "format_filename", "get_app_dir"),
}
METHODS = {"Context": ("invoke", "forward", "fail", "exit", "get_parameter_source", "ensure_object", "find_object",
                       "with_resource", "call_on_close"),
           "Group": ("add_command", "command", "group", "get_command", "list_commands"),
           "Command": ("main", "make_context", "get_help", "invoke"),
           "ParamType": ("convert", "fail", "shell_complete")}

HOWTO = {
    "options": ("make an option required", "give an option a default taken from an environment variable",
                "accept the same option several times", "add a --verbose flag that can be repeated (-vvv)",
                "add a --version option", "take a variable number of arguments",
                "make an option prompt for its value when it's missing", "validate an option with a callback",
                "have a boolean flag with --foo/--no-foo", "read a password without echoing it"),
    "commands": ("add subcommands to my CLI", "share an object between a group and its subcommands",
                 "call one command from another", "run code after every subcommand finishes",
                 "make a command that's hidden from --help", "load subcommands lazily from a plugin folder",
                 "exit with a specific status code", "show a custom error message and exit"),
    "terminal": ("print colored output", "show a progress bar while processing files", "ask the user to confirm",
                 "open the user's editor to write a message", "page long output", "print to stderr",
                 "wait for a single key press"),
    "types": ("only accept one of a fixed set of values", "accept a path that must exist and be a file",
              "read a file argument that can also be '-' for stdin", "accept an integer between 1 and 10",
              "parse a date option", "find the right config folder for my app", "write a custom parameter type"),
}
DOC_FIRST = {
    "howto": ("How do I {task} with click?", "In click, how can I {task}?", "What's the click way to {task}?",
              "I'm writing a CLI with click. I want to {task}. How?", "click: {task}. Example please.",
              "Can you show me how to {task} in click?"),
    "what": ("What does `{name}` do?", "What is `{name}` for in click?", "Explain `{name}` briefly.",
             "When would I use `{name}`?"),
    "param": ("What's the `{param}` parameter of `{name}` for?", "In `{name}`, what does `{param}` change?",
              "Is `{param}` of `{name}` required? What does it default to?",
              "How do I use `{name}` with `{param}`?"),
    "example": ("The docs for `{name}` say:\n\n> {doc}\n\nCan you give me a small example?",
                "I read this about `{name}`:\n\n> {doc}\n\nWhat does that mean in practice?",
                "> {doc}\n\nThat's from `{name}`'s docstring. Show me how it's used."),
    "compare": ("What's the difference between `{name}` and `{other}`?", "`{name}` or `{other}`: which should I use?",
                "When do I pick `{other}` over `{name}`?"),
}
DOC_WEIGHTS = {"howto": 5, "what": 2, "param": 3, "example": 3, "compare": 1}
DOC_FOLLOW = ("How do I test that with CliRunner?", "What if it's a group with subcommands?",
              "Can it also read the value from an environment variable?", "And with a default value?",
              "Put that into a complete script I can run.", "Does that work on Windows too?",
              "How would the --help output look?", "What error does the user see if it's wrong?",
              "Can you make it type-annotated?")


def click_entries() -> dict[str, list[Entry]]:
    """click's public functions, classes and a few of their methods with their
    documentation's first paragraph and parameters, by topic."""
    import click

    out: dict[str, list[Entry]] = {}
    for topic, names in TOPICS.items():
        entries = []
        for name in names:
            obj = getattr(click, name, None)
            if obj is None:
                continue
            entries.append(_entry(topic, f"click.{name}", obj))
            for method in METHODS.get(name, ()):
                if (m := getattr(obj, method, None)) is not None:
                    entries.append(_entry(topic, f"click.{name}.{method}", m))
        out[topic] = [e for e in entries if e.doc]
    return out


def _entry(topic: str, name: str, obj) -> Entry:
    doc = inspect.getdoc(obj) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    if len(first) > 400:
        first = first[:400].rsplit(" ", 1)[0] + " ..."
    try:
        sig = inspect.signature(obj)
        params = tuple((p.name, "" if p.default is p.empty else repr(p.default))
                       for p in sig.parameters.values()
                       if p.name not in ("self", "cls", "args", "kwargs", "attrs") and p.kind != p.VAR_KEYWORD)
    except (TypeError, ValueError):
        params = ()
    return Entry(topic, name, first, params)


def docs_stream(seed: int, turns: int) -> list[dict]:
    rng = random.Random(seed + 1)
    by_topic = click_entries()
    kinds, weights = zip(*DOC_WEIGHTS.items())
    version = _dist_version("click")  # click.__version__ is deprecated

    def conversation(topic: str, n: int) -> list[dict]:
        entries = by_topic[topic]
        entry = rng.choice(entries)
        kind = rng.choices(kinds, weights)[0]
        if kind == "param" and not entry.params:
            kind = "what"
        other = rng.choice([e for e in entries if e is not entry] or entries)
        fields = {"name": entry.name, "doc": entry.doc, "other": other.name,
                  "param": rng.choice(entry.params)[0] if entry.params else "",
                  "task": rng.choice(HOWTO[topic])}
        source = f"click {version}: {'how-to' if kind == 'howto' else entry.name}"
        rows = [{"conversation": n, "kind": kind, "source": source, "prompt": pick(rng, DOC_FIRST[kind], **fields)}]
        for follow in rng.sample(DOC_FOLLOW, _follow_ups(rng)):
            rows.append({"conversation": n, "kind": f"{kind}-followup", "source": source, "prompt": follow})
        return rows

    return numbered(sessions(rng, sorted(by_topic), turns, conversation), "docs-click")


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


# ---------------------------------------------------------------- long pastes

# About 2,000 of Qwen2.5's tokens of Python source (3.5-3.7 characters a token).
PASTE_CHARS = 7200
PASTE_MODULES = ("version.py", "specifiers.py", "markers.py", "tags.py", "metadata.py", "requirements.py")
PASTE_QUESTIONS = (
    "Here is `packaging/{module}`. Explain what this file does, part by part.",
    "Here is the start of `packaging/{module}`. Which function here would you test first, and how?",
    "Here is `packaging/{module}`. Is there anything in it you would simplify? Show the change.",
    "Can you walk me through the main class in this code from `packaging/{module}`?",
    "Here is `packaging/{module}`. Write a short docstring summary for each function that lacks one.",
    "This is `packaging/{module}`. Where could this code raise, and with which message?",
)


def _statements(tree: ast.Module):
    """Module-level statements and those directly in a top-level class or function:
    a file cut after any of them still parses."""
    for node in tree.body:
        yield node
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            yield from node.body


def paste_prompts(seed: int) -> list[dict]:
    """One module's opening a prompt, cut after the last whole statement within
    PASTE_CHARS (at the top level or in a top-level class or function)."""
    import packaging

    rng = random.Random(seed)
    root = Path(packaging.__file__).parent
    questions = rng.sample(PASTE_QUESTIONS, len(PASTE_MODULES))
    rows = []
    for i, (module, question) in enumerate(zip(PASTE_MODULES, questions), 1):
        text = (root / module).read_text(encoding="utf-8")
        lines = text.splitlines()
        ends = [node.end_lineno for node in _statements(ast.parse(text))]
        cut = max((e for e in ends if len("\n".join(lines[:e])) <= PASTE_CHARS), default=ends[0])
        code = "\n".join(lines[:cut])
        rows.append({"id": f"long-paste-{i}", "kind": "code",
                     "source": f"packaging {packaging.__version__}: packaging/{module}, lines 1-{cut}",
                     "prompt": question.format(module=module) + f"\n\n```python\n{code}\n```"})
    return rows


# ---------------------------------------------------------------- command line

STREAMS = {"code-packaging.jsonl": code_stream, "docs-click.jsonl": docs_stream}


def build(seed: int = SEED, turns: int = TURNS) -> dict[str, list[dict]]:
    """Each stream's rows, by file name."""
    return {name: make(seed, turns) for name, make in STREAMS.items()}


def write(streams: dict[str, list[dict]], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, rows in streams.items():
        path = out / name
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        written.append(path)
    return written


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = tool_parser(__file__, __doc__)
    ap.add_argument("--seed", type=int, default=SEED, help=f"the streams' seed (default {SEED}, the one kept)")
    ap.add_argument("--turns", type=positive_int, default=TURNS, help=f"turns a stream (default {TURNS})")
    ap.add_argument("--out", type=Path, default=None, help="where the JSONL files go (default eval/streams, "
                    "with --paste eval)")
    ap.add_argument("--paste", action="store_true", help="write long-paste.jsonl instead of the streams")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = repo_root() / "eval" / ("" if args.paste else "streams")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.paste:
        path, = write({"long-paste.jsonl": paste_prompts(args.seed)}, args.out)
        print(f"wrote {path}: {len(path.read_text(encoding='utf-8').splitlines())} prompts, {path.stat().st_size} bytes")
        return 0
    for path in write(build(args.seed, args.turns), args.out):
        rows = path.read_text(encoding="utf-8").splitlines()
        conversations = len({json.loads(r)["conversation"] for r in rows})
        print(f"wrote {path}: {len(rows)} turns in {conversations} conversations, {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
