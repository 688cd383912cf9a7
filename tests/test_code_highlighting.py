"""Syntax highlighting in replies' code blocks: the fence's language or a guess,
Pygments' colours for the theme in use, re-coloured by a theme switch, and a
2,000-line block coloured in full with only its visible lines laid out."""

from __future__ import annotations

import pytest
from omnidraft.app import theme
from omnidraft.app.markdown_blocks import CODE_MAX_LINES, choose_lexer
from PySide6.QtGui import QColor

from tests.gui_helpers import answer, scripted_window

PYTHON = '''def reverse(text):
    """Return the text backwards."""
    return text[::-1]  # slicing
'''
C = '#include <stdio.h>\n\nint main(void) {\n    printf("hi\\n");\n    return 0;\n}\n'


@pytest.fixture
def scripted(home, qapp, qt_loop):
    with scripted_window(qapp) as pair:
        yield pair
    theme.apply_theme(qapp, "light")


def reply_blocks(win, worker, qtbot, text: str):
    """The code blocks of a reply the engine wrote, once they are coloured."""
    win.pane.send_message("Show me")
    answer(win, worker, text)
    blocks = win.chat.current_reply().body.code_blocks()
    qtbot.waitUntil(lambda: all(b.highlighted() for b in blocks), timeout=20_000)
    return blocks


def colours(block, line: int) -> dict[str, str]:
    """The coloured words of one line: word -> its colour."""
    doc_block = block.view.document().findBlockByNumber(line)
    text = doc_block.text()
    out = {}
    for r in doc_block.layout().formats():
        if r.format.foreground().style() != 0:
            out[text[r.start:r.start + r.length]] = r.format.foreground().color().name()
    return out


def test_a_fenced_block_is_coloured_for_its_language_and_follows_the_theme(scripted, qtbot):
    win, worker = scripted
    win.show()
    [block] = reply_blocks(win, worker, qtbot, f"Here:\n\n```python\n{PYTHON}```\n")
    assert block.lang.text() == "python"
    light = colours(block, 0)
    assert light["def"] == "#008000" and light["reverse"] == "#0000ff"  # Pygments' default style
    assert colours(block, 2)["# slicing"] == "#3d7b7b"
    assert block.code() == PYTHON.rstrip("\n")  # Copy still gives the code as written

    win.apply_settings({"theme": "dark"})
    qtbot.waitUntil(block.highlighted, timeout=10_000)
    dark = colours(block, 0)
    assert dark["def"] == "#ff7b72" and dark["def"] != light["def"]  # github-dark on the dark theme
    for colour in dark.values():  # readable on the dark code background
        assert QColor(colour).lightness() > QColor(theme.DARK.code_bg).lightness() + 60

    win.apply_settings({"theme": "light"})
    qtbot.waitUntil(block.highlighted, timeout=10_000)
    assert colours(block, 0) == light


def test_an_unnamed_block_gets_a_guess_and_prose_stays_plain(scripted, qtbot):
    win, worker = scripted
    win.show()
    guessed, plain = reply_blocks(win, worker, qtbot, f"```\n{C}```\n\nand\n\n```\nJust some words, nothing more.\n```\n")
    assert guessed.lang.text() == "c"
    assert colours(guessed, 0)["<stdio.h>"] and colours(guessed, 2)["int"] == "#b00040"  # a C type
    assert plain.lang.text() == "code" and colours(plain, 0) == {}


def test_guesses_outside_the_common_languages_fall_back_to_plain_text():
    assert choose_lexer("", "Just some words, nothing more.")[0] is None
    assert choose_lexer("rust", "")[0].aliases[0] == "rust" and choose_lexer("rust", "")[1]
    lexer, named = choose_lexer("pseudo", C)  # an unknown name: guessed as for none
    assert not named and lexer.aliases[0] == "c"


def test_a_2000_line_block_is_coloured_in_full_and_only_its_view_is_laid_out(scripted, qtbot):
    win, worker = scripted
    win.resize(1200, 800)
    win.show()
    lines = [f"def f{i}(x):  # number {i}" if i % 2 == 0 else f"    return x + {i}" for i in range(2000)]
    [block] = reply_blocks(win, worker, qtbot, "```python\n" + "\n".join(lines) + "\n```\n")
    assert block.view.document().blockCount() == 2000
    assert colours(block, 1998)["def"] == "#008000"  # the last lines too
    # As tall as CODE_MAX_LINES lines; the rest scrolls inside the block.
    line = block.view.blockBoundingRect(block.view.document().firstBlock()).height()
    assert block.view.height() < (CODE_MAX_LINES + 3) * line
    assert block.view.verticalScrollBar().maximum() > 0
