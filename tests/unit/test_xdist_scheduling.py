"""make test's two xdist workers get whole modules, the main_ppo modules as one unit (tests/support/xdist_scheduling.py)."""

import subprocess
from pathlib import Path

from xdist_scheduling import (COMPANION_MODULES, MAIN_PPO_GROUP, MAIN_PPO_MODULES, UNIT_FIXTURES, module_of,
                              unit_of)
from repo_paths import REPO as ROOT



def test_every_main_ppo_module_exists():
    """A renamed module would silently leave the unit and run its main_ppo beside another."""
    assert [m for m in sorted((*MAIN_PPO_MODULES, *COMPANION_MODULES)) if not (ROOT / m).is_file()] == []


def test_every_other_module_of_the_units_fixtures_joins_the_unit():
    """A module that asks for the judge server or the tiny task elsewhere would build a second one on the other
    worker (a test's or a fixture's parameter names the fixture)."""
    import ast

    def asks(path: Path) -> bool:
        return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and {a.arg for a in node.args.args} & set(UNIT_FIXTURES)
                   for node in ast.walk(ast.parse(path.read_text())))

    users = {str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py") if asks(path)}
    assert users - set(MAIN_PPO_MODULES) == set(COMPANION_MODULES)
    # a conftest's fixture asking for one would take it to every module of its folder, which the unit does not hold
    assert [str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("conftest.py") if asks(path)] == []
    assert all(unit_of(f"{module}::t") == MAIN_PPO_GROUP for module in COMPANION_MODULES)


def test_a_test_belongs_to_its_module_or_to_the_main_ppo_unit():
    assert unit_of("tests/integration/client/test_http.py::test_x[a::b]") == "tests/integration/client/test_http.py"
    assert unit_of("tests/integration/dev/test_demo.py::test_demo_runs_the_whole_loop") == MAIN_PPO_GROUP
    assert unit_of("tests/integration/test_recipes.py::test_recipe_runs_on_cpu[grpo_math_online_rm.sh]") == MAIN_PPO_GROUP


def ordered(seed: int, names: list[str]) -> list[str]:
    import types

    from xdist_scheduling import order_modules

    items = [types.SimpleNamespace(nodeid=n) for n in names]
    order_modules(items, seed)
    return [i.nodeid for i in items]


NAMES = ["tests/integration/client/test_http.py::a", "tests/integration/test_recipes.py::r",
         "tests/integration/scoring/test_judging.py::j", "tests/integration/judge/test_client.py::k",
         "tests/integration/dev/test_demo.py::d", "tests/integration/dev/test_tiny_ppo_two_rms.py::t",
         "tests/integration/client/test_http.py::b", "tests/integration/server/test_x.py::x",
         "tests/integration/server/test_w.py::w", "tests/unit/judge/test_y.py::y", "tests/unit/rewards/test_z.py::z",
         "tests/unit/rewards/test_v.py::v", "tests/unit/test_u.py::u", "tests/unit/dev/cpu_harness/test_rollout.py::o"]
COMPANIONS = {"tests/integration/scoring/test_judging.py::j", "tests/integration/judge/test_client.py::k",
              "tests/unit/dev/cpu_harness/test_rollout.py::o"}


def test_the_main_ppo_unit_runs_first_and_the_other_modules_whole_in_a_shuffled_order():
    orders = {seed: ordered(seed, NAMES) for seed in range(20)}
    for order in orders.values():
        # the main_ppo unit first, the four-RM run first of it
        assert order[:3] == ["tests/integration/dev/test_tiny_ppo_two_rms.py::t", "tests/integration/dev/test_demo.py::d",
                             "tests/integration/test_recipes.py::r"]
        assert set(order[3:6]) == COMPANIONS  # then the other modules of its session fixtures, a unit one among them
        at = order.index("tests/integration/client/test_http.py::a")
        assert order[at + 1] == "tests/integration/client/test_http.py::b"  # a module whole, its tests in their order
        assert sorted(order) == sorted(NAMES)
    assert len({tuple(order) for order in orders.values()}) > 1, "the seed changes nothing"
    # a seed gives one order of the modules, whatever the collection's
    assert [module_of(n) for n in ordered(3, NAMES[::-1])] == [module_of(n) for n in orders[3]]


def test_the_seed_is_the_one_given_else_the_tests_git_tree(monkeypatch):
    import pytest

    from xdist_scheduling import ORDER_SEED_ENV, module_order_seed

    monkeypatch.setenv(ORDER_SEED_ENV, "42")
    assert module_order_seed(ROOT) == 42
    monkeypatch.setenv(ORDER_SEED_ENV, "soon")
    with pytest.raises(pytest.UsageError, match=rf"{ORDER_SEED_ENV} must be an integer \(the seed of the module "
                                                r"order a run's header printed\), got 'soon'"):
        module_order_seed(ROOT)
    monkeypatch.delenv(ORDER_SEED_ENV)
    tree = subprocess.run(["git", "rev-parse", "HEAD:tests"], cwd=ROOT, capture_output=True, text=True)
    expected = int(tree.stdout.strip()[:8], 16) if tree.returncode == 0 else 0
    assert module_order_seed(ROOT) == expected
    assert module_order_seed(Path("/")) == 0  # no git checkout there


def test_a_random_half_of_the_unit_modules_closes_the_run():
    """The run ends with two of the four unit modules, and which two depends on the seed; each unit module runs
    before an integration module under some seed."""
    units = {n for n in NAMES if n.startswith("tests/unit/")} - COMPANIONS  # a companion runs in the main_ppo unit
    closing, among = set(), set()
    for seed in range(20):
        order = ordered(seed, NAMES)
        assert set(order[-2:]) <= units, order
        closing.add(frozenset(order[-2:]))
        last_integration = max(i for i, n in enumerate(order) if not n.startswith("tests/unit/"))
        among |= set(order[:last_integration]) & units
    assert len(closing) > 1, "the same unit modules close every run"
    assert among == units, "some unit module never runs before an integration module"
