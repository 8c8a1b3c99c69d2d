"""``VLLMRewardManager``, registered in verl's reward loop as ``vllm_rm``.

Thin: it builds the run's reward models, routes, judge and rule scorers from
``reward.reward_kwargs`` and hands verl's calls to the one orchestration
(:mod:`verl_vllm_rm.scoring.orchestration`: route each trajectory by its ``data_source``,
send it to every RM of its route at once, combine their scores, compose the reward).
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch
from omegaconf import DictConfig

from verl import DataProto
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.utils.reward_score import default_compute_score
from verl_vllm_rm.judge.reward import SampleJudge
from verl_vllm_rm.rows import last_output, samples_of, samples_of_rows
from verl_vllm_rm.scoring.extra_info import Examiner, info_keys, per_member_keys
from verl_vllm_rm.scoring.misrouted_config import warn_misrouted_config
from verl_vllm_rm.scoring.options import ConfigError, ManagerOptions, parse_options, reward_kwargs_of
from verl_vllm_rm.scoring.orchestration import Orchestration
from verl_vllm_rm.scoring.reward_model import RewardModel, refuse_token_level_when_streaming
from verl_vllm_rm.scoring.routing import Router
from verl_vllm_rm.scoring.row_queue import Row, RowQueue
from verl_vllm_rm.scoring.rules import batch_stats
from verl_vllm_rm.scoring.verifiable import SCORE_KEY, VerifiableScorer


@register("vllm_rm")
class VLLMRewardManager(Orchestration, RewardManagerBase):
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
        #: per-RM keys in reward_extra_info (per_member_keys)
        self.per_member = per_member_keys(rm_options)
        own_keys = info_keys(self.reward_models, self.per_member, self.router.rule_scorers,
                             judge=self.judge is not None, pairwise=self.options.pairwise != "never",
                             ensembled_attributes=self.router.ensembled_attributes)
        self.verifiable = VerifiableScorer(self.compute_score, self.options.compute_score_keys, frozenset(own_keys))
        #: verl's managers' attribute: ``compute_score`` is a coroutine function (awaited, not run in a thread)
        self.is_async_reward_score = self.verifiable.is_async
        verifiable_keys = self.verifiable.keys if SCORE_KEY in own_keys else ()
        self.info_keys = own_keys + verifiable_keys
        self.last_batch_stats: dict[str, float] = {}
        self._row_queue = RowQueue(self._score_rows)
        self.examiner = Examiner(tokenizer, self.options.num_examine)
        self.failed = 0
        self.references_missing = 0

    # -- verl reward-loop API -----------------------------------------------------------
    async def run_single(self, data: DataProto) -> dict:
        """One trajectory's reward, of its last output (:func:`last_output`, as verl's own managers score it); the
        trajectories verl hands over in one loop iteration are scored together (RowQueue)."""
        return await self._row_queue.put(last_output(data))

    async def _score_rows(self, rows: list[Row]) -> None:
        samples = samples_of_rows([data for data, _ in rows])
        await self.score_samples(samples, [future for _, future in rows], complete=False)

    def __call__(self, data: DataProto, return_dict: bool = False):
        """Legacy batch API: a reward tensor shaped like ``responses`` (score at the last valid token).
        Every sample is queued before the first is awaited; the first sample's error stops the batch."""
        async def score_all() -> list[dict]:
            samples = samples_of([data])
            futures = [self.loop.create_future() for _ in samples]
            scoring = asyncio.ensure_future(self.score_samples(samples, futures, complete=True))
            try:
                return await asyncio.gather(*futures)
            finally:  # an error stops the batch: nothing it started is left running
                if not scoring.done():
                    scoring.cancel()
                await asyncio.gather(scoring, return_exceptions=True)
                for future in futures:
                    future.cancel()

        outputs = self.loop.run_until_complete(score_all())
        self.last_batch_stats = batch_stats([o["reward_extra_info"] for o in outputs])
        reward_tensor = self.assemble_rm_scores(data, [o["reward_score"] for o in outputs])
        if not return_dict:
            return reward_tensor
        keys = outputs[0]["reward_extra_info"].keys() if outputs else []
        return {
            "reward_tensor": reward_tensor,
            "reward_extra_info": {k: [o["reward_extra_info"][k] for o in outputs] for k in keys},
        }

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

    async def warm_up(self) -> None:
        """Connect to every RM's server and read its ``max_model_len`` (otherwise done by the first sample)."""
        await self._probe(self.reward_models.values())

    def close(self) -> None:
        """Close this manager's HTTP sessions (verl keeps managers for the whole run)."""
        async def close_all() -> None:
            judge = [self.judge.close()] if self.judge is not None else []
            await self._row_queue.close()
            await asyncio.gather(*(rm.close() for rm in self.reward_models.values()), *judge)

        self.loop.run_until_complete(close_all())
