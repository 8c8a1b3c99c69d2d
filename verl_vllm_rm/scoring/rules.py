"""The rule scorer: each composition's rule components over all of its rows at once.

``format``, ``length``, ``thought_length``, ``ngram`` are numpy over the padded ids of every row of a batch that
shares the composition; rm-gallery rewards (``gallery:<name>``, LLM judges among them, which may block on HTTP)
run on a thread so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

from verl_vllm_rm.rewards import RULE_COMPONENTS
from verl_vllm_rm.rewards.gallery import PREFIX as GALLERY_PREFIX
from verl_vllm_rm.rows import reference_text
from verl_vllm_rm.scoring.composition import Composition
from verl_vllm_rm.scoring.scorer import Batch, Scores


class RuleScorer:
    def __init__(self, compositions: Sequence[Composition], tokenizer: Any, reference_source: str):
        self.compositions = [c for c in compositions if c.has_rules]
        self.tokenizer, self.reference_source = tokenizer, reference_source
        self.columns = tuple(dict.fromkeys(key for c in self.compositions for key in c.rule_keys))
        #: the components among its columns (the rest are raw lengths)
        self.components = tuple(k for k in self.columns if k in RULE_COMPONENTS or k.startswith(GALLERY_PREFIX))

    async def score(self, batch: Batch) -> Scores:
        out = Scores.empty(len(batch), self.columns, self.components)
        for composition in self.compositions:
            rows = [i for i, route in enumerate(batch.routes) if route.composition is composition]
            if not rows:
                continue
            try:
                values = await self._components(composition, batch, rows)
            except Exception as e:  # e.g. an rm-gallery reward that failed: each of its rows gets the error
                for i in rows:
                    out.fail(i, e, stop=batch.batch_call)
                continue
            for key, column in values.items():
                if key in out.components:
                    out.components[key][rows] = column
                listed = out.columns[key]
                for i, value in zip(rows, column.tolist()):
                    listed[i] = value
        return out

    async def _components(self, composition: Composition, batch: Batch, rows: list[int]) -> dict[str, Any]:
        ids = [batch.samples[i].response_ids for i in rows]
        texts = [batch.texts[i] for i in rows]
        if not composition.gallery:  # numpy over the rows: inline
            return composition.rule_components(ids, texts, [""] * len(rows), [None] * len(rows))
        prompts = [self.tokenizer.decode(batch.samples[i].prompt_ids, skip_special_tokens=True) for i in rows]
        references = [reference_text(batch.samples[i].fields, self.reference_source) for i in rows]
        return await asyncio.get_running_loop().run_in_executor(
            None, composition.rule_components, ids, texts, prompts, references)

    async def close(self) -> None:
        """Nothing held."""
