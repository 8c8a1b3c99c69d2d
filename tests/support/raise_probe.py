"""Which of the package's ``raise`` statements ran, in every Python process of a test run: the tests' own, the
reward servers' (API server, engine core, workers), ``main_ppo``'s and its Ray workers'.

``make test`` installs this file into both environments (``python tests/support/raise_probe.py install PYTHON...``:
a copy named :data:`MODULE` and a ``.pth`` line that imports it when :data:`DIR_ENV` is set) and sets
:data:`DIR_ENV`. In such a process the package's modules are compiled with one call before each ``raise``: the
first time a process runs a raise, its ``path:line`` is appended to ``$DIR/seen/<pid>.log``. A line is written
when the raise runs, so a process that is SIGKILLed (a fault test's trainer) has left what it ran.

Why not coverage.py: on this Python (3.11, no ``sys.monitoring``) its tracer sees every call of every process; a
reward server took 35 s to start under it instead of 24 s, and the suite starts about sixty. This costs one
compile of each imported package module (cached in ``$DIR/code``) and a call per raise.

Standard library only: the server environment runs it too.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.abc
import importlib.machinery
import marshal
import os
import shutil
import subprocess
import sys

DIR_ENV = "VERL_VLLM_RM_RAISE_PROBE_DIR"
MODULE = "verl_vllm_rm_raise_probe"  # its name in an environment's site-packages
PACKAGE = "verl_vllm_rm"
PROBE = "__verl_vllm_rm_raise_probe__"  # the name the instrumented modules call
VERSION = "1"  # part of the code cache's key: change it when the instrumentation changes


class _BeforeEachRaise(ast.NodeTransformer):
    def visit_Raise(self, node: ast.Raise) -> list[ast.stmt]:
        call = ast.Expr(ast.Call(ast.Name(PROBE, ast.Load()), [ast.Constant(node.lineno)], []))
        return [ast.fix_missing_locations(ast.copy_location(call, node)), node]


def instrumented(source: str | bytes, path: str):
    """``source`` compiled with a call to :data:`PROBE` (given the line) before each ``raise``; every other line
    keeps its number."""
    return compile(_BeforeEachRaise().visit(ast.parse(source, path)), path, "exec", dont_inherit=True)


class Recorder:
    """Writes a process's first run of each raise to ``directory/seen/<pid>.log`` (the pid at the time: a forked
    child writes its own file)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.seen: set[tuple[str, int]] = set()

    def for_module(self, relative_path: str):
        def seen(line: int) -> None:
            if (relative_path, line) not in self.seen:
                self.seen.add((relative_path, line))
                seen_dir = os.path.join(self.directory, "seen")
                os.makedirs(seen_dir, exist_ok=True)  # a new run's start empties it (tests/support/raise_record.py)
                with open(os.path.join(seen_dir, f"{os.getpid()}.log"), "a") as log:
                    log.write(f"{relative_path}:{line}\n")
        return seen


class _Loader(importlib.machinery.SourceFileLoader):
    recorder: Recorder
    root: str  # the package's parent directory: paths are recorded relative to it

    def get_code(self, fullname: str):
        path = self.get_filename(fullname)
        stat = os.stat(path)
        key = hashlib.sha1(f"{VERSION}:{path}:{stat.st_mtime_ns}:{stat.st_size}".encode()).hexdigest()
        cached = os.path.join(self.recorder.directory, "code", key)
        try:
            with open(cached, "rb") as file:
                return marshal.load(file)
        except (OSError, EOFError, ValueError):
            pass
        code = instrumented(self.get_data(path), path)
        partial = f"{cached}.{os.getpid()}"
        with open(partial, "wb") as file:
            marshal.dump(code, file)
        os.replace(partial, cached)  # atomic: concurrent processes never read half a file
        return code

    def exec_module(self, module) -> None:
        module.__dict__[PROBE] = self.recorder.for_module(os.path.relpath(self.path, self.root))
        super().exec_module(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the package's modules with the finders after it (an editable install's own included) and gives
    their source files the instrumenting loader."""

    def __init__(self, recorder: Recorder, package: str) -> None:
        self.recorder, self.package = recorder, package

    def find_spec(self, fullname, path, target=None):
        if fullname != self.package and not fullname.startswith(f"{self.package}."):
            return None
        for finder in sys.meta_path:
            if isinstance(finder, _Finder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            if type(spec.loader) is importlib.machinery.SourceFileLoader:
                loader = _Loader(fullname, spec.origin)
                loader.recorder = self.recorder
                root = spec.origin  # .../<package>/<sub>/<name>.py or .../<sub>/__init__.py: up to above <package>
                for _ in range(fullname.count(".") + (2 if spec.submodule_search_locations is not None else 1)):
                    root = os.path.dirname(root)
                loader.root = root
                spec.loader = loader
            return spec
        return None


def install(directory: str, package: str = PACKAGE) -> _Finder:
    """Instrument the imports of ``package`` in this process from now on, recording into ``directory``."""
    os.makedirs(os.path.join(directory, "code"), exist_ok=True)  # seen/: the recorder makes it when it writes
    finder = _Finder(Recorder(directory), package)
    sys.meta_path.insert(0, finder)
    return finder


def seen_lines(directory: str) -> set[tuple[str, int]]:
    """Every ``(path, line)`` any process recorded into ``directory``."""
    found = set()
    seen_dir = os.path.join(directory, "seen")
    for name in os.listdir(seen_dir) if os.path.isdir(seen_dir) else ():
        with open(os.path.join(seen_dir, name)) as log:
            for entry in log.read().split():
                path, _, line = entry.rpartition(":")
                found.add((path, int(line)))
    return found


def install_into(python: str) -> None:
    """Copy this file into ``python``'s site-packages as :data:`MODULE`, with the ``.pth`` line that imports it
    in each process started while :data:`DIR_ENV` is set (a no-op otherwise)."""
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    shutil.copyfile(__file__, os.path.join(site, f"{MODULE}.py"))
    with open(os.path.join(site, f"{MODULE}.pth"), "w") as pth:
        pth.write(f"import os; os.environ.get({DIR_ENV!r}) and __import__({MODULE!r}).install_from_env()\n")


def install_from_env() -> None:
    """The ``.pth`` line's call: once a process (a venv's ``lib64`` links to ``lib``, so site may read it twice)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        install(os.environ[DIR_ENV])


if __name__ == "__main__":
    if sys.argv[1:2] != ["install"] or len(sys.argv) < 3:
        sys.exit(f"usage: {sys.argv[0]} install PYTHON [PYTHON...]  (each an environment's interpreter)")
    for interpreter in sys.argv[2:]:
        install_into(interpreter)
