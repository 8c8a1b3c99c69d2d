"""Per-step reward metrics from one step's per-sample ``reward_extra_info`` (the reward manager's columns).

Names (docs/metrics.md lists each with its meaning):
``reward/<component>/{mean,std,min,max}`` for every numeric component, ``reward/rm_valid_share``,
``reward/rm_failures``, ``reward/rm_latency_ms/{p50,p99}``, ``reward/rm_tokens``,
``reward/rm_prompt_tokens_dropped``, ``reward/rm_weight_version/{min,max}``, ``reward/rm_failed_over``, and the alarms
(:mod:`verl_vllm_rm.monitor.alarms`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from verl_vllm_rm.extra_info import (
    BOOKKEEPING,
    RM_FAILOVERS,
    RM_LATENCY_MS,
    RM_PROMPT_TOKENS_DROPPED,
    RM_SCORE,
    RM_TOKENS,
    RM_VALID,
    RM_WEIGHT_VERSION,
    SCORE,
    attribute_key,
)
from verl_vllm_rm.monitor import alarms
from verl_vllm_rm.rewards.compose import component_stats

def attribute_rises(watches) -> list[alarms.AttributeRise]:
    """One :class:`~verl_vllm_rm.monitor.alarms.AttributeRise` per ``reward_kwargs.attribute_alarms`` entry."""
    return [alarms.AttributeRise(f"{alarms.ATTRIBUTE_RISE}{w.reward_model}/{w.watch}_over_{w.against}",
                                 attribute_key(w.reward_model, w.watch), attribute_key(w.reward_model, w.against))
            for w in watches]


@dataclass
class StepRewards:
    """One PPO step's samples: prompt group (verl's ``uid``), response length, and the manager's columns."""

    groups: np.ndarray
    response_length: np.ndarray
    columns: dict[str, np.ndarray]

    @classmethod
    def from_rows(cls, groups: Sequence[Any], response_length: Sequence[int],
                  infos: Sequence[Mapping[str, Any]]) -> "StepRewards":
        """From per-sample ``reward_extra_info`` dicts: numeric keys become float columns (NaN where a row
        lacks one or holds None, e.g. ``win`` without a reference); keys holding anything else (text, lists)
        are left out."""
        names = {k for info in infos for k, v in info.items() if _is_number(v)}
        numeric = [k for k in sorted(names) if all(info.get(k) is None or _is_number(info[k]) for info in infos)]
        columns = {k: np.array([np.nan if info.get(k) is None else float(info[k]) for info in infos])
                   for k in numeric}
        return cls(np.asarray([str(g) for g in groups]), np.asarray(response_length, dtype=np.float64), columns)

    def __len__(self) -> int:
        return len(self.groups)

    @property
    def valid(self) -> np.ndarray:
        """Samples with an RM score (a sample whose route has no RM, ``rm_valid`` None, is not one)."""
        if RM_VALID not in self.columns:
            raise KeyError("no rm_valid column: these rewards are not from reward.reward_manager.name=vllm_rm")
        return self.columns[RM_VALID] == 1.0

    @property
    def failed(self) -> np.ndarray:
        """Samples whose RM score failed and was masked."""
        return self.columns[RM_VALID] == 0.0


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating, bool, np.bool_))


def step_metrics(step: StepRewards, normalized: bool, rises: Sequence[alarms.AttributeRise] = ()) -> dict[str, float]:
    """Every reward metric and alarm of one step (``normalized``: the RM returns sigmoid probabilities; ``rises``:
    the run's watched attribute pairs, which keep their first step)."""
    cols, valid = step.columns, step.valid
    kept = {RM_SCORE: valid, SCORE: ~step.failed}  # a masked sample has no score to summarise
    out = component_stats({name: values[kept[name]] if name in kept else values
                           for name, values in cols.items() if name not in BOOKKEEPING})
    asked = valid | step.failed
    out["reward/rm_valid_share"] = float(valid.sum() / asked.sum()) if asked.any() else 0.0
    out["reward/rm_failures"] = float(step.failed.sum())
    for name in (RM_TOKENS, RM_PROMPT_TOKENS_DROPPED):
        if name in cols:
            out[f"reward/{name}"] = float(np.nansum(cols[name]))
    if RM_FAILOVERS in cols:  # samples whose score came from another server after its first one failed
        out["reward/rm_failed_over"] = float((np.nan_to_num(cols[RM_FAILOVERS]) > 0).sum())
    if RM_LATENCY_MS in cols and asked.any():
        p50, p99 = np.percentile(cols[RM_LATENCY_MS][asked], [50, 99])
        out.update({"reward/rm_latency_ms/p50": float(p50), "reward/rm_latency_ms/p99": float(p99)})
    if RM_WEIGHT_VERSION in cols and valid.any():
        versions = cols[RM_WEIGHT_VERSION][valid]
        out.update({"reward/rm_weight_version/min": float(versions.min()),
                    "reward/rm_weight_version/max": float(versions.max())})
    out.update(alarm_metrics(step, normalized))
    for rise in rises:
        value = rise.value(cols)
        if value is not None:
            out[rise.metric] = value
    return out


def alarm_metrics(step: StepRewards, normalized: bool) -> dict[str, float]:
    """The alarms a single step can compute (drift needs the run's probe set: ``alarms.drift``)."""
    cols, valid = step.columns, step.valid
    values = {"alarm/dead_groups": alarms.dead_groups(step.groups, cols[SCORE]) if SCORE in cols else None}
    if RM_SCORE in cols:  # some sample of the step went to a reward model
        rm = cols[RM_SCORE][valid]
        values["alarm/length_hacking"] = alarms.length_correlation(rm, step.response_length[valid])
        values["alarm/saturation"] = alarms.saturation(rm, normalized)
        if "verifiable_score" in cols:
            verifiable = cols["verifiable_score"][valid]
            both = np.isfinite(verifiable)  # routes without a verifier have none
            values["alarm/verifiable_disagreement"] = alarms.verifiable_disagreement(
                step.groups[valid][both], rm[both], verifiable[both])
    return {k: v for k, v in values.items() if v is not None}
