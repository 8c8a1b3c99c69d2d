"""Any rm-gallery reward, by registry name, as the batch component ``gallery:<name>``.

rm-gallery is an optional extra: its declared dependencies (``transformers<5``,
label-studio, ...) conflict with verl, so it is installed without them (see
``INSTALL_HINT``) and imported only when a ``gallery:`` component is built (the
import takes seconds).

How rm-gallery is driven (rm-gallery 0.1.7):

* ``RewardRegistry.get(name)`` returns a CLASS (a pydantic model); its fields are
  the reward's parameters. Unknown parameters are silently ignored by pydantic,
  so we reject them here, listing the valid ones.
* A point-wise reward scores ``DataSample(input=[user message], output=[one
  DataOutput(answer=Step(content=response, label={"reference": ...}))])`` through
  ``reward.evaluate(sample)``; the score is ``output[0].answer.reward.score``.
  List-wise and pair-wise rewards rank several responses to one prompt and are
  refused: the reward loop scores one rollout at a time.
* LLM judges need an OpenAI-compatible client: ``params["llm"]`` is a dict of
  ``rm_gallery.core.model.openai_llm.OpenaiLLM`` fields (``model``, ``base_url``,
  ``openai_api_key``, ``max_retries``, ...; key and URL fall back to the
  ``OPENAI_API_KEY`` and ``BASE_URL`` environment variables).
* A failed judge call does NOT raise in rm-gallery: it logs, returns no score
  dimension and leaves the score at 0.0. We detect the missing dimension and
  raise ``GalleryRewardError``, so an unreachable judge can never train the
  policy on zeros. How long it takes to give up is rm-gallery's: the reward's
  ``max_retries`` (default 3) times the OpenAI client's ``llm.max_retries``
  (default 10, with backoff) with a 60 s timeout each; lower them to fail fast.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType, SimpleNamespace
from typing import Any, Mapping, Sequence

import numpy as np

PREFIX = "gallery:"
INSTALL_HINT = (
    "rm-gallery is not installed (it is an optional extra whose declared dependencies conflict with verl). "
    "Install it without its dependencies, then the few packages its import needs:\n"
    "    pip install --no-deps rm-gallery==0.1.7\n"
    "    pip install -r requirements/gallery.txt   # from the verl-vllm-rm source tree"
)


class GalleryRewardError(RuntimeError):
    """An rm-gallery reward produced no score (e.g. its LLM judge could not be reached)."""


def _keep_host_logging() -> None:
    """Stop rm-gallery's import from reconfiguring the host process's logging.

    ``import rm_gallery`` calls its ``init_logger()``, which removes every loguru
    handler of the process (the trainer's included), adds its own stdout handler
    and writes ``./log/rm_gallery.log`` into the working directory. Registering a
    no-op ``init_logger`` under that module's name before the first import keeps
    the host's handlers and writes no file; rm-gallery's messages still reach
    whatever loguru handlers the host has.
    """
    if "rm_gallery" in sys.modules:
        return
    quiet = ModuleType("rm_gallery.core.utils.logger")
    quiet.init_logger = lambda: None
    sys.modules.setdefault(quiet.__name__, quiet)


def _rm_gallery() -> SimpleNamespace:
    """Import rm-gallery lazily; a missing install raises ImportError with the pip commands."""
    _keep_host_logging()
    try:
        from rm_gallery.core.data.schema import DataOutput, DataSample, Step
        from rm_gallery.core.model.message import ChatMessage, MessageRole
        from rm_gallery.core.model.openai_llm import OpenaiLLM
        from rm_gallery.core.reward.base import BaseLLMReward, BasePointWiseReward
        from rm_gallery.core.reward.registry import RewardRegistry
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT}\n(import failed: {exc})") from exc
    return SimpleNamespace(DataOutput=DataOutput, DataSample=DataSample, Step=Step, ChatMessage=ChatMessage,
                           MessageRole=MessageRole, OpenaiLLM=OpenaiLLM, BaseLLMReward=BaseLLMReward,
                           BasePointWiseReward=BasePointWiseReward, RewardRegistry=RewardRegistry)


def gallery_reward_names() -> list[str]:
    """Every name in rm-gallery's registry (``RewardRegistry.list()`` only renders a table)."""
    return sorted(_rm_gallery().RewardRegistry._registry)


class GalleryReward:
    """One rm-gallery point-wise reward, built once, called on a batch of decoded responses."""

    def __init__(self, name: str, params: Mapping[str, Any] | None = None) -> None:
        rg = _rm_gallery()
        names = gallery_reward_names()
        if name not in names:
            raise ValueError(f"unknown rm-gallery reward {name!r} (component '{PREFIX}{name}'); "
                             f"valid names: {', '.join(names)}")
        cls = rg.RewardRegistry.get(name)
        if not issubclass(cls, rg.BasePointWiseReward):
            pointwise = [n for n in names if issubclass(rg.RewardRegistry.get(n), rg.BasePointWiseReward)]
            raise ValueError(f"'{PREFIX}{name}' ranks several responses at once ({cls.__name__}); the reward loop "
                             f"scores one rollout at a time. Point-wise rewards: {', '.join(pointwise)}")
        kwargs = dict(params or {})
        unknown = sorted(set(kwargs) - set(cls.model_fields))
        if unknown:
            raise ValueError(f"'{PREFIX}{name}' has no parameter(s) {unknown}; "
                             f"valid: {', '.join(sorted(cls.model_fields))}")
        self.name = name
        self.is_judge = issubclass(cls, rg.BaseLLMReward)
        if self.is_judge:
            if not isinstance(kwargs.get("llm"), Mapping):
                raise ValueError(f"'{PREFIX}{name}' is an LLM judge: give params.llm, a dict such as "
                                 "{'model': 'judge', 'base_url': 'http://127.0.0.1:8000/v1', 'openai_api_key': 'KEY'}")
            kwargs["llm"] = rg.OpenaiLLM(**kwargs["llm"])
        self.reward = cls(**kwargs)
        self._rg = rg

    def _sample(self, index: int, response: str, prompt: str | None, reference: str | None) -> Any:
        rg = self._rg
        role = rg.MessageRole
        label = {} if reference is None else {"reference": reference}
        return rg.DataSample(
            unique_id=str(index),
            input=[] if prompt is None else [rg.ChatMessage(role=role.USER, content=prompt)],
            output=[rg.DataOutput(answer=rg.Step(role=role.ASSISTANT, content=response, label=label))],
        )

    def _score(self, index: int, evaluated: Any) -> float:
        answer = evaluated.output[0].answer
        if not answer.reward.details:
            error = answer.additional_kwargs.get(self.reward.name, {}).get("error", "no error message")
            where = f" at {self.reward.llm.base_url}" if self.is_judge else ""
            raise GalleryRewardError(
                f"'{PREFIX}{self.name}' gave no score for response {index}: {error}. rm-gallery reports a failed "
                f"judge call as a 0.0 score; it is refused here. Check that the judge{where} is reachable and "
                "serves the configured model."
            )
        return float(answer.reward.score)

    def __call__(self, responses: Sequence[str], prompts: Sequence[str] | None = None,
                 references: Sequence[str] | None = None) -> np.ndarray:
        """Score each response; ``prompts`` are required by LLM judges, ``references`` by reference-based rewards."""
        if self.is_judge and prompts is None:
            raise ValueError(f"'{PREFIX}{self.name}' is an LLM judge and needs the prompts")
        for what, seq in (("prompts", prompts), ("references", references)):
            if seq is not None and len(seq) != len(responses):
                raise ValueError(f"{len(seq)} {what} for {len(responses)} responses")
        samples = [self._sample(i, r, None if prompts is None else prompts[i],
                                None if references is None else references[i]) for i, r in enumerate(responses)]
        if self.is_judge:  # network-bound: overlap the judge calls
            with ThreadPoolExecutor(max_workers=self.reward.max_workers) as pool:
                evaluated = list(pool.map(self.reward.evaluate, samples))
        else:
            evaluated = [self.reward.evaluate(s) for s in samples]
        return np.array([self._score(i, e) for i, e in enumerate(evaluated)], dtype=np.float64)
