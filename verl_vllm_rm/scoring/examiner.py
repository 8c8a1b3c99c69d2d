"""The ``num_examine`` samples of each ``data_source`` printed with their prompt, response and every column."""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping

from verl_vllm_rm.rows import Sample


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
