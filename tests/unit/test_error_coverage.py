"""Every error a user can hit is triggered by a test that checks its message.

The check reads the package's source: each ``raise SomeError(<message>)`` whose message has literal text (a
string, an f-string, a concatenation or ``.format`` of them) must either

- have its words in a test: some run of ``WINDOW`` consecutive words (at least ``MIN_CHARS`` characters) of one
  of the message's literal pieces appears in a file under ``tests/`` (regex escapes such as ``\\(`` and line breaks
  are read as plain text, so a ``pytest.raises(..., match=r"...")`` counts); a test that asserts the message
  triggers it, and a test that triggers it without asserting the message is not enough; or
- be marked internal, with the reason, on the ``raise`` line or the line above it:
  ``# internal: <why no user can hit this>`` (an invariant of our own code, a peer of ours answering out of
  protocol, a branch the type system already rules out).

A message built only from placeholders (``f"{name}: {why}"``) has no words of its own to look for: the raise that
composed ``why`` is the one checked. The raises are found by the scanner that also writes docs/reference/errors.md
(``verl_vllm_rm/dev/reference_docs/raises.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

from verl_vllm_rm.dev.reference_docs.raises import LiteralRaise, package_raises, words
from repo_paths import PACKAGE, TESTS

WINDOW = 4  # consecutive words of a literal piece
MIN_CHARS = 16  # ... spanning at least this many characters (shorter runs are phrases many messages share)


def text_of_tests(files: list[Path]) -> str:
    """The tests' source as plain words: regex escapes dropped, all whitespace one space."""
    return words(re.sub(r"\\(.)", r"\1", "\n".join(f.read_text() for f in files)))


def asserted(raise_: LiteralRaise, text: str) -> bool:
    for piece in raise_.pieces:
        tokens = piece.split(" ")
        size = min(WINDOW, len(tokens))
        for start in range(len(tokens) - size + 1):
            run = " ".join(tokens[start:start + size])
            if len(run) >= min(MIN_CHARS, len(piece)) and run in text:
                return True
    return False


def untested(package: Path, test_files: list[Path]) -> list[LiteralRaise]:
    text = text_of_tests(test_files)
    return [r for r in package_raises(package) if not r.internal and not asserted(r, text)]


def test_every_raise_with_a_message_is_asserted_by_a_test_or_marked_internal():
    missing = untested(PACKAGE, [f for f in TESTS.rglob("*.py") if f.name != Path(__file__).name])
    assert not missing, (f"{len(missing)} raise(s) with a message no test asserts: add a test that triggers each and "
                         "checks its message, or mark it '# internal: <why no user can hit it>':\n"
                         + "\n".join(map(str, missing)))


def test_the_check_finds_an_untested_raise_and_accepts_a_tested_or_internal_one(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "mod.py").write_text(
        "def f(x, name):\n"
        "    if x:\n"
        "        raise ValueError(f'reward model {name!r} has no server: set server_url')\n"
        "    if x is None:\n"
        "        # internal: f is only called by g, which checks x first\n"
        "        raise RuntimeError('x vanished between the check and the use')\n"
        "    raise KeyError(\n"
        "        'the option ' + name + ' is unknown to every section of the config')\n"
        "    raise ValueError(f'{name}: {x}')\n")
    test = tmp_path / "test_mod.py"
    test.write_text("def test():\n    match = r'has no server: set server_url'\n")
    assert [r.line for r in untested(package, [test])] == [7]
    test.write_text(test.read_text() + "    other = r'unknown to every section\\n of'\n")
    assert untested(package, [test]) == []
    test.write_text("def test():\n    match = r'no server'\n")  # too short a run to name one message
    assert [r.line for r in untested(package, [test])] == [3, 7]
