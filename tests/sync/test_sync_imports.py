"""The weight-sync code respects the two-environment split."""

import subprocess
import sys

from verl_vllm_rm.server_process import find_server_python

TRAINER_MODULES = [
    "verl_vllm_rm.sync", "verl_vllm_rm.sync.hook", "verl_vllm_rm.training.bt", "verl_vllm_rm.training.pairs"
]
SERVER_MODULES = ["verl_vllm_rm.server.weight_routes", "verl_vllm_rm.server.worker_extension"]


def test_trainer_side_sync_imports_without_vllm():
    code = "import sys; import " + ", ".join(TRAINER_MODULES) + "; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_server_side_sync_imports_without_verl():
    code = (
        "import sys; import " + ", ".join(SERVER_MODULES) + "; "
        "assert not any(m == 'verl' or m.startswith('verl.') for m in sys.modules)"
    )
    subprocess.run([find_server_python(), "-c", code], check=True)
