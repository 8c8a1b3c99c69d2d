"""The manager's ``judge`` component: each sample's score from its prompt group's one judgement.

Every sample joins its group's rendezvous (:mod:`verl_vllm_rm.judge.rendezvous`): a plain object
when the whole group is in this process, the run's named Ray actor inside verl's reward-loop
workers (members reach different workers). Groups are keyed by ``uid`` and hold
``judge.group_size`` members, by default verl's ``actor_rollout_ref.rollout.n``
(``val_kwargs.n`` for samples marked as validation).
"""

from __future__ import annotations

import json
import logging
import numbers
from typing import Any, Callable

from verl_vllm_rm.extra_info import JUDGE_ANSWER, JUDGE_RANK, JUDGE_RAW, JUDGE_SCORE, JUDGE_VALID, JUDGE_VERDICTS
from verl_vllm_rm.judge.client import VERDICT_SCORE
from verl_vllm_rm.judge.options import JudgeOptions
from verl_vllm_rm.judge.rendezvous import JudgeRendezvous, rendezvous_actor
from verl_vllm_rm.rows import Sample, prompt_text, reference_text

logger = logging.getLogger(__name__)


class JudgeError(RuntimeError):
    """The judge failed for a sample whose judge ``failure_policy`` is raise."""


def group_sizes(options: JudgeOptions, config: Any) -> tuple[int, int]:
    """Members per group in training and in validation. A mode that scores a response against the others of
    its group (listwise, pointwise's min-max, pairwise among members) refuses groups of one: every score would
    be 0, a reward without signal."""
    from omegaconf import OmegaConf

    if options.group_size is not None:
        sizes = (options.group_size, options.group_size)
    else:
        rollout = OmegaConf.select(config, "actor_rollout_ref.rollout", default=None)
        if rollout is None or rollout.get("n") is None:
            raise ValueError("judge needs the prompt groups' size: set reward_kwargs.judge.group_size, or run with "
                             "verl's actor_rollout_ref.rollout.n")
        sizes = (int(rollout.n), int(OmegaConf.select(rollout, "val_kwargs.n", default=1)))
    if options.mode == "pairwise" and options.pairwise_against == "reference":
        return sizes
    validates = OmegaConf.select(config, "trainer.val_before_train", default=False) or \
        (OmegaConf.select(config, "trainer.test_freq", default=-1) or -1) > 0
    for size, phase, knob in ((sizes[0], "training", "actor_rollout_ref.rollout.n"),
                              (sizes[1] if validates else 2, "validation", "actor_rollout_ref.rollout.val_kwargs.n")):
        if size < 2:
            raise ValueError(f"judge mode {options.mode} compares each response with the others of its group, and "
                             f"{phase} groups hold {size} response(s) ({knob}): set it to 2 or more, or judge "
                             "mode=pairwise with pairwise_against=reference")
    return sizes


def _in_ray_actor() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


class SampleJudge:
    """Judges samples by group for one manager (``num_examine`` groups keep the judge's raw answer)."""

    def __init__(self, options: JudgeOptions, config: Any, tokenizer: Any, *, num_examine: int,
                 reference_source: str) -> None:
        self.options = options
        self.sizes = group_sizes(self.options, config)
        self.num_examine, self.reference_source = num_examine, reference_source
        self.tokenizer = tokenizer
        self.examined: set[str] = set()
        self.failed = 0
        self._join: Callable[..., Any] | None = None
        self._local: JudgeRendezvous | None = None

    async def score(self, sample: Sample, response: str) -> tuple[float | None, dict[str, Any]]:
        """The sample's judge score (None when the judgement failed and the policy masks it) and its info keys."""
        prompt, reference = prompt_text(self.tokenizer, sample), reference_text(sample.fields, self.reference_source)
        key = str(sample.fields.get("uid", sample.group_key))
        member = sample.fields.get("session_id")
        member = int(member) if isinstance(member, numbers.Integral) else member
        n = self.sizes[sample.validate]
        try:
            judgement, index = await self.join(key, member, (prompt, response, reference), n,
                                               self.options.group_timeout_s)
        except Exception as e:
            if self.options.failure_policy == "raise":
                phase = "validation" if sample.validate else "training"
                raise JudgeError(f"the judge failed for {phase} sample uid={key}, group size {n} (judge.failure_policy "
                                 f"is raise; mask drops the judge's part of these samples instead; verl's validation "
                                 f"samples are told apart only under trainer.v1.trainer_mode=vllm_rm): {e}") from e
            self.failed += 1
            logger.warning("vllm_rm: masking the judge for sample uid=%s: %s", key, e)
            return None, {JUDGE_VALID: 0.0}
        info: dict[str, Any] = {JUDGE_SCORE: judgement.scores[index], JUDGE_VALID: 1.0}
        if judgement.ranking is not None:
            info[JUDGE_RANK] = float(judgement.ranking.index(index))
        if judgement.raw is not None:
            raw = judgement.raw[index]
            info[JUDGE_RAW] = float(raw) if isinstance(raw, int) else VERDICT_SCORE[raw]
        if judgement.verdicts is not None:
            mine = {f"{i}-{j}": v for (i, j), v in judgement.verdicts.items() if index in (i, j)}
            info[JUDGE_VERDICTS] = json.dumps(mine, separators=(",", ":"))
        if key in self.examined or len(self.examined) < self.num_examine:
            self.examined.add(key)
            info[JUDGE_ANSWER] = "\n".join(judgement.answers)
        return judgement.scores[index], info

    @property
    def join(self) -> Callable[..., Any]:
        """The rendezvous' ``join``: the Ray actor's inside a Ray actor (verl's workers), else a local one's."""
        if self._join is None:
            if _in_ray_actor():
                actor = rendezvous_actor(self.options)
                self._join = lambda *args: actor.join.remote(*args)
            else:
                self._local = JudgeRendezvous(self.options)
                self._join = self._local.join
        return self._join

    async def close(self) -> None:
        """Close the local rendezvous' judge client (the Ray actor's lives as long as the run's workers)."""
        if self._local is not None:
            await self._local.client.close()
