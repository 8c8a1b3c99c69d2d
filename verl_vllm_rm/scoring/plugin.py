"""Entry point of group ``verl.plugins`` (loaded by ``import verl`` in every process,
Ray reward-loop workers included): registers the ``vllm_rm`` reward manager.

verl logs a failing plugin import only at DEBUG, so failures are reported here
loudly before being re-raised.
"""

import logging
import sys

from verl_vllm_rm.scoring.legacy import warn_legacy_argv

# When the user imports verl_vllm_rm.scoring.manager first, it imports verl, which loads this
# plugin while the manager module is still half-initialised: its decorator registers it.
if "verl_vllm_rm.scoring.manager" not in sys.modules:
    try:
        from verl_vllm_rm.scoring.manager import VLLMRewardManager  # noqa: F401  (registers "vllm_rm")
    except Exception:  # the message is the point
        logging.getLogger("verl_vllm_rm").exception("verl-vllm-rm: failed to register the 'vllm_rm' reward manager")
        raise

warn_legacy_argv()
