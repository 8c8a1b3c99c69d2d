"""The recipes under recipes/ and which recipe extends which."""

from __future__ import annotations

from repo_paths import REPO

RECIPES = sorted(p for p in (REPO / "recipes").glob("*.sh") if p.name != "common.sh")
#: recipe -> the recipe that execs it with more overrides (and so runs it)
EXTENDED_BY = {inner: outer for outer in RECIPES for inner in RECIPES
               if f'exec bash "$(dirname "$0")/{inner.name}"' in outer.read_text()}
