"""``VLLMRewardManager``, registered in verl's reward loop as ``vllm_rm``.

Thin: it builds the run's reward models, routes and scorers from ``reward.reward_kwargs`` and hands both of
verl's entry points to the one scoring pipeline (:mod:`verl_vllm_rm.scoring.pipeline`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from verl import DataProto
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.utils.reward_score import default_compute_score
from verl_vllm_rm.extra_info import SCORE, VERIFIABLE_SCORE
from verl_vllm_rm.judge.reward import SampleJudge
from verl_vllm_rm.rewards import component_stats
from verl_vllm_rm.rows import last_output, samples_of, samples_of_rows
from verl_vllm_rm.scoring.examiner import Examiner
from verl_vllm_rm.scoring.judging import JudgeScorer
from verl_vllm_rm.scoring.misrouted_config import warn_misrouted_config
from verl_vllm_rm.scoring.options import ConfigError, ManagerOptions, parse_options, reward_kwargs_of
from verl_vllm_rm.scoring.pipeline import ScoringPipeline
from verl_vllm_rm.scoring.reward_model import RewardModel, refuse_token_level_when_streaming
from verl_vllm_rm.scoring.rm_scorer import RewardModelScorer
from verl_vllm_rm.scoring.routing import Router
from verl_vllm_rm.scoring.row_queue import Row, RowQueue
from verl_vllm_rm.scoring.rules import RuleScorer
from verl_vllm_rm.scoring.verifiable import VerifiableScorer


@register("vllm_rm")
class VLLMRewardManager(RewardManagerBase):
    """Scores trajectories with vLLM-served reward models; options in ``reward.reward_kwargs``."""

    def __init__(self, config: DictConfig, tokenizer: Any, compute_score=None,
                 reward_router_address: str | None = None, reward_model_tokenizer: Any = None, **_: Any):
        super().__init__(config, tokenizer, compute_score)
        warn_misrouted_config(config)
        self.options: ManagerOptions = parse_options(reward_kwargs_of(config))
        self.compute_score = compute_score or default_compute_score
        rm_options = self.options.rm_options
        refuse_token_level_when_streaming(config, rm_options)
        coalesce_s = self.options.coalesce_ms / 1000.0
        self.reward_models = {o.name: RewardModel(o, tokenizer, coalesce_s=coalesce_s) for o in rm_options}
        try:
            self.router = Router(self.options, tokenizer, self.reward_models)
            self.judge = None if self.options.judge is None else SampleJudge(
                self.options.judge, config, tokenizer, num_examine=self.options.num_examine,
                reference_source=self.options.reference_source)
        except ValueError as e:
            raise ConfigError(str(e)) from e
        compositions = self.router.compositions
        self.rm_scorer = RewardModelScorer(self.options, self.router, self.reward_models)
        scorers = [self.rm_scorer, RuleScorer(compositions, tokenizer, self.options.reference_source)]
        scorers += [] if self.judge is None else [JudgeScorer(self.judge)]
        taken = frozenset((SCORE, VERIFIABLE_SCORE, *(key for scorer in scorers for key in scorer.columns)))
        verifiable = VerifiableScorer(self.compute_score, self.options.compute_score_keys, taken,
                                      used=any(c.needs_verifiable for c in compositions))
        used = [scorer for scorer in (*scorers, verifiable) if scorer.columns]  # no column: no route uses it
        self.pipeline = ScoringPipeline(self.router, used, tokenizer,
                                        Examiner(tokenizer, self.options.num_examine))
        #: verl's managers' attribute: ``compute_score`` is a coroutine function (awaited, not run in a thread)
        self.is_async_reward_score = verifiable.is_async
        self.last_batch_stats: dict[str, float] = {}
        self._row_queue = RowQueue(self._score_rows)

    # -- verl reward-loop API -----------------------------------------------------------
    async def run_single(self, data: DataProto) -> dict:
        """One trajectory's reward, of its last output (:func:`last_output`, as verl's own managers score it); the
        trajectories verl hands over in one loop iteration are scored together (RowQueue)."""
        return await self._row_queue.put(last_output(data))

    async def _score_rows(self, rows: list[Row]) -> None:
        results = await self.pipeline.score(samples_of_rows([data for data, _ in rows]), batch_call=False)
        for (_, future), result in zip(rows, results):
            if future.done():  # its caller is gone
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)

    def __call__(self, data: DataProto, return_dict: bool = False):
        """Legacy batch API: a reward tensor shaped like ``responses`` (score at the last valid token).
        The first row's error fails the batch, and stops what it still had queued."""
        results = self.loop.run_until_complete(self.pipeline.score(samples_of([data]), batch_call=True))
        infos = [r["reward_extra_info"] for r in results]
        self.last_batch_stats = batch_stats(infos)
        reward_tensor = self.assemble_rm_scores(data, [r["reward_score"] for r in results])
        if not return_dict:
            return reward_tensor
        return {"reward_tensor": reward_tensor,
                "reward_extra_info": {k: [info[k] for info in infos] for k in self.pipeline.columns}}

    @classmethod
    def assemble_rm_scores(cls, data: DataProto, scores: list) -> torch.Tensor:
        """verl's placement (each scalar at the last valid response token), and token-level step rewards
        (``step_reward=token``: a list per response) over the response's first tokens."""
        if not any(isinstance(s, list) for s in scores):
            return super().assemble_rm_scores(data, scores)
        scalars = [0.0 if isinstance(s, list) else s for s in scores]
        rm_scores = super().assemble_rm_scores(data, scalars)
        for i, s in enumerate(scores):
            if isinstance(s, list):
                rm_scores[i, : len(s)] = rm_scores.new_tensor(s)
        return rm_scores

    @property
    def rm(self) -> RewardModel:
        """The one reward model of a single-RM run."""
        if len(self.reward_models) != 1:
            raise AttributeError(f"this run has {len(self.reward_models)} reward models: use reward_models[name]")
        return next(iter(self.reward_models.values()))

    @property
    def failed(self) -> int:
        """Rows masked so far (their reward 0.0: ``failure_policy=mask``)."""
        return self.pipeline.failed

    async def warm_up(self) -> None:
        """Connect to every RM's server and read its ``max_model_len`` (otherwise done by the first sample)."""
        await self.rm_scorer.probe(self.reward_models.values())

    def close(self) -> None:
        """Close this manager's HTTP sessions (verl keeps managers for the whole run)."""
        async def close_all() -> None:
            await self._row_queue.close()
            await self.pipeline.close()

        self.loop.run_until_complete(close_all())


def batch_stats(infos: list[dict[str, Any]]) -> dict[str, float]:
    """Mean/std/min/max of every numeric ``reward_extra_info`` key over a batch, plus the reward std."""
    if not infos:
        return {}

    def numeric(key: str) -> bool:  # by its first value that is not None (a failed sample's may be None)
        return isinstance(next((i[key] for i in infos if i[key] is not None), 0.0), (int, float))

    columns = {k: np.asarray([i[k] if i[k] is not None else np.nan for i in infos], dtype=float)
               for k in infos[0] if numeric(k)}
    stats = component_stats(columns)
    stats["reward/last_step_std"] = float(np.std(columns[SCORE]))
    return stats
