"""A throwaway package for the checks that read the package's source (the raise scanner, its gate)."""

from __future__ import annotations

from pathlib import Path


def package_with(tmp_path: Path, source: str) -> Path:
    """``tmp_path/pkg`` holding one module, ``mod.py``, of ``source``; the package's folder."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "mod.py").write_text(source)
    return package
