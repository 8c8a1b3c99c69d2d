"""Entry point of group ``verl.plugins`` (loaded by ``import verl`` in every process,
Ray reward-loop workers included): registers the ``vllm_rm`` reward manager.

verl logs a failing plugin import only at DEBUG, so failures are reported here
loudly before being re-raised.
"""

import logging

from verl_vllm_rm.legacy import warn_legacy_argv

try:
    from verl_vllm_rm.manager import VLLMRewardManager  # noqa: F401  (registers "vllm_rm")
except Exception:  # pragma: no cover - the message is the point
    logging.getLogger("verl_vllm_rm").exception("verl-vllm-rm: failed to register the 'vllm_rm' reward manager")
    raise

warn_legacy_argv()
