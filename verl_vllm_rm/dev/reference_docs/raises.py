"""The package's ``raise`` statements with a message: the one scanner behind ``tests/unit/test_error_coverage.py``
(every such message is asserted by a test) and ``docs/reference/errors.md`` (every message a user can hit).

A message is a string, an f-string, a concatenation or a ``.format`` of them; its parts are literal text and
holes where values are filled in. A raise marked ``# internal: <why>`` on its line or the line above is one no
user can hit (an invariant of our own code, a peer of ours answering out of protocol).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

MIN_PIECE = 12  # a literal piece shorter than this is punctuation around placeholders, not words to look for
INTERNAL = re.compile(r"#\s*internal:\s*\S")


@dataclass(frozen=True)
class Hole:
    """Where a message has a value filled in; ``name`` is what the value is called in the code."""

    name: str


@dataclass(frozen=True)
class LiteralRaise:
    path: str
    line: int
    pieces: tuple[str, ...]  # the message's literal text between placeholders
    internal: bool
    exception: str  # the raised class's name
    where: str  # the enclosing function's qualified name ("" at module level)
    template: str  # the message with its holes shown as {name}
    end_line: int = 0  # the statement's last line (a raise spans several); 0: its first

    def covers(self, line: int) -> bool:
        """Whether ``line`` is one of the statement's (a traceback names the line the raise was executed at)."""
        return self.line <= line <= max(self.line, self.end_line)

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {' ... '.join(self.pieces)[:160]!r}"


def _hole(node: ast.expr) -> Hole:
    """A filled-in value named as the code names it: ``{self.name!r}`` -> name, ``{', '.join(names)}`` -> names."""
    if isinstance(node, ast.Name):
        return Hole(node.id)
    if isinstance(node, ast.Attribute):
        return Hole(node.attr)
    if isinstance(node, ast.Call) and node.args:
        return _hole(node.args[0])
    if isinstance(node, ast.Subscript):
        return _hole(node.value)
    return Hole("...")


def message_parts(node: ast.expr) -> list[str | Hole] | None:
    """A message expression as literal text and holes; None when it has no literal text."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        parts: list[str | Hole] = [node.value]
    elif isinstance(node, ast.JoinedStr):
        parts = [v.value if isinstance(v, ast.Constant) else _hole(v.value) for v in node.values]
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        parts = [*(message_parts(node.left) or [_hole(node.left)]), *(message_parts(node.right) or [_hole(node.right)])]
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        template = message_parts(node.func.value)
        parts = [] if template is None else [Hole(p or "...") if i % 2 else p
                                             for t in template for i, p in
                                             enumerate(re.split(r"\{([^}]*)\}", t) if isinstance(t, str) else [t])]
    else:
        return None
    return parts if any(isinstance(p, str) for p in parts) else None


def literal_pieces(parts: list[str | Hole]) -> list[str]:
    """The literal text between the holes (consecutive literals joined)."""
    pieces, current = [], ""
    for part in parts:
        if isinstance(part, Hole):
            pieces.append(current)
            current = ""
        else:
            current += part
    return [*pieces, current]


def words(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _enclosing_functions(tree: ast.Module) -> dict[ast.Raise, str]:
    """Each ``raise`` -> the qualified name of the function (or class) it is in."""
    found: dict[ast.Raise, str] = {}

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, f"{scope}.{child.name}" if scope else child.name)
            else:
                if isinstance(child, ast.Raise):
                    found[child] = scope
                visit(child, scope)

    visit(tree, "")
    return found


def literal_raises(source: str, path: str) -> list[LiteralRaise]:
    """Every ``raise X(<message>)`` in ``source`` whose message has a literal piece of ``MIN_PIECE`` characters."""
    lines, tree = source.splitlines(), ast.parse(source)
    found = []
    for node, where in _enclosing_functions(tree).items():
        if not (isinstance(node.exc, ast.Call) and node.exc.args):
            continue
        parts = message_parts(node.exc.args[0]) or []
        pieces = tuple(p for p in (words(p) for p in literal_pieces(parts)) if len(p) >= MIN_PIECE) if parts else ()
        if not pieces:
            continue
        marks = lines[max(0, node.lineno - 2):node.end_lineno]
        template = words("".join(f"{{{p.name}}}" if isinstance(p, Hole) else p for p in parts))
        found.append(LiteralRaise(path, node.lineno, pieces, any(INTERNAL.search(m) for m in marks),
                                  ast.unparse(node.exc.func).split(".")[-1], where, template, node.end_lineno))
    return sorted(found, key=lambda r: r.line)


def package_raises(package: Path) -> list[LiteralRaise]:
    """:func:`literal_raises` over every module of ``package``, paths relative to its parent."""
    return [r for f in sorted(package.rglob("*.py"))
            for r in literal_raises(f.read_text(), str(f.relative_to(package.parent)))]
