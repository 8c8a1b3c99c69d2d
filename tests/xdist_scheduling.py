"""How ``make test`` shares its tests between two pytest-xdist workers (``-n 2``): whole modules, the main_ppo ones
together and first.

Each module goes to one worker whole, so a module-scoped server starts once. The modules that run verl's
``main_ppo`` (:data:`MAIN_PPO_MODULES`) form one unit, run one after the other on one worker: no two main_ppo runs
share CI's 2 cores and 24 GB. They are the longest unit (about 25 of the suite's ~66 worker-minutes), so they
start first and the other worker works through every other module meanwhile.

xdist's own ``--dist loadgroup`` (groups from ``xdist_group`` marks) does not group under pytest 9: it renames
``item._nodeid``, which pytest 9 no longer reads. The scope is therefore taken from the test's module here.
"""

from __future__ import annotations

import pytest

MAIN_PPO_GROUP = "main_ppo"
#: in the order the unit runs them: the four-RM run first, as it takes the most memory (main_ppo, two managed
#: replicas, two family servers) and then the fewest session servers are alive on either worker (a fresh clone's
#: run had it killed by Ray's memory monitor at 22.4 of 23.5 GB when it ran fifth)
MAIN_PPO_MODULES = (
    "tests/dev/test_tiny_ppo_two_rms.py",
    "tests/dev/test_demo.py",
    "tests/dev/test_tiny_ppo.py",
    "tests/dev/test_tiny_ppo_any_rm.py",
    "tests/dev/test_tiny_ppo_online.py",
    "tests/test_recipes.py",
)


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or the main_ppo group."""
    module = module_of(nodeid)
    return MAIN_PPO_GROUP if module in MAIN_PPO_MODULES else module


def main_ppo_first(items: list[pytest.Item]) -> None:
    """Put the main_ppo modules' tests first, in :data:`MAIN_PPO_MODULES`' order (stable: the rest keep theirs).
    Runs in every worker alike, so their collections still agree."""
    rank = {module: i for i, module in enumerate(MAIN_PPO_MODULES)}
    items.sort(key=lambda item: rank.get(module_of(item.nodeid), len(rank)))


class ModuleScheduling:
    """The xdist hook that hands out whole units (registered by ``conftest.py`` where xdist runs)."""

    @staticmethod
    def pytest_xdist_make_scheduler(config, log):
        from xdist.scheduler import LoadScopeScheduling

        class ByUnit(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return unit_of(nodeid)

        return ByUnit(config, log)
