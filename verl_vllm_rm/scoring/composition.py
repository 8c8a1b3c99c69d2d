"""One reward composition as the pipeline uses it: its rule components over a set of rows, its total over arrays.

Built once per manager from ``reward_kwargs.rewards`` (or the ``combine``/``alpha`` shorthand,
``RewardConfig.from_combine``); routes with equal compositions share one. Think-tag ids and rm-gallery adapters
are set up here, in each Ray worker, since judges do not pickle.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from verl_vllm_rm.rewards import (
    EXTERNAL_COMPONENTS,
    RewardConfig,
    build_gallery_rewards,
    compose,
    compute_rule_rewards,
    think_tag_ids,
)
from verl_vllm_rm.rewards.compose import rule_keys


def right_padded(rows: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, lengths)``: the 1-D id arrays ``rows`` as one right-padded ``[len(rows), max(1, longest)]`` batch."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    ids = np.zeros((len(rows), max(1, int(lengths.max(initial=0)))), dtype=np.int64)
    if lengths.any():
        ids[np.arange(ids.shape[1]) < lengths[:, None]] = np.concatenate(rows)
    return ids, lengths


class Composition:
    """A composition's rule components (``format``, ``length``, ``thought_length``, ``ngram``, ``gallery:<name>``)
    and its weighted, gated total: ``sum(weight_i * component_i) * prod(gate_j)``."""

    def __init__(self, config: RewardConfig, tokenizer: Any):
        self.config = config
        p = config.thought_length
        self.tags = think_tag_ids(tokenizer, p.open_tag, p.close_tag) if "thought_length" in config.enabled else None
        self.gallery = build_gallery_rewards(config)
        self.needs_verifiable = "verifiable" in config.enabled  # verl's compute_score runs only when used
        self.needs_judge = "judge" in config.enabled
        self.has_rules = any(name not in EXTERNAL_COMPONENTS for name in config.enabled)  # computed here
        #: its rule components' ``reward_extra_info`` columns (the components and their raw lengths)
        self.rule_keys = rule_keys(config) if self.has_rules else ()

    @property
    def needs_text(self) -> bool:
        """Whether its scorers read the decoded response."""
        return self.has_rules or self.needs_verifiable or self.needs_judge

    def rule_components(self, response_ids: Sequence[np.ndarray], texts: Sequence[str], prompts: Sequence[str],
                        references: Sequence[str | None]) -> dict[str, np.ndarray]:
        """Every enabled rule component (and raw lengths) of each response, as arrays over the rows."""
        ids, lengths = right_padded(response_ids)
        return compute_rule_rewards(self.config, ids, lengths, texts, self.tags, self.gallery, prompts=prompts,
                                    references=[r or "" for r in references])

    def total(self, components: Mapping[str, np.ndarray]) -> np.ndarray:
        """The reward of each row from its component arrays (NaN stays NaN: a missing value is never a number)."""
        return compose(components, self.config.weights, self.config.gate)
