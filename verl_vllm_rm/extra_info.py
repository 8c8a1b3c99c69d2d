"""The ``reward_extra_info`` schema: the name of every column ``vllm_rm`` writes per sample, in one place.

The scorers (:mod:`verl_vllm_rm.scoring`) declare their columns from these names and write them; the monitor,
the report and the trainer modes read them by these names. verl builds a step's columns from its FIRST sample's
keys (a key a later sample lacks raises ``KeyError``, one the first lacks is dropped), so every sample of a run
carries every column its scorers declare, None where the sample has no such value. docs/metrics.md describes
each column.
"""

from __future__ import annotations

#: The composed reward (the rubric, rule, judge and verifiable components weighed: ``reward_score``).
SCORE = "score"
#: ``step_reward=token`` in verl's agent loop: a training row's per-token rewards (the steps' on the tokens ending
#: them, the rest on the last), which the trainer modes write into ``rm_scores``; None elsewhere. A list, so the
#: metrics leave it out.
TOKEN_REWARDS = "token_rewards"

# -- the reward models' columns ----------------------------------------------------------------------------------
RM_SCORE = "rm_score"  # the route's ensemble of its RMs (one RM: its score)
RM_VALID = "rm_valid"  # 1.0 scored; 0.0 masked (failure_policy=mask): the sample's reward is 0.0, not a number
RM_PROMPT_TOKENS_DROPPED = "rm_prompt_tokens_dropped"
RM_TOKENS = "rm_tokens"
RM_LATENCY_MS = "rm_latency_ms"
RM_WEIGHT_VERSION = "rm_weight_version"  # the oldest version over the members that answered
RM_FAILOVERS = "rm_failovers"
RM_KEYS = (RM_SCORE, RM_VALID, RM_PROMPT_TOKENS_DROPPED, RM_TOKENS, RM_LATENCY_MS, RM_WEIGHT_VERSION, RM_FAILOVERS)
#: Columns about the RM request, not reward components: each has its own metric (docs/metrics.md).
BOOKKEEPING = (RM_VALID, RM_LATENCY_MS, RM_TOKENS, RM_WEIGHT_VERSION, RM_PROMPT_TOKENS_DROPPED, RM_FAILOVERS)
RM_ENSEMBLE_STD = "rm_ensemble_std"  # with per-member columns: the std of the members' scores


def member_keys(rm_name: str) -> tuple[str, str, str]:
    """One RM's own score, valid flag and weight version (a run with several RMs, or a whitened one)."""
    return f"rm_score_{rm_name}", f"rm_valid_{rm_name}", f"rm_weight_version_{rm_name}"


def member_scaled_key(rm_name: str) -> str:
    """A whitened RM's score as its ensemble uses it."""
    return f"rm_scaled_{rm_name}"


def weight_version_key(rm_name: str, *, per_member: bool) -> str:
    """The column holding the weight version of RM ``rm_name`` that scored each sample: its own with per-member
    columns (``rm_weight_version`` is the oldest over an ensemble's members, which mixes in the frozen ones)."""
    return member_keys(rm_name)[2] if per_member else RM_WEIGHT_VERSION


def attribute_key(rm_name: str, attribute: str) -> str:
    """``rm_attr_<rm>_<attribute>``: a weighted attribute's raw value (and so the metrics
    ``reward/rm_attr_<rm>_<attribute>/{mean,std,min,max}``)."""
    return f"rm_attr_{rm_name}_{attribute}"


def scaled_attribute_key(rm_name: str, attribute: str) -> str:
    """``rm_attr_scaled_<rm>_<attribute>``: a whitened attribute's value (``whiten=running``), what its weight
    multiplies."""
    return f"rm_attr_scaled_{rm_name}_{attribute}"


def ensembled_attribute_keys(attribute: str) -> tuple[str, str]:
    """``rm_ensemble_attr_<attribute>`` and ``rm_ensemble_std_<attribute>``: a per-attribute ensemble's value of
    the attribute and the attribute's std across the members (what ``mean_minus_std`` penalises)."""
    return f"rm_ensemble_attr_{attribute}", f"rm_ensemble_std_{attribute}"


# -- the comparison with the prompt's reference answer -------------------------------------------------------------
WIN_KEYS = ("win", "win_and", "ref_margin")  # score > reference, score >= reference, score - reference

# -- the rule components' raw lengths (the components themselves are named by their component) ------------------
RESPONSE_TOKENS = "response_tokens"
THOUGHT_TOKENS = "thought_tokens"

# -- verl's compute_score, under verl's own names --------------------------------------------------------------------
VERIFIABLE_SCORE = "verifiable_score"  # compute_score's reward (its ``score``; the package's ``score`` is the total)
NUMBER_KEY = "acc"  # the column of a number compute_score returns, as verl's ``naive`` names it
DEFAULT_SCORER_KEYS = (NUMBER_KEY, "pred")  # verl's default scorer's dict keys besides score (math_dapo)

# -- the generative judge ------------------------------------------------------------------------------------------
JUDGE_SCORE = "judge_score"
JUDGE_VALID = "judge_valid"  # 0.0: the judgement failed and judge.failure_policy=mask masks the reward
JUDGE_RANK = "judge_rank"  # listwise: the response's place in the judge's ranking
JUDGE_RAW = "judge_raw"  # the judge's own answer for it (a score, or a verdict's value)
JUDGE_VERDICTS = "judge_verdicts"  # pairwise: its comparisons, as JSON
JUDGE_ANSWER = "judge_answer"  # the judge's whole text, for num_examine groups
JUDGE_KEYS = (JUDGE_SCORE, JUDGE_VALID, JUDGE_RANK, JUDGE_RAW, JUDGE_VERDICTS, JUDGE_ANSWER)
