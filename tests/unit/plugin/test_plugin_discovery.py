"""How a fresh verl process finds ``vllm_rm``: ``import verl`` loads the ``verl.plugins`` entry point, unless
``VERL_USE_EXTERNAL_PLUGINS=none`` (docs/troubleshooting.md's cause of ``Unknown reward manager: vllm_rm`` in Ray
workers): the in-process tests (no server; those on the real server: tests/integration/plugin/test_plugin_discovery.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


TRAINER_MODE_PROBE = """
import json, sys, verl
before = "verl.trainer.ppo.v1" in sys.modules
from verl.trainer.ppo.v1 import get_trainer_cls
import verl.trainer.ppo.v1 as v1
print(json.dumps([before, get_trainer_cls("vllm_rm").__name__, type(v1.__loader__).__name__]))
"""


def test_trainer_mode_is_registered_when_verls_trainer_is_imported_not_before():
    """``import verl`` alone leaves verl's trainer unimported (reward and agent-loop workers never pay for it);
    the first import of verl's trainer registry registers trainer mode ``vllm_rm``, and the module keeps its
    own loader."""
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}
    proc = subprocess.run([sys.executable, "-c", TRAINER_MODE_PROBE], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [False, "RewardMetricsPPOTrainerSync", "SourceFileLoader"]
