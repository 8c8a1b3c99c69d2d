"""verl's replay buffer under ``+online_rm.max_staleness``, built as the staleness tests build it."""

from __future__ import annotations


def make_buffer(max_staleness: int = 2, refills: list | None = None, **verl_kwargs):
    from verl_vllm_rm.plugin.rm_staleness import RMStalenessBuffer

    kwargs = dict(trainer_mode="colocate_async", trainer_config={}, max_off_policy_threshold=None,
                  max_off_policy_strategy="drop", sampler_kwargs={}, poll_interval=0.0,
                  refill_fn=(refills.append if refills is not None else None))
    return RMStalenessBuffer(**{**kwargs, **verl_kwargs}, max_staleness=max_staleness,
                             version_keys=["rm_weight_version"])
