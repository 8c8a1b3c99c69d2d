"""The verifiable scorer: verl's ``compute_score`` of one sample, and its ``reward_extra_info`` columns.

Its columns keep verl's own names, as verl's ``naive`` manager emits them: a dict result's keys as they are (the
reward is ``result["score"]``, kept as ``verifiable_score``), and a number's value as ``acc``. DAPO's
``algorithm.filter_groups.metric=acc`` and recipes reading ``acc``/``pred`` find them.

verl 0.9.1 builds a step's columns from its FIRST sample's keys (``agent_loop.py`` ``_postprocess``,
``reward_loop.py`` ``compute_rm_score``): a key a later sample lacks raises ``KeyError``, a key the first lacks is
dropped. So the keys are declared before the first sample and every sample carries all of them (None where its
result has no such value): ``acc`` always; ``pred`` with verl's default scorer (its ``math_dapo`` scorer returns
``{score, acc, pred}``, its others a number); a user's function declares its own in
``reward_kwargs.compute_score_keys``. A key nobody declared is left out of every sample, with a warning naming it
and the option (once per key). A key that is one of the package's own columns (``format``, ``win``, ...) is refused
at the first sample that returns it: its values would overwrite the package's.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from typing import Any, Callable, Mapping

from verl.utils.reward_score import default_compute_score
from verl_vllm_rm.options import ConfigError

logger = logging.getLogger("verl_vllm_rm")

#: The column of a number ``compute_score`` returns, as verl's ``naive`` names it.
NUMBER_KEY = "acc"
#: The dict keys verl's default scorer returns besides ``score`` (``math_dapo``: ``{score, acc, pred}``).
DEFAULT_SCORER_KEYS = (NUMBER_KEY, "pred")
#: The package's column of the reward ``compute_score`` gave (its ``score``; the package's ``score`` is the total).
SCORE_KEY = "verifiable_score"


def is_verls_default(compute_score: Callable | None) -> bool:
    """Whether ``compute_score`` is verl's default scorer (as ``load_reward_manager`` hands it: itself, or a partial
    with the sandbox's URL)."""
    func = compute_score.func if isinstance(compute_score, functools.partial) else compute_score
    return func is None or func is default_compute_score


def declared_keys(compute_score: Callable | None, user_keys: tuple[str, ...]) -> tuple[str, ...]:
    """The verifiable scorer's columns besides ``verifiable_score``: ``acc``, verl's default scorer's ``pred``,
    and the user's ``compute_score_keys``, each once."""
    own = DEFAULT_SCORER_KEYS if is_verls_default(compute_score) else (NUMBER_KEY,)
    return tuple(dict.fromkeys((*own, *user_keys)))


def extra_info_for(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The ``extra_info`` verl's ``naive`` manager hands ``compute_score``, on a copy (the row's own dict is not
    changed): the row's ``extra_info``, its ``tool_extra_fields``, ``num_turns`` (``__num_turns__``) and
    ``rollout_reward_scores`` (``reward_scores``)."""
    extra_info = dict(fields.get("extra_info") or {})
    tool_extra_fields = fields.get("tool_extra_fields")
    if tool_extra_fields is not None:
        extra_info.update(tool_extra_fields.items())
    extra_info["num_turns"] = fields.get("__num_turns__")
    extra_info["rollout_reward_scores"] = fields.get("reward_scores", {})
    return extra_info


class VerifiableScorer:
    """verl's ``compute_score`` (or the user's) with its declared columns; ``taken``: the package's own columns,
    which a result's key may not name."""

    def __init__(self, compute_score: Callable, user_keys: tuple[str, ...], taken: frozenset[str]):
        self.compute_score = compute_score
        self.is_async = inspect.iscoroutinefunction(compute_score)
        self.keys = declared_keys(compute_score, user_keys)
        self._taken = taken
        for key in self.keys:
            if key in taken:
                self._refuse(key, "reward_kwargs.compute_score_keys declares")
        self._known = frozenset((*self.keys, "score"))
        self._warned: set[str] = set()

    async def score(self, loop: asyncio.AbstractEventLoop, fields: Mapping[str, Any], text: str
                    ) -> tuple[float, dict[str, Any]]:
        """One sample's reward from ``compute_score`` and its declared columns (None where the result has none);
        a sync function runs in a thread (verifiers may be slow)."""
        kwargs = dict(data_source=fields["data_source"], solution_str=text,
                      ground_truth=fields["reward_model"]["ground_truth"], extra_info=extra_info_for(fields))
        if self.is_async:
            result = await self.compute_score(**kwargs)
        else:
            result = await loop.run_in_executor(None, lambda: self.compute_score(**kwargs))
        return self.columns(result)

    def columns(self, result: Any) -> tuple[float, dict[str, Any]]:
        """``compute_score``'s reward and the declared columns of its result (a number, or a dict with ``score``)."""
        extras = dict.fromkeys(self.keys)
        if not isinstance(result, dict):
            extras[NUMBER_KEY] = float(result)
            return float(result), extras
        if "score" not in result:
            raise ValueError(f"compute_score returned a dict without 'score': {sorted(result)}; return a number or "
                             "a dict whose 'score' is the reward (its other keys become reward_extra_info columns)")
        for key in result.keys() - self._known:
            self._undeclared(key)
        extras.update((key, result[key]) for key in self.keys if key in result)
        return float(result["score"]), extras

    def _undeclared(self, key: str) -> None:
        if key in self._taken:
            self._refuse(key, "compute_score returned")
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(
                "compute_score returned the key %r, which reward_kwargs.compute_score_keys does not declare: it is "
                "left out of every sample's reward_extra_info (verl builds a step's columns from its first sample's "
                "keys, so every sample carries the same ones); add +reward.reward_kwargs.compute_score_keys=[%s] to "
                "keep it", key, key)

    @staticmethod
    def _refuse(key: str, where: str) -> None:
        raise ConfigError(f"{where} the key {key!r}, which collides with vllm_rm's own reward_extra_info column "
                          f"{key!r}: one would overwrite the other; rename {key!r} in your compute_score "
                          "(docs/metrics.md lists the names vllm_rm takes)")
