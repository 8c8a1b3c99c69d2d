"""start_local_ray repeats a Ray start whose node missed Ray's fixed 30 s registration wait, and only that.

Ray's own start is replaced by a recorder here: a node that registers late cannot be made to happen on purpose."""

from __future__ import annotations

import pytest
import ray
from ray_helpers import ATTEMPTS, start_local_ray

RAY_TIMEOUT = Exception("The current node timed out during startup. This could happen because some of the raylet "
                        "failed to startup or the GCS has become overloaded.")


@pytest.fixture
def recorded(monkeypatch):
    calls = []

    def init_failing_with(errors):
        def init(**kwargs):
            calls.append(("init", kwargs))
            if errors:
                raise errors.pop(0)
        monkeypatch.setattr(ray, "init", init)
        monkeypatch.setattr(ray, "shutdown", lambda: calls.append(("shutdown", {})))
        return calls
    return init_failing_with


def test_a_node_that_registers_late_is_started_again(recorded):
    calls = recorded([RAY_TIMEOUT])
    start_local_ray(num_cpus=3, ignore_reinit_error=True)
    assert [name for name, _ in calls] == ["init", "shutdown", "init"]
    assert calls[-1][1] == {"num_cpus": 3, "include_dashboard": False, "log_to_driver": False,
                            "ignore_reinit_error": True}


def test_other_errors_and_the_last_timeout_are_raised(recorded):
    calls = recorded([ValueError("bad runtime_env")])
    with pytest.raises(ValueError, match="bad runtime_env"):
        start_local_ray(num_cpus=1)
    assert [name for name, _ in calls] == ["init"]
    calls.clear()
    recorded([RAY_TIMEOUT] * ATTEMPTS)
    with pytest.raises(Exception, match="timed out during startup"):
        start_local_ray(num_cpus=1)
    assert [name for name, _ in calls].count("init") == ATTEMPTS
