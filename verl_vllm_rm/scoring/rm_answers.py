"""The reward models' part of one sample's reward: each member's answer under its failure policy, and the
ensemble's value with its bookkeeping in ``reward_extra_info``."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from verl_vllm_rm.client.reward_client import RewardServerError
from verl_vllm_rm import extra_info as keys
from verl_vllm_rm.scoring.reward_model import RewardModel, Scored
from verl_vllm_rm.rows import Sample
from verl_vllm_rm.scoring.rm_inputs import RMInput
from verl_vllm_rm.scoring.routing import Route

logger = logging.getLogger(__name__)


def member_answer(rm: RewardModel, outcome: Scored | BaseException, rm_input: RMInput,
                  *, ensemble: bool) -> tuple[Scored, float] | None:
    """One RM's answer (its awaited :class:`Scored`, or the error its request raised) and its raw reward;
    ``None`` when it failed and its failure policy masks it."""
    try:
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome, rm.value(outcome, rm_input)
    except Exception as e:
        if rm.options.failure_policy == "raise":
            if ensemble:
                raise RewardServerError(f"reward model {rm.name!r} failed (its failure_policy is raise; "
                                        f"failure_policy=mask drops it from the ensemble instead): {e}") from e
            raise
        rm.failed += 1
        logger.warning("vllm_rm: masking reward model %r for sample uid=%s after a failed score: %s",
                       rm.name, rm_input.group_key, e)
        return None


def rm_info(route: Route, members: list[RewardModel], rm_inputs: list[RMInput],
            answers: list[tuple[Scored, float] | None], submitted: float, *, learn: bool,
            per_member: bool) -> dict[str, Any]:
    """The RM part of ``reward_extra_info``: the ensemble (``rm_score``), each member's raw score and weight version
    (``per_member``), each weighted attribute (raw, whitened, ensembled) and the request's bookkeeping. A route
    without RMs gets None (no RM asked, nothing failed). Only training samples (``learn``) update the whitening:
    validation is scored on the training scale without moving it."""
    dropped = tokens = 0
    for rm_input in rm_inputs:  # loops, not generators: this runs once per sample
        dropped += rm_input.prompt_tokens_dropped
        tokens += len(rm_input.token_ids)
    info: dict[str, Any] = {keys.RM_PROMPT_TOKENS_DROPPED: float(dropped), keys.RM_TOKENS: float(tokens)}
    if not members:
        return info
    present = [a[0] for a in answers if a is not None]
    scales = [None if a is None else rm.scale(*a, update=learn) for rm, a in zip(members, answers)]
    if present:
        value, std, by_attribute = route.combine(scales)
        info[keys.RM_SCORE], info[keys.RM_VALID] = value, 1.0
        info[keys.RM_LATENCY_MS] = (max([a.done for a in present]) - submitted) * 1000.0
        info[keys.RM_WEIGHT_VERSION] = float(min([a.version for a in present]))
        info[keys.RM_FAILOVERS] = float(max([a.failovers for a in present]))
    else:
        std = by_attribute = None
        info[keys.RM_SCORE], info[keys.RM_VALID] = 0.0, 0.0
        info[keys.RM_LATENCY_MS] = (time.perf_counter() - submitted) * 1000.0
        info[keys.RM_WEIGHT_VERSION], info[keys.RM_FAILOVERS] = -1.0, 0.0
    for rm, answer, scale in zip(members, answers, scales):
        if rm.attribute_columns is not None:
            for i, (attribute, column) in enumerate(rm.attribute_columns.items()):
                info[keys.attribute_key(rm.name, attribute)] = None if answer is None else answer[0].attributes[column]
                if rm.attribute_whitenings:
                    info[keys.scaled_attribute_key(rm.name, attribute)] = None if scale is None else scale[1][i]
    if route.attributes is not None:
        for i, attribute in enumerate(route.attributes):
            value_key, std_key = keys.ensembled_attribute_keys(attribute)
            info[value_key] = None if by_attribute is None else float(by_attribute[0][i])
            info[std_key] = None if by_attribute is None else float(by_attribute[1][i])
    if per_member:
        info[keys.RM_ENSEMBLE_STD] = std
        for rm, answer, scale in zip(members, answers, scales):
            score_key, valid_key, version_key = keys.member_keys(rm.name)
            info[score_key] = None if answer is None else answer[1]
            info[valid_key] = float(answer is not None)
            info[version_key] = None if answer is None else float(answer[0].version)
            if rm.whitenings:
                info[keys.member_scaled_key(rm.name)] = None if scale is None else scale[0]
    return info


#: tries to get a sample and its reference answer on one weight version (a publish landing between them costs one)
PAIRING_ATTEMPTS = 3


class ReferenceVersionError(RuntimeError):
    """A sample and its reference answer were not scored on one weight version within :data:`PAIRING_ATTEMPTS`."""


Answer = tuple[Scored, float]  # one RM's answer and its raw reward


async def paired_answers(rm: RewardModel, sample: Sample, text: str, rm_input: RMInput, answer: Answer,
                         reference: Answer) -> tuple[Answer, Answer]:
    """The member's answers for the sample and for the reference ``text`` on one weight version.

    The server answers each request on the version it serves when it arrives, so a publish landing between the
    sample's request and the reference's leaves them on two versions. A reference older than the sample is asked
    for on the sample's version (kept per version: scored once per group and version); a sample older than its
    reference is scored again, on the server's newest version, and that answer replaces the first (its score
    and version are the sample's; the whitening counts only this one). Nothing waits for a publish."""
    for _ in range(PAIRING_ATTEMPTS):
        if reference[0].version == answer[0].version:
            return answer, reference
        if reference[0].version > answer[0].version:
            scored = await rm.submit(rm_input)
            answer = scored, rm.value(scored, rm_input)
        else:
            reference = await rm.reference_score(sample, rm_input, text, answer[0].version)
    if reference[0].version == answer[0].version:
        return answer, reference
    raise ReferenceVersionError(
        f"reward model {rm.name!r}: sample uid={rm_input.group_key[1]} and its reference answer came from different "
        f"weight versions ({answer[0].version} and {reference[0].version}) after {PAIRING_ATTEMPTS} tries, each "
        "asking again: new weights are published faster than a score comes back. Publish less often "
        "(online_rm.publish_every) or compare with references in validation only (pairwise=auto)")


