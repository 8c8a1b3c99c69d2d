"""Compute the enabled rule components for a batch, weight (and gate) them into one reward, summarise them.

The manager supplies the external components (``rubric``: the reward model's
score, ``verifiable``: verl's ``compute_score``) and calls
``compute_rule_rewards`` for the rest; ``compose`` then only sees arrays by
name. ``compose`` does not replace NaN: a sample masked upstream stays NaN in the
total, so a failed score can never turn into a plausible number here.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Mapping, Sequence

import numpy as np

from verl_vllm_rm.extra_info import RESPONSE_TOKENS, THOUGHT_TOKENS
from verl_vllm_rm.rewards.config import RewardConfig
from verl_vllm_rm.rewards.format import format_reward
from verl_vllm_rm.rewards.gallery import PREFIX as GALLERY_PREFIX
from verl_vllm_rm.rewards.gallery import GalleryReward
from verl_vllm_rm.rewards.length import length_reward, thought_length_reward
from verl_vllm_rm.rewards.ngram import ngram_repetition_penalty
from verl_vllm_rm.rewards.spans import ThinkTagIds
from verl_vllm_rm.rewards.token_batch import as_token_batch



def build_gallery_rewards(config: RewardConfig) -> dict[str, GalleryReward]:
    """Instantiate the enabled ``gallery:`` rewards once per process (slow import; judges hold HTTP clients,
    so build them in each worker rather than pickling them); keyed by registry name."""
    return {name: GalleryReward(name, config.gallery.get(name)) for name in config.gallery_names}


def rule_keys(config: RewardConfig) -> tuple[str, ...]:
    """The keys ``compute_rule_rewards`` returns for ``config`` (its rule components and raw lengths)."""
    enabled = set(config.enabled)
    keys = [name for name in ("format", "length", "thought_length", "ngram") if name in enabled]
    keys += [RESPONSE_TOKENS] * ("length" in enabled) + [THOUGHT_TOKENS] * ("thought_length" in enabled)
    return (*keys, *(GALLERY_PREFIX + name for name in config.gallery_names))


def compute_rule_rewards(
    config: RewardConfig,
    token_ids: Any,
    lengths: Any,
    texts: Sequence[str],
    think_tags: ThinkTagIds | None = None,
    gallery: Mapping[str, GalleryReward] | None = None,
    prompts: Sequence[str] | None = None,
    references: Sequence[str] | None = None,
) -> dict[str, np.ndarray]:
    """All enabled rule components for a batch: name -> float64 array of shape [batch].

    ``token_ids``/``lengths``: the padded response ids and valid lengths;
    ``texts``: the decoded responses; ``think_tags``: from ``spans.think_tag_ids``
    (needed by ``thought_length``); ``gallery``: from ``build_gallery_rewards``;
    ``prompts``/``references``: passed to ``gallery:`` rewards that need them.
    Raw token counts come back under ``RESPONSE_TOKENS`` (with ``length``) and
    ``THOUGHT_TOKENS`` (with ``thought_length``), for ``reward_extra_info``.
    """
    ids, lens = as_token_batch(token_ids, lengths)
    if len(texts) != ids.shape[0]:
        raise ValueError(f"{len(texts)} texts for {ids.shape[0]} token rows")
    enabled = set(config.enabled)
    out: dict[str, np.ndarray] = {}
    if "format" in enabled:
        out["format"] = format_reward(texts, blocks=config.format.blocks, pattern=config.format.pattern)
    if "length" in enabled:
        p = config.length
        out["length"], out[RESPONSE_TOKENS] = length_reward(
            lens, **asdict(p.band), max_response_tokens=p.max_response_tokens, overlong_buffer=p.overlong_buffer,
            overlong_penalty_factor=p.overlong_penalty_factor)
    if "thought_length" in enabled:
        if think_tags is None:
            raise ValueError("thought_length needs think_tags: pass spans.think_tag_ids(tokenizer, "
                             "config.thought_length.open_tag, config.thought_length.close_tag)")
        p = config.thought_length
        out["thought_length"], out[THOUGHT_TOKENS] = thought_length_reward(
            ids, lens, think_tags, **asdict(p.band))
    if "ngram" in enabled:
        p = config.ngram
        out["ngram"] = ngram_repetition_penalty(ids, lens, p.ngram_size, p.max_penalty, p.min_scaling)
    for name in config.gallery_names:
        if gallery is None or name not in gallery:
            raise ValueError(f"no adapter for '{GALLERY_PREFIX}{name}': build them once with "
                             "build_gallery_rewards(config) and pass them as gallery=")
        out[GALLERY_PREFIX + name] = gallery[name](texts, prompts=prompts, references=references)
    return out


def compose(values: Mapping[str, Any], weights: Mapping[str, float], gate: Sequence[str] = ()) -> np.ndarray:
    """``sum(weight_i * values[i]) * prod(values[g] for g in gate)`` over 1-D arrays of one length (a value per
    row); extra keys in ``values`` are ignored. NaN stays NaN: a value missing upstream never becomes a number."""
    if not weights:
        raise ValueError("compose needs at least one weighted component")
    missing = [(kind, [name for name in names if name not in values]) for kind, names in (("weighted", weights),
                                                                                       ("gate", gate))]
    for kind, names in missing:
        if names:
            raise ValueError(f"no values for {kind} component(s) {names} (have {sorted(values)}); 'rubric' is "
                             "the reward model's score and 'verifiable' verl's compute_score: the manager supplies "
                             "them")
    names = (*weights, *gate)
    arrays = [np.asarray(values[name], dtype=np.float64) for name in names]
    shapes = {name: a.shape for name, a in zip(names, arrays)}
    if len(set(shapes.values())) > 1 or any(len(s) != 1 for s in shapes.values()):
        raise ValueError(f"component values must be 1-D arrays of one length, got shapes {shapes}")
    total = np.zeros(arrays[0].shape)
    for weight, a in zip(weights.values(), arrays):
        total += weight * a
    for a in arrays[len(weights):]:
        total *= a
    return total


def component_stats(values: Mapping[str, Any]) -> dict[str, float]:
    """``reward/<name>/{mean,std,min,max}`` per array, over its finite entries (NaN if there are none)."""
    stats: dict[str, float] = {}
    for name, value in values.items():
        arr = np.asarray(value, dtype=np.float64).ravel()
        finite = arr[np.isfinite(arr)]
        for stat, fn in (("mean", np.mean), ("std", np.std), ("min", np.min), ("max", np.max)):
            stats[f"reward/{name}/{stat}"] = float(fn(finite)) if finite.size else float("nan")
    return stats
