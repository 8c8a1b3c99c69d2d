"""What the manager reports per sample besides the reward: the ``reward_extra_info`` keys, and the
``num_examine`` samples printed per ``data_source``."""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Mapping, Sequence

from verl_vllm_rm.monitor.metrics import attribute_key, ensembled_attribute_keys, scaled_attribute_key
from verl_vllm_rm.rewards.compose import rule_keys
from verl_vllm_rm.judge.reward import JUDGE_KEYS
from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.scoring.reward_model import RewardModel
from verl_vllm_rm.rows import Sample
from verl_vllm_rm.scoring.options import RewardModelOptions
from verl_vllm_rm.scoring.pairwise import WIN_KEYS
from verl_vllm_rm.scoring.rules import RuleScorer
from verl_vllm_rm.scoring.verifiable import SCORE_KEY


def per_member_keys(rm_options: Sequence[RewardModelOptions]) -> bool:
    """Whether ``reward_extra_info`` has keys per RM (``rm_score_<name>``, ...): with several RMs, or a whitened one."""
    return len(rm_options) > 1 or any(o.whiten != "none" for o in rm_options)


def weight_version_key(rm_options: Sequence[RewardModelOptions], name: str) -> str:
    """The ``reward_extra_info`` key holding the weight version of RM ``name`` that scored each sample: its own
    (``rm_weight_version`` is the oldest over an ensemble's members, which mixes in the frozen ones)."""
    return f"rm_weight_version_{name}" if per_member_keys(rm_options) else "rm_weight_version"


def info_keys(reward_models: Mapping[str, RewardModel], per_member: bool, rule_scorers: Iterable[RuleScorer],
              judge: bool, pairwise: bool, ensembled_attributes: Iterable[str] = ()) -> tuple[str, ...]:
    """The package's own ``reward_extra_info`` keys: each sample gets all of them (None where its route or mode
    has no such value), because verl builds its columns from the first sample's keys. ``pairwise``: the win
    metrics (validation and training samples meet in one step); ``ensembled_attributes``: those some route
    ensembles per attribute. The verifiable scorer's keys (verl's names) come after these
    (:mod:`verl_vllm_rm.scoring.verifiable`)."""
    keys = ["score", "rm_score", "rm_valid", "rm_prompt_tokens_dropped", "rm_tokens", "rm_latency_ms",
            "rm_weight_version", "rm_failovers"]
    for name, rm in reward_models.items():
        for attribute in rm.attribute_names:
            keys += [attribute_key(name, attribute)]
            keys += [scaled_attribute_key(name, attribute)] if rm.attribute_whitenings else []
    for attribute in ensembled_attributes:
        keys += ensembled_attribute_keys(attribute)
    if per_member:
        keys.append("rm_ensemble_std")
        for name, rm in reward_models.items():
            keys += [f"rm_score_{name}", f"rm_valid_{name}", f"rm_weight_version_{name}"]
            keys += [f"rm_scaled_{name}"] if rm.whitenings else []
    if clashes := sorted(key for key, count in Counter(keys).items() if count > 1):
        raise ConfigError(
            f"the reward_extra_info keys {clashes} would each hold two values: reward model and attribute names are "
            "joined with '_' (rm_attr_<rm>_<attribute>, rm_attr_scaled_<rm>_<attribute>), and two of them run into "
            "each other; rename a reward model (reward_models[].name)")
    rule_scorers = list(rule_scorers)
    for rules in rule_scorers:
        keys += [k for k in rule_keys(rules.config) if k not in keys]
    if any(rules.needs_verifiable for rules in rule_scorers):
        keys.append(SCORE_KEY)
    if judge:
        keys += JUDGE_KEYS
    if pairwise:
        keys += WIN_KEYS
    return tuple(keys)


class Examiner:
    """Prints the first ``num_examine`` samples of each ``data_source`` (prompt, response, every info key)."""

    def __init__(self, tokenizer: Any, num_examine: int):
        self.tokenizer, self.num_examine = tokenizer, num_examine
        self._examined: Counter = Counter()

    def maybe_print(self, sample: Sample, info: Mapping[str, Any]) -> None:
        source = sample.fields.get("data_source", "unknown")
        if self._examined[source] >= self.num_examine:
            return
        self._examined[source] += 1
        print(f"[vllm_rm] data_source={source}")
        print("[prompt]", self.tokenizer.decode(sample.prompt_ids, skip_special_tokens=True))
        print("[response]", self.tokenizer.decode(sample.response_ids, skip_special_tokens=True))
        for key, value in info.items():
            print(f"[{key}]", round(value, 6) if isinstance(value, float) else value)
