"""Starting a local Ray cluster in tests (a plain function)."""

from __future__ import annotations

NODE_START_TIMEOUT = "timed out during startup"
ATTEMPTS = 3


def start_local_ray(num_cpus: int, **kwargs) -> None:
    """``ray.init`` of a local cluster, tried again when its node does not register in time.

    Ray 2.x waits a fixed 30 s for its raylet to register with the GCS (``ray/_private/node.py``, the
    ``raylet_start_wait_time_s = 30`` literal; the ``RAY_raylet_start_wait_time_s`` its message suggests is not
    read). Under make test's two workers, a cluster started while the other worker runs main_ppo can miss it: the
    start is repeated (after ``ray.shutdown``) rather than failing a test that never got to its subject.
    """
    import ray

    kwargs = {"include_dashboard": False, "log_to_driver": False, **kwargs}
    for attempt in range(1, ATTEMPTS + 1):
        try:
            ray.init(num_cpus=num_cpus, **kwargs)
            return
        except Exception as exc:
            if NODE_START_TIMEOUT not in str(exc) or attempt == ATTEMPTS:
                raise
            ray.shutdown()
