"""verl-vllm-rm: score verl rollouts with a reward model served by vLLM.

The package imports nothing heavy at import time: trainer-side modules need verl
(not vllm) and ``verl_vllm_rm.server`` needs vllm (not verl).
"""

__version__ = "0.1.0"
