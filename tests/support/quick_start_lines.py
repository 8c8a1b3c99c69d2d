"""The GPU quick start's install lines (docs/quickstart.md, "On GPUs"), read as the tests of the GPU
lock read them."""

from __future__ import annotations

import shlex

from repo_paths import REPO as ROOT

ENVIRONMENTS = {".venv-server": "server-gpu", ".venv": "verl-gpu"}  # the quick start's environment -> its extra


def section(text: str, heading: str) -> str:
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def gpu_section() -> str:
    """docs/quickstart.md's "On GPUs": the install lines of record."""
    return section((ROOT / "docs" / "quickstart.md").read_text(), "## On GPUs")


def pip_lines(text: str) -> dict[str, list[list[str]]]:
    """``{environment: [pip install arguments, ...]}`` of every ``ENV/bin/pip install ...`` in ``text``, in order
    (a line ending in a backslash continues on the next)."""
    found: dict[str, list[list[str]]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        for command in line.split("&&"):
            if "/bin/pip install" not in command:
                continue
            words = shlex.split(command.split("#", 1)[0])
            if len(words) > 2 and words[0].endswith("/bin/pip") and words[1] == "install":
                found.setdefault(words[0].removesuffix("/bin/pip"), []).append(words[2:])
    return found
