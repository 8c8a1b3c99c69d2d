"""How ``make test`` shares its tests between two pytest-xdist workers (``-n 2``): whole modules, the main_ppo ones
together and first, every other module in a shuffled order.

Each module goes to one worker whole, so a module-scoped server starts once. The modules that run verl's
``main_ppo`` (:data:`MAIN_PPO_MODULES`) form one unit, run one after the other on one worker: no two main_ppo runs
share CI's 2 cores and 24 GB. They are the longest unit (about 25 of the suite's ~66 worker-minutes), so they
start first and the other worker works through every other module meanwhile.

The other modules of two session fixtures the unit builds on its worker (:data:`UNIT_FIXTURES`: the judge server,
the tiny task's policy) join the unit, after its main_ppo modules (:data:`COMPANION_MODULES`): the other worker
then never builds a second one.

The other modules run in an order shuffled by :func:`module_order_seed`, so a module that passes only after
another one (a session server left changed, say) fails somewhere: each module must pass whatever ran before it on
its worker. Each module's own tests keep their file order. A random half of the unit modules (:data:`UNIT_DIR`:
seconds each, no server) close the run: xdist hands each worker its next module when it is done with one, so a
worker that ends its last long module early takes them while the other finishes, and the two end within seconds
of each other (with long modules last, one worker idled a minute at the end of a run). The other half run among
the integration modules, so a unit module's leftovers meet them too.

xdist's own ``--dist loadgroup`` (groups from ``xdist_group`` marks) does not group under pytest 9: it renames
``item._nodeid``, which pytest 9 no longer reads. The scope is therefore taken from the test's module here.
"""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import pytest

MAIN_PPO_GROUP = "main_ppo"
#: an integer here gives the module order of that seed (the run's header prints the one it used)
ORDER_SEED_ENV = "TEST_MODULE_ORDER_SEED"
#: the in-process modules, the finer grains of work that close the run
UNIT_DIR = "tests/unit/"
#: in the order the unit runs them: the four-RM run first, as it takes the most memory (main_ppo, a managed
#: replica, two family servers) and then the fewest session servers are alive on either worker (a fresh clone's
#: run had it killed by Ray's memory monitor at 22.4 of 23.5 GB when it ran fifth)
MAIN_PPO_MODULES = (
    "tests/integration/dev/test_tiny_ppo_two_rms.py",
    "tests/integration/dev/test_demo.py",
    "tests/integration/dev/test_tiny_ppo.py",
    "tests/integration/dev/test_tiny_ppo_any_rm.py",
    "tests/integration/dev/test_tiny_ppo_online.py",
    "tests/integration/test_recipes.py",
)
#: session fixtures the unit's main_ppo modules build on their worker: the judge server (a start costs ~30 s of CPU,
#: and it holds 1.4 GB while it lives) and the tiny task (its policy's supervised warm-up: ~10 s)
UNIT_FIXTURES = ("judge_server", "tiny_task")
#: the other modules that ask for them: they join the unit, after its main_ppo modules and in the run's shuffled
#: order, so each is built once a run
COMPANION_MODULES = (
    "tests/integration/judge/test_client.py",
    "tests/integration/scoring/test_judging.py",
    "tests/unit/dev/cpu_harness/test_rollout.py",
)


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or the main_ppo group (its modules and their companions)."""
    module = module_of(nodeid)
    return MAIN_PPO_GROUP if module in MAIN_PPO_MODULES or module in COMPANION_MODULES else module


def module_order_seed(root: Path) -> int:
    """The seed of the run's module order: :data:`ORDER_SEED_ENV` when set, else the git tree of ``tests/`` at
    ``HEAD`` (each change to the tests gives a new order, and a commit always runs in its own: CI runs the order a
    fresh clone of the same commit ran), else 0 outside a git checkout. Every xdist worker derives the same one,
    so their collections agree."""
    if given := os.environ.get(ORDER_SEED_ENV, "").strip():
        try:
            return int(given)
        except ValueError:
            raise pytest.UsageError(f"{ORDER_SEED_ENV} must be an integer (the seed of the module order a run's "
                                    f"header printed), got {given!r}") from None
    try:
        tree = subprocess.run(["git", "rev-parse", "HEAD:tests"], cwd=root, capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return 0
    return int(tree[:8], 16)


def order_modules(items: list[pytest.Item], seed: int) -> None:
    """The main_ppo modules' tests first, in :data:`MAIN_PPO_MODULES`' order, their companions after them, then
    every other module whole, the modules in an order shuffled by ``seed``, every other unit module of that order
    moved to the end (the run's closing half); each module's tests in their own order."""
    by_module: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_module.setdefault(module_of(item.nodeid), []).append(item)
    main_ppo = [module for module in MAIN_PPO_MODULES if module in by_module]
    others = sorted(module for module in by_module if module not in MAIN_PPO_MODULES)
    random.Random(seed).shuffle(others)
    companions = [module for module in others if module in COMPANION_MODULES]
    others = [module for module in others if module not in COMPANION_MODULES]
    closing = set([module for module in others if module.startswith(UNIT_DIR)][1::2])
    ordered = [*main_ppo, *companions, *(m for m in others if m not in closing), *(m for m in others if m in closing)]
    items[:] = [item for module in ordered for item in by_module[module]]


class ModuleScheduling:
    """The xdist hook that hands out whole units (registered by ``conftest.py`` where xdist runs)."""

    @staticmethod
    def pytest_xdist_make_scheduler(config, log):
        from xdist.scheduler import LoadScopeScheduling

        class ByUnit(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return unit_of(nodeid)

        return ByUnit(config, log)
