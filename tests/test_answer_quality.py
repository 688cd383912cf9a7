"""The default target is useful, not just fast: its greedy replies to coding
questions, drafted by SmolLM2 across vocabularies through the app's chat path,
contain Python that runs and returns the right values (integration tier)."""

import re
import subprocess
import sys
import textwrap

import pytest
from omnidraft.core.decoding.sampling import GenerationConfig
from omnidraft.core.engine import Engine
from omnidraft.core.events import TurnFinished
from omnidraft.core.models.catalog import DEFAULT_TARGET, SMOLLM2_ID

CASES = [
    (
        ("Write a Python function `fibonacci(n)` that returns the n-th Fibonacci number, "
         "with fibonacci(0) == 0 and fibonacci(1) == 1."),
        "assert [fibonacci(n) for n in range(11)] == [0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55]",
    ),
    (
        "Write a Python function `is_prime(n)` that checks whether a number is prime.",
        ("assert [n for n in range(-3, 60) if is_prime(n)] == "
         "[2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59]"),
    ),
    (
        ("Write a Python function `reverse_words(s)` that returns the words of the sentence s "
         "in reverse order, separated by single spaces."),
        ("assert reverse_words('the quick brown fox') == 'fox brown quick the'\n"
         "assert reverse_words('hello') == 'hello'"),
    ),
]


def python_blocks(reply: str) -> list[str]:
    return re.findall(r"```(?:python|py)?\n(.*?)```", reply, re.DOTALL)


@pytest.fixture(scope="module")
def engine():
    engine = Engine(drafter_id=SMOLLM2_ID)
    engine.load_target(DEFAULT_TARGET)
    return engine


@pytest.mark.integration
@pytest.mark.parametrize("prompt, check", CASES, ids=["fibonacci", "is_prime", "reverse_words"])
def test_default_target_writes_working_code(engine, prompt, check):
    events = list(engine.chat([{"role": "user", "content": prompt}], GenerationConfig(max_new_tokens=320)))
    done = events[-1]
    assert isinstance(done, TurnFinished) and done.stats.method == "omnidraft"
    blocks = python_blocks(done.text)
    assert blocks, f"no Python code block in the reply:\n{done.text}"
    # Run in a separate interpreter: a reply's example code may print, loop or ask for input.
    program = blocks[0] + "\n\n" + textwrap.dedent(check) + "\nprint('CHECKED')\n"
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         timeout=30, stdin=subprocess.DEVNULL, check=False)
    assert "CHECKED" in run.stdout, f"reply:\n{done.text}\n\nstderr:\n{run.stderr}"
