"""The judge scorer: each row's share of its prompt group's one judgement (:class:`~verl_vllm_rm.judge.reward.
SampleJudge`), on the rows whose composition uses ``judge``."""

from __future__ import annotations

from verl_vllm_rm.extra_info import JUDGE_KEYS, JUDGE_VALID
from verl_vllm_rm.judge.reward import SampleJudge
from verl_vllm_rm.scoring.scorer import Batch, Scores


class JudgeScorer:
    columns = JUDGE_KEYS

    def __init__(self, judge: SampleJudge):
        self.judge = judge

    async def score(self, batch: Batch) -> Scores:
        out = Scores.empty(len(batch), self.columns, ("judge",))
        rows = [i for i, route in enumerate(batch.routes) if route.composition.needs_judge]
        calls = (self.judge.score(batch.samples[i], batch.texts[i]) for i in rows)
        for i, (value, info) in await out.gather_rows(rows, calls, stop=batch.batch_call):
            out.components["judge"][i] = float("nan") if value is None else value
            for key, column in info.items():
                out.columns[key][i] = column
            out.masked[i] = info.get(JUDGE_VALID) == 0.0
        return out

    async def close(self) -> None:
        await self.judge.close()
