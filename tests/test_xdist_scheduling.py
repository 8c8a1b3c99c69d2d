"""make test's two xdist workers get whole modules, the main_ppo modules as one unit (tests/xdist_scheduling.py)."""

from pathlib import Path

from xdist_scheduling import MAIN_PPO_GROUP, MAIN_PPO_MODULES, unit_of

ROOT = Path(__file__).resolve().parents[1]


def test_every_main_ppo_module_exists():
    """A renamed module would silently leave the unit and run its main_ppo beside another."""
    assert [m for m in sorted(MAIN_PPO_MODULES) if not (ROOT / m).is_file()] == []


def test_a_test_belongs_to_its_module_or_to_the_main_ppo_unit():
    assert unit_of("tests/client/test_http.py::test_x[a::b]") == "tests/client/test_http.py"
    assert unit_of("tests/dev/test_demo.py::test_demo_runs_the_whole_loop") == MAIN_PPO_GROUP
    assert unit_of("tests/test_recipes.py::test_recipe_runs_on_cpu[grpo_math_online_rm.sh]") == MAIN_PPO_GROUP


def test_the_main_ppo_unit_runs_first_and_the_four_rm_run_first_of_it():
    import types

    from xdist_scheduling import main_ppo_first

    names = ["tests/client/test_http.py::a", "tests/test_recipes.py::r", "tests/dev/test_demo.py::d",
             "tests/dev/test_tiny_ppo_two_rms.py::t", "tests/client/test_http.py::b"]
    items = [types.SimpleNamespace(nodeid=n) for n in names]
    main_ppo_first(items)
    assert [i.nodeid for i in items] == ["tests/dev/test_tiny_ppo_two_rms.py::t", "tests/dev/test_demo.py::d",
                                         "tests/test_recipes.py::r", "tests/client/test_http.py::a",
                                         "tests/client/test_http.py::b"]
