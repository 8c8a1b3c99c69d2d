"""What keeps tests/unit in-process: while a unit module runs, starting the reward server or verl's trainer (a
python process running either) or Ray fails, naming what started and where the test belongs (applied by
tests/unit/conftest.py)."""

from __future__ import annotations

import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

#: what a command line starts that a unit test must not: the reward server, verl's trainer
HEAVY_COMMANDS = ("verl_vllm_rm.server", "verl.trainer.main_ppo")


class StartsAComponent(RuntimeError):
    pass


@contextmanager
def nothing_heavy_starts() -> Iterator[None]:
    popen_init = subprocess.Popen.__init__

    def refuse_heavy(self, args, *rest, **kwargs):
        argv = [str(a) for a in ([args] if isinstance(args, (str, bytes)) else list(args))]
        python = bool(argv) and Path(argv[0].split()[0]).name.startswith("python")
        started = next((c for c in HEAVY_COMMANDS if python and any(c in a for a in argv)), None)
        if started is not None:
            raise StartsAComponent(f"a unit test started {started}: move it to tests/integration")
        popen_init(self, args, *rest, **kwargs)

    def refuse_ray(*args, **kwargs):
        raise StartsAComponent("a unit test started Ray (ray.init): move it to tests/integration")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "__init__", refuse_heavy)
        try:
            import ray
        except ImportError:
            pass
        else:
            patch.setattr(ray, "init", refuse_ray)
        yield
