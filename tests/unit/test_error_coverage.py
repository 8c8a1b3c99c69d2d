"""Every error a user can hit has a test that quotes its message.

Each ``raise SomeError(<message>)`` of the package whose message has literal text (a string, an f-string, a
concatenation or ``.format`` of them) must either

- be quoted by a test: some run of ``WINDOW`` consecutive words (at least ``MIN_CHARS`` characters) of one of the
  message's literal pieces is in a string of a file under ``tests/`` (a ``pytest.raises(..., match=r"...")``, an
  ``assert "..." in answer``; regex escapes read as plain text; docstrings and comments do not count); or
- be marked internal, with the reason, on the ``raise`` line or the line above it:
  ``# internal: <why no user can hit this>``.

That the quoting test also runs the raise is checked by the run itself: ``make test`` records every raise that
runs, in every process, and fails on a user-facing one that never ran (``tests/support/raise_record.py``).

A message built only from placeholders (``f"{name}: {why}"``) has no words of its own to look for: the raise that
composed ``why`` is the one checked. The raises are found by the scanner that also writes docs/reference/errors.md
(``verl_vllm_rm/dev/reference_docs/raises.py``).
"""

from __future__ import annotations

from pathlib import Path

from package_sources import package_with
from raise_record import asserted, quoting_sources, strings_of_tests
from repo_paths import PACKAGE
from verl_vllm_rm.dev.reference_docs.raises import LiteralRaise, package_raises


def unquoted(package: Path, test_files: list[Path]) -> list[LiteralRaise]:
    strings = strings_of_tests(test_files)
    return [r for r in package_raises(package) if not r.internal and not asserted(r, strings)]


def test_every_raise_with_a_message_is_quoted_by_a_test_or_marked_internal():
    missing = unquoted(PACKAGE, quoting_sources())
    assert not missing, (f"{len(missing)} raise(s) with a message no test quotes: add a test that triggers each and "
                         "checks its message, or mark it '# internal: <why no user can hit it>':\n"
                         + "\n".join(map(str, missing)))


def test_the_check_finds_an_unquoted_raise_and_accepts_a_quoted_or_internal_one(tmp_path):
    package = package_with(
        tmp_path,
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
    assert [r.line for r in unquoted(package, [test])] == [7]
    test.write_text(test.read_text() + "    other = r'unknown to every section\\n of'\n")
    assert unquoted(package, [test]) == []
    test.write_text("def test():\n    match = r'no server'\n")  # too short a run to name one message
    assert [r.line for r in unquoted(package, [test])] == [3, 7]
    # a docstring or a comment that names the message is no test of it
    test.write_text("def test():\n    '''has no server: set server_url'''\n"
                    "    # unknown to every section of the config\n    x = f'{1} unknown to every section of'\n")
    assert [r.line for r in unquoted(package, [test])] == [3]
