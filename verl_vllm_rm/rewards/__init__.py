"""Rule rewards (format, length, n-gram, rm-gallery adapter) and their weighted, gated composition.

Pure functions over numpy arrays of token ids and decoded texts; importing this
package needs only numpy (rm-gallery is imported when a ``gallery:`` component
is built). Typical use in a reward manager::

    config = RewardConfig.from_dict(reward_kwargs.get("rewards"))
    tags = think_tag_ids(tokenizer, config.thought_length.open_tag, config.thought_length.close_tag)
    gallery = build_gallery_rewards(config)                    # once
    values = compute_rule_rewards(config, ids, lengths, texts, tags, gallery, prompts)
    values["rubric"] = rm_scores                               # supplied by the manager
    total = compose(values, config.weights, config.gate)
    metrics = component_stats(values)
"""

from verl_vllm_rm.rewards.compose import (
    RESPONSE_TOKENS,
    THOUGHT_TOKENS,
    build_gallery_rewards,
    component_stats,
    compose,
    compute_rule_rewards,
)
from verl_vllm_rm.rewards.config import (
    DEFAULT_COMPONENTS,
    EXTERNAL_COMPONENTS,
    RULE_COMPONENTS,
    FormatParams,
    LengthParams,
    NgramParams,
    RewardConfig,
    ThoughtLengthParams,
)
from verl_vllm_rm.rewards.format import format_reward
from verl_vllm_rm.rewards.gallery import GalleryReward, GalleryRewardError, gallery_reward_names
from verl_vllm_rm.rewards.length import (
    LengthReward,
    band_penalty,
    length_reward,
    overlong_penalty,
    thought_length_reward,
)
from verl_vllm_rm.rewards.ngram import ngram_counts, ngram_repetition_penalty
from verl_vllm_rm.rewards.spans import ThinkTagIds, think_tag_ids, thought_token_counts

__all__ = [
    "DEFAULT_COMPONENTS",
    "EXTERNAL_COMPONENTS",
    "RESPONSE_TOKENS",
    "RULE_COMPONENTS",
    "THOUGHT_TOKENS",
    "FormatParams",
    "GalleryReward",
    "GalleryRewardError",
    "LengthParams",
    "LengthReward",
    "NgramParams",
    "RewardConfig",
    "ThinkTagIds",
    "ThoughtLengthParams",
    "band_penalty",
    "build_gallery_rewards",
    "component_stats",
    "compose",
    "compute_rule_rewards",
    "format_reward",
    "gallery_reward_names",
    "length_reward",
    "ngram_counts",
    "ngram_repetition_penalty",
    "overlong_penalty",
    "think_tag_ids",
    "thought_length_reward",
    "thought_token_counts",
]
