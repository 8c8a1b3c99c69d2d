"""Glue between the manager and the pure rule rewards in :mod:`verl_vllm_rm.rewards`.

Built once per manager (think-tag ids and rm-gallery adapters are set up here,
in each Ray worker, since judges do not pickle); called once per sample.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from verl_vllm_rm.rewards import (
    RewardConfig,
    build_gallery_rewards,
    component_stats,
    compose,
    compute_rule_rewards,
    think_tag_ids,
)


class RuleScorer:
    def __init__(self, raw: Mapping[str, Any], tokenizer: Any):
        self.config = RewardConfig.from_dict(raw)
        self.tags = think_tag_ids(tokenizer, self.config.thought_length.open_tag, self.config.thought_length.close_tag)
        self.gallery = build_gallery_rewards(self.config)

    @property
    def needs_verifiable(self) -> bool:
        return "verifiable" in self.config.components

    def components(
        self, response_ids: list[int], text: str, prompt_text: str, reference: str | None
    ) -> dict[str, float]:
        """Every enabled rule component (and raw lengths) for one response."""
        ids = np.asarray([response_ids or [0]], dtype=np.int64)
        values = compute_rule_rewards(
            self.config, ids, np.asarray([len(response_ids)]), [text], self.tags, self.gallery,
            prompts=[prompt_text], references=[reference or ""],
        )
        return {name: float(v[0]) for name, v in values.items()}

    def total(self, values: Mapping[str, float]) -> float:
        """``sum(weight_i * component_i)`` over the enabled components."""
        arrays = {name: np.asarray([values[name]]) for name in self.config.weights}
        return float(compose(arrays, self.config.weights)[0])


def batch_stats(infos: list[dict[str, Any]]) -> dict[str, float]:
    """Mean/std/min/max of every numeric ``reward_extra_info`` key over a batch, plus the reward std."""
    if not infos:
        return {}
    columns = {
        k: np.asarray([i[k] if i[k] is not None else np.nan for i in infos], dtype=float)
        for k in infos[0] if isinstance(infos[0][k], (int, float)) or infos[0][k] is None
    }
    stats = component_stats(columns)
    stats["reward/last_step_std"] = float(np.std(columns["score"])) if "score" in columns else float("nan")
    return stats
