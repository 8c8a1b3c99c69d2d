"""The running whitening of the reward-loop workers, saved with verl's checkpoints and given back on resume.

Each of verl's reward-loop workers (a Ray actor holding its own ``VLLMRewardManager``) whitens
with its own statistics. At each checkpoint the trainer asks every worker what it has seen since
it started, merges that with the statistics the run started from (Chan's parallel update) and
writes them to ``whitening.json`` in the step's folder (``online_rm/`` with online RM training,
``vllm_rm/`` otherwise). A resumed run reads that file and gives the merged statistics to every
worker as its prior before the first score; what a worker adds from then on is counted once.
Validation samples are whitened on the current statistics and never update them. The file has one
entry per whitening: a whitened RM's name, or for an attribute RM (whitened per attribute) one
``<rm>/<attribute>`` per attribute.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Iterable, Sequence

from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.rewards.ensemble import Moments
from verl_vllm_rm.plugin.reward_workers import manager_of, on_every_worker
from verl_vllm_rm.scoring.options import RewardModelOptions

logger = logging.getLogger(__name__)

WHITENING_FILE = "whitening.json"


def whitening_keys(reward_models: Iterable[RewardModelOptions]) -> list[str]:
    """The keys of the run's running whitenings (``run_reward_models(config)``): each RM with ``whiten=running`` by
    name, or with ``attributes`` one per attribute, ``<rm>/<attribute>``."""
    return [key for o in reward_models for key in o.whitening_keys]


def _whitenings(worker: Any) -> dict[str, Any]:
    return {key: w for rm in manager_of(worker).reward_models.values() for key, w in rm.whitenings.items()}


def _seen_in_worker(worker: Any) -> dict[str, dict[str, float]]:
    return {key: w.seen.to_dict() for key, w in _whitenings(worker).items()}


def _start_worker_from(worker: Any, priors: dict[str, dict[str, float]]) -> None:
    whitenings = _whitenings(worker)
    for key, prior in priors.items():
        whitenings[key].start_from(Moments.from_dict(prior, f"whitening prior of {key!r}"))


def _statistics_of(key: str) -> str:
    """Whose statistics a key holds, for the warnings."""
    rm, _, attribute = key.partition("/")
    return f"reward model {rm!r}, attribute {attribute!r}" if attribute else f"reward model {rm!r}"


class WhiteningCheckpoint:
    """The whitening statistics of ``names`` (:func:`whitening_keys`) across the reward-loop ``workers`` (Ray actor
    handles)."""

    def __init__(self, names: Sequence[str], workers: Sequence[Any]) -> None:
        self.names = list(names)
        self.workers = list(workers)
        self.prior = {name: Moments() for name in self.names}

    def merged(self) -> dict[str, Moments]:
        """The statistics the run started from, merged with every worker's scores since."""
        seen = on_every_worker(self.workers, _seen_in_worker)
        merged = {}
        for name in self.names:
            moments = self.prior[name]
            for i, worker_seen in enumerate(seen):
                moments = moments.merged(Moments.from_dict(worker_seen[name], f"reward-loop worker {i}, {name!r}"))
            merged[name] = moments
        return merged

    def save(self, folder: str) -> None:
        """Write the merged statistics to ``folder/whitening.json`` (atomically)."""
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, WHITENING_FILE)
        state = {"reward_models": {name: m.to_dict() for name, m in self.merged().items()}}
        with open(f"{path}.tmp", "w") as f:
            json.dump(state, f, indent=1)
        os.replace(f"{path}.tmp", path)

    def resume(self, folder: str) -> dict[str, Moments]:
        """Start every worker from the statistics saved in ``folder`` (before any score of the resumed run).

        An RM or attribute the file does not have (a checkpoint saved without whitening, or one added since) starts
        afresh, with a warning; a file that is not what :meth:`save` writes is an error naming it.
        """
        path = os.path.join(folder, WHITENING_FILE)
        saved = self._read(path) if os.path.exists(path) else {}
        for name in self.names:
            if name in saved:
                self.prior[name] = saved[name]
            else:
                logger.warning("checkpoint %s has no whitening statistics of %s: they start afresh", folder,
                               _statistics_of(name))
        for name in sorted(set(saved) - set(self.names)):
            logger.warning("%s has whitening statistics of %r, which this run does not whiten: ignored", path, name)
        priors = {name: self.prior[name].to_dict() for name in self.names}
        on_every_worker(self.workers, _start_worker_from, priors)
        return dict(self.prior)

    @staticmethod
    def _read(path: str) -> dict[str, Moments]:
        try:
            with open(path) as f:
                models = json.load(f)["reward_models"]
            return {name: Moments.from_dict(state, f"{path}, {name!r}") for name, state in models.items()}
        except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as e:
            raise ConfigError(f"cannot resume the reward whitening from {path}: {e}; restore the file from the "
                              "checkpoint's copy or delete it to restart the statistics") from e
