"""Which scorers a sample gets, by its ``data_source``: ``reward_kwargs.routes``.

Routes are tried in order; the first whose ``data_source`` patterns (exact names or
``fnmatch`` globs: ``math/*``, ``*``) match the sample's ``data_source`` decides its
reward models, their ensemble and its reward composition. A ``data_source`` that no
route matches is an error naming it and the routes (add a ``"*"`` route as the last one
to catch the rest). Without ``routes`` every sample goes to every RM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Mapping

import numpy as np

from verl_vllm_rm.rewards.ensemble import ensemble
from verl_vllm_rm.scoring.options import ManagerOptions, RouteOptions
from verl_vllm_rm.scoring.reward_model import RewardModel
from verl_vllm_rm.scoring.composition import Composition


class UnroutedDataSourceError(KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass
class Route:
    """A route as the manager uses it: its RMs (in order), ensemble, and its reward composition."""

    options: RouteOptions
    members: list[RewardModel]
    composition: Composition
    token_level: bool = False  # its one RM gives token-level step rewards
    #: the attributes (name -> weight) its members share when it ensembles per attribute (:func:`shared_attributes`)
    attributes: dict[str, float] | None = None

    @property
    def ensemble(self) -> str:
        return self.options.ensemble

    def combine(self, scales: list[tuple[float, list[float] | None] | None]
                ) -> tuple[float, float, tuple[np.ndarray, np.ndarray] | None]:
        """One sample's ensemble of its members' scales (:meth:`RewardModel.scale`; None: a masked member; at least
        one present): (value, std of the members' scores, and for a route with :attr:`attributes` each attribute's
        ensemble value and its std across the members)."""
        if self.attributes is not None:
            return self._combine_attributes([None if s is None else s[1] for s in scales])
        scaled = [math.nan if s is None else s[0] for s in scales]
        present = [x for x in scaled if not math.isnan(x)]
        if len(present) == 1:  # its own ensemble (std 0) for every method: no numpy call per sample then
            return present[0], 0.0, None
        values, stds = ensemble(np.array([scaled]), self.options.ensemble, self.options.uncertainty_penalty)
        return float(values[0]), float(stds[0]), None

    def _combine_attributes(self, rows: list[list[float] | None]
                            ) -> tuple[float, float, tuple[np.ndarray, np.ndarray]]:
        """Each attribute combined across the members (``rows``: their attribute values in the order of
        :attr:`attributes`) by the route's rule, then weighted: ``mean_minus_std`` penalises each attribute's
        disagreement, which members' weighted sums can hide."""
        weights = np.fromiter(self.attributes.values(), dtype=np.float64, count=len(self.attributes))
        values = np.array([np.full(len(weights), np.nan) if row is None else row for row in rows], dtype=np.float64)
        by_attribute, attribute_std = ensemble(values.T, self.options.ensemble, self.options.uncertainty_penalty)
        return float(weights @ by_attribute), float(np.nanstd(values @ weights)), (by_attribute, attribute_std)


def shared_attributes(members: list[RewardModel]) -> dict[str, float] | None:
    """The attributes of a route that ensembles per attribute: two members or more, all attribute RMs with the same
    ``attributes`` (names and weights). Any other route ensembles its members' rewards (an attribute RM's is its
    weighted sum). By name, the order of each member's values (``RewardModel.attribute_names``)."""
    first = members[0].options.attributes if len(members) > 1 else None
    if first is None or any(rm.options.attributes != first for rm in members[1:]):
        return None
    return {name: first[name] for name in members[0].attribute_names}


class Router:
    """The run's routes over its reward models (``reward_models``: by name); each data_source's route is found
    once and kept."""

    def __init__(self, options: ManagerOptions, tokenizer: Any, reward_models: Mapping[str, RewardModel]):
        self.routes: list[Route] = []
        compositions: list[Composition] = []  # routes with equal compositions share one
        for i, route in enumerate(options.route_options()):
            config = route.rewards or options.reward_config()
            composition = next((c for c in compositions if c.config == config), None)
            if composition is None:
                try:
                    composition = Composition(config, tokenizer)
                except ValueError as e:
                    where = f"routes[{i}].rewards" if route.rewards is not None else "rewards"
                    raise ValueError(f"reward_kwargs.{where}: {e}") from e
                compositions.append(composition)
            members = [reward_models[name] for name in options.route_models(route)]
            token_level = any(rm.options.step_reward == "token" for rm in members)
            self.routes.append(Route(route, members, composition, token_level, shared_attributes(members)))
        self._by_source: dict[str, Route] = {}

    def route(self, data_source: str) -> Route:
        found = self._by_source.get(data_source)
        if found is None:
            found = next((r for r in self.routes
                          if any(fnmatchcase(data_source, p) for p in r.options.data_source)), None)
            if found is None:
                patterns = [r.options.data_source for r in self.routes]
                raise UnroutedDataSourceError(
                    f"data_source {data_source!r} matches no route of reward_kwargs.routes (data_source patterns: "
                    f"{patterns}); add a route for it, or a last route with data_source ['*']")
            self._by_source[data_source] = found
        return found

    @property
    def ensembled_attributes(self) -> list[str]:
        """The attributes some route ensembles per attribute, each once."""
        return list(dict.fromkeys(a for r in self.routes for a in r.attributes or ()))

    @property
    def compositions(self) -> list[Composition]:
        """Each distinct composition once."""
        return list({id(r.composition): r.composition for r in self.routes}.values())
