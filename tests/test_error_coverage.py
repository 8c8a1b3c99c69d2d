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
composed ``why`` is the one checked.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "verl_vllm_rm"
TESTS = ROOT / "tests"
WINDOW = 4  # consecutive words of a literal piece
MIN_CHARS = 16  # ... spanning at least this many characters (shorter runs are phrases many messages share)
MIN_PIECE = 12  # a literal piece shorter than this is punctuation around placeholders, not words to look for
INTERNAL = re.compile(r"#\s*internal:\s*\S")


@dataclass(frozen=True)
class LiteralRaise:
    path: str
    line: int
    pieces: tuple[str, ...]  # the message's literal text between placeholders
    internal: bool

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {' ... '.join(self.pieces)[:160]!r}"


def literal_pieces(node: ast.expr) -> list[str] | None:
    """The literal text of a message expression, split where values are filled in; None when it has none."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        pieces, current = [], ""
        for value in node.values:
            if isinstance(value, ast.Constant):
                current += value.value
            else:
                pieces.append(current)
                current = ""
        return [*pieces, current]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        pieces = (literal_pieces(node.left) or []) + (literal_pieces(node.right) or [])
        return pieces or None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        template = literal_pieces(node.func.value)
        return None if template is None else [p for t in template for p in re.split(r"\{[^}]*\}", t)]
    return None


def words(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def literal_raises(source: str, path: str) -> list[LiteralRaise]:
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args):
            continue
        pieces = literal_pieces(node.exc.args[0])
        pieces = tuple(p for p in (words(p) for p in pieces or []) if len(p) >= MIN_PIECE)
        if not pieces:
            continue
        marks = lines[max(0, node.lineno - 2):node.end_lineno]
        found.append(LiteralRaise(path, node.lineno, pieces, any(INTERNAL.search(m) for m in marks)))
    return sorted(found, key=lambda r: r.line)


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
    raises = [r for f in sorted(package.rglob("*.py"))
              for r in literal_raises(f.read_text(), str(f.relative_to(package.parent)))]
    return [r for r in raises if not r.internal and not asserted(r, text)]


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
