"""The scanner of the package's ``raise`` statements (``dev/reference_docs/raises.py``): which raises it finds, the
literal pieces and the ``{hole}`` template of each message, its exception, enclosing function, ``# internal:``
mark and the lines the statement spans (``end_line``, ``covers``)."""

from __future__ import annotations

import ast

from verl_vllm_rm.dev.reference_docs.raises import (Hole, LiteralRaise, literal_pieces, literal_raises,
                                                    message_parts, package_raises, words)

SOURCE = '''\
import errors


raise RuntimeError("a module-level raise with words")


class Loader:
    def load(self, path, names):
        if not path:
            raise ValueError(f"no checkpoint at {self.path!r}: give one of {', '.join(names)}")
        if path is None:
            # internal: load is only called after the path is checked
            raise RuntimeError("the path vanished between the check and the use")
        raise errors.LoadError(
            "the file " + path + " is not a checkpoint"
            " of any known format")


def f(x, rows):
    raise KeyError("unknown option {name}, known: {}".format(x, name=x))  # internal: keys are checked before
    raise ValueError(f"{x}: {rows[0]}")
    raise ValueError("too short")
    raise TypeError
    raise TypeError(x)
    raise ValueError(f"row {rows[0]} has {len(rows)} tokens, more than {x.limit + 1} allowed")
'''


def parse(expression: str) -> ast.expr:
    return ast.parse(expression, mode="eval").body


def test_message_parts_are_literal_text_and_holes_named_as_the_code_names_the_value():
    assert message_parts(parse("'plain words'")) == ["plain words"]
    assert message_parts(parse("f'got {self.size!r} of {n} in {sorted(names)} at {rows[0]} ({a + b})'")) == [
        "got ", Hole("size"), " of ", Hole("n"), " in ", Hole("names"), " at ", Hole("rows"), " (", Hole("..."), ")"]
    assert message_parts(parse("'the file ' + path + ' is bad'")) == ["the file ", Hole("path"), " is bad"]
    assert message_parts(parse("'{} of {name}'.format(a, name=b)")) == ["", Hole("..."), " of ", Hole("name"), ""]


def test_a_message_without_literal_text_has_no_parts():
    assert message_parts(parse("f'{x}{y}'")) is None
    assert message_parts(parse("x")) is None
    assert message_parts(parse("str(x)")) is None
    assert message_parts(parse("42")) is None


def test_literal_pieces_are_the_text_between_holes_with_neighbouring_literals_joined():
    assert literal_pieces(["a ", "b ", Hole("x"), " c", Hole("y")]) == ["a b ", " c", ""]
    assert literal_pieces(["only text"]) == ["only text"]


def test_words_collapses_every_run_of_whitespace():
    assert words("  the   file\n\t is  bad ") == "the file is bad"


def test_every_raise_with_a_long_enough_literal_piece_is_found_in_line_order():
    found = literal_raises(SOURCE, "pkg/mod.py")
    assert [(r.line, r.exception, r.where) for r in found] == [
        (4, "RuntimeError", ""),
        (10, "ValueError", "Loader.load"),
        (13, "RuntimeError", "Loader.load"),
        (14, "LoadError", "Loader.load"),
        (20, "KeyError", "f"),
        (25, "ValueError", "f"),
    ]  # not: only holes (21), "too short" (22), no message (23, 24)
    assert {r.path for r in found} == {"pkg/mod.py"}


def test_each_raise_carries_its_pieces_and_its_template():
    by_line = {r.line: r for r in literal_raises(SOURCE, "pkg/mod.py")}
    assert by_line[10].pieces == ("no checkpoint at", ": give one of")  # a piece of 12 characters or more
    assert by_line[10].template == "no checkpoint at {path}: give one of {names}"
    assert by_line[14].pieces == ("is not a checkpoint of any known format",)
    assert by_line[14].template == "the file {path} is not a checkpoint of any known format"
    assert by_line[20].pieces == ("unknown option",)
    assert by_line[20].template == "unknown option {name}, known: {...}"
    assert by_line[25].pieces == ("tokens, more than",)  # "row", "has" and "allowed": too short to be words
    assert by_line[25].template == "row {rows} has {rows} tokens, more than {...} allowed"


def test_a_raise_marked_internal_on_its_line_or_the_line_above_is_internal():
    internal = {r.line: r.internal for r in literal_raises(SOURCE, "pkg/mod.py")}
    assert internal == {4: False, 10: False, 13: True, 14: False, 20: True, 25: False}


def test_a_raise_over_several_lines_ends_on_its_last_line_and_covers_each_of_them():
    by_line = {r.line: r for r in literal_raises(SOURCE, "pkg/mod.py")}
    assert (by_line[14].line, by_line[14].end_line) == (14, 16)
    assert [n for n in range(12, 19) if by_line[14].covers(n)] == [14, 15, 16]
    assert by_line[13].end_line == 13
    assert [n for n in range(11, 16) if by_line[13].covers(n)] == [13]


def test_a_raise_made_without_an_end_line_covers_its_first_line_only():
    raised = LiteralRaise("pkg/mod.py", 7, ("a message long enough",), False, "ValueError", "f", "x")
    assert raised.end_line == 0
    assert [n for n in range(5, 10) if raised.covers(n)] == [7]


def test_a_raise_prints_as_its_place_and_its_pieces():
    raised = LiteralRaise("pkg/mod.py", 7, ("no checkpoint at", "give one of these"), False, "ValueError", "f", "x")
    assert str(raised) == "pkg/mod.py:7: 'no checkpoint at ... give one of these'"


def test_package_raises_reads_every_module_with_paths_from_the_packages_parent(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def g():\n    raise ValueError('the first message of the package')\n")
    (package / "sub" / "b.py").write_text("\n\nraise OSError(f'cannot open {name}: it is not there')\n")
    found = package_raises(package)
    assert [(r.path, r.line, r.exception, r.where, r.pieces) for r in found] == [
        ("pkg/a.py", 2, "ValueError", "g", ("the first message of the package",)),
        ("pkg/sub/b.py", 3, "OSError", "", (": it is not there",)),
    ]