async def reference_score(sample: Sample, text: str, route: Route, members: list[RewardModel],
                          rm_inputs: list[RMInput], answers: list[Answer | None],
                          references: list[Answer | BaseException]) -> tuple[list[Answer | None], float | None]:
    """The members' answers for the sample and the route's ensemble score of the prompt's reference answer
    ``text``, each member's two on one weight version (:func:`paired_answers`; ``references``: the reference
    answers asked for beside the sample, or the errors they raised). Whitened members use their current scale; a
    reference never updates it. A member that fails on it raises under ``failure_policy=raise``; under ``mask``
    there is no reference score (None: the sample's win metrics stay empty, as for a missing reference), since
    the ensemble without that member is another reward."""
    async def pair(rm: RewardModel, rm_input: RMInput, answer: Answer | None,
                   reference: Answer | BaseException) -> tuple[Answer | None, Answer]:
        if isinstance(reference, BaseException):
            raise reference
        if answer is None:  # masked: no score of the sample's to pair with
            return None, reference
        return await paired_answers(rm, sample, text, rm_input, answer, reference)

    pairs = await asyncio.gather(*(pair(*member) for member in zip(members, rm_inputs, answers, references)),
                                 return_exceptions=True)
    failed = [(rm, p) for rm, p in zip(members, pairs) if isinstance(p, BaseException)]
    for rm, error in failed:
        if rm.options.failure_policy == "raise":
            raise error
    for rm, error in failed:
        logger.warning("vllm_rm: no reference score for sample uid=%s: reward model %r (failure_policy=mask) failed "
                       "on the reference answer: %s", sample.group_key, rm.name, error)
    answers = [a if isinstance(p, BaseException) else p[0] for a, p in zip(answers, pairs)]
    if failed:
        return answers, None
    return answers, route.combine([rm.scale(*p[1], update=False) for rm, p in zip(members, pairs)])[0]
