"""Glue between the manager and the reward composition in :mod:`verl_vllm_rm.rewards`.

Built once per manager (think-tag ids and rm-gallery adapters are set up here,
in each Ray worker, since judges do not pickle); called once per sample. The
manager always has one ``RuleScorer``: from ``reward_kwargs.rewards`` or from the
``combine``/``alpha`` shorthand (``RewardConfig.from_combine``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Mapping, Sequence

import numpy as np

from verl_vllm_rm.rewards import (
    EXTERNAL_COMPONENTS,
    RewardConfig,
    build_gallery_rewards,
    component_stats,
    compose,
    compute_rule_rewards,
    think_tag_ids,
)
from verl_vllm_rm.rows import reference_text


class RuleScorer:
    def __init__(self, config: RewardConfig, tokenizer: Any):
        self.config = config
        p = config.thought_length
        self.tags = think_tag_ids(tokenizer, p.open_tag, p.close_tag) if "thought_length" in config.enabled else None
        self.gallery = build_gallery_rewards(config)
        # read once per sample, so computed once here
        self.needs_verifiable = "verifiable" in config.enabled  # verl's compute_score runs only when used
        self.needs_judge = "judge" in config.enabled
        self.has_rules = any(name not in EXTERNAL_COMPONENTS for name in config.enabled)  # computed here

    def components(
        self, response_ids: Sequence[int], text: str, prompt_text: str, reference: str | None
    ) -> dict[str, float]:
        """Every enabled rule component (and raw lengths) for one response."""
        ids = np.asarray([response_ids if len(response_ids) else [0]], dtype=np.int64)
        values = compute_rule_rewards(
            self.config, ids, np.asarray([len(response_ids)]), [text], self.tags, self.gallery,
            prompts=[prompt_text], references=[reference or ""],
        )
        return {name: float(v[0]) for name, v in values.items()}

    def start(self, loop: asyncio.AbstractEventLoop, tokenizer: Any, sample: Any, text: str,
              reference_source: str) -> asyncio.Future:
        """One sample's rule components, as a future: computed inline, or in a thread when rm-gallery rewards
        run (LLM judges may block on HTTP: kept off the event loop)."""
        if not self.gallery:  # vectorised numpy on one row: cheaper inline than in a thread
            done = loop.create_future()
            done.set_result(self.components(sample.response_ids, text, "", None))
            return done
        prompt = tokenizer.decode(sample.prompt_ids, skip_special_tokens=True)
        reference = reference_text(sample.fields, reference_source)
        return loop.run_in_executor(None, self.components, sample.response_ids, text, prompt, reference)

    def total(self, components: Mapping[str, float], verifiable: float | None, judged: float | None,
              rm_value: float | None) -> float:
        """One sample's reward from its RM value and its other components: ``sum(weight_i * component_i) *
        prod(gate_j)`` over the composition's components."""
        values = {**components, "rubric": rm_value, "verifiable": verifiable, "judge": judged}
        return compose(values, self.config.weights, self.config.gate)


def batch_stats(infos: list[dict[str, Any]]) -> dict[str, float]:
    """Mean/std/min/max of every numeric ``reward_extra_info`` key over a batch, plus the reward std."""
    if not infos:
        return {}
    def numeric(key: str) -> bool:  # by its first value that is not None (a failed sample's may be None)
        return isinstance(next((i[key] for i in infos if i[key] is not None), 0.0), (int, float))

    columns = {k: np.asarray([i[k] if i[k] is not None else np.nan for i in infos], dtype=float)
               for k in infos[0] if numeric(k)}
    stats = component_stats(columns)
    stats["reward/last_step_std"] = float(np.std(columns["score"])) if "score" in columns else float("nan")
    return stats
