"""A test's gate on the online RM step (not a workaround): with :data:`RM_STEP_AFTER_A_FINISHED_GROUP_ENV` set, the
first RM step of an asynchronous trainer (``RMStepAfterStepEnd._run_rm_step``) waits, once the next step's prompts
are submitted, until a group of them has finished and been scored by the RM it is about to replace.

Whether generation finishes a group before the publish is otherwise a race between the rollout and the RM step,
so a test of ``online_rm.max_staleness`` could not tell a bound that never acted from one that had nothing to
evict (a fresh clone's run had nothing). With the gate, the step's publish always leaves one finished group scored
below the new floor, which the next step must evict. The wait is for that event, bounded by
:data:`FINISHED_GROUP_TIMEOUT_S`.
"""

from __future__ import annotations

import functools
import os
import time

from verl_vllm_rm.dev.cpu_names import RM_STEP_AFTER_A_FINISHED_GROUP_ENV

FINISHED_GROUP_TIMEOUT_S = 600.0
POLL_S = 0.2


def finished_groups(partition_id: str = "train") -> int:
    """Prompt groups of ``partition_id`` whose trajectories have all finished (scored), as TransferQueue lists
    them (the sampled ones were cleared from it when sampled)."""
    import transfer_queue as tq

    items = (tq.kv_list() or {}).get(partition_id, {})
    return sum(1 for tag in items.values() if tag.get("is_prompt", False) and tag.get("status") == "finished")


def wait_for_a_finished_group(timeout_s: float = FINISHED_GROUP_TIMEOUT_S) -> int:
    deadline = time.monotonic() + timeout_s
    while (count := finished_groups()) == 0:
        if time.monotonic() > deadline:
            # A bound of the CPU harness's test gate (a test's run sets the variable): it names a stuck rollout there.
            # internal: no user run reaches it
            raise TimeoutError(f"{RM_STEP_AFTER_A_FINISHED_GROUP_ENV}: no group of the next step's prompts finished "
                               f"within {timeout_s:.0f} s of the first RM step: is the rollout generating?")
        time.sleep(POLL_S)
    return count


def hold_first_rm_step_for_a_finished_group() -> None:
    """Wrap ``RMStepAfterStepEnd._run_rm_step`` (once) with the gate, when the variable is set."""
    from verl_vllm_rm.plugin.online_mode import RMStepAfterStepEnd

    original = RMStepAfterStepEnd._run_rm_step
    if getattr(original, "holds_for_a_finished_group", False):
        return

    @functools.wraps(original)
    def _run_rm_step(self) -> None:
        if (os.environ.get(RM_STEP_AFTER_A_FINISHED_GROUP_ENV) and self._rm_step_due and self._next_batch_submitted
                and not getattr(self, "_held_for_a_finished_group", False)):
            self._held_for_a_finished_group = True
            wait_for_a_finished_group()
        original(self)

    _run_rm_step.holds_for_a_finished_group = True
    RMStepAfterStepEnd._run_rm_step = _run_rm_step
