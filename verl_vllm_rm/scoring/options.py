"""Options of the ``vllm_rm`` reward manager, read from ``reward.reward_kwargs``.

Every option is a typed dataclass field with a default, validated by
:func:`verl_vllm_rm.options.build`: an unknown key or a value of the wrong type is
an error that lists the valid options, so a typo in a Hydra override fails at
start-up instead of silently using a default.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, Mapping, Sequence

from verl_vllm_rm.client.options import ClientOptions
from verl_vllm_rm.judge.options import FailurePolicy, JudgeOptions
from verl_vllm_rm.options import ConfigError, build, check_ranges, flat_values, inline
from verl_vllm_rm.protocol.defaults import DEFAULT_SERVER_URL
from verl_vllm_rm.replicas.options import ReplicaOptions
from verl_vllm_rm.rewards.config import CombineMode, RewardConfig
from verl_vllm_rm.rewards.ensemble import EnsembleMethod
from verl_vllm_rm.rewards.steps import SCALAR_STEP_REWARDS, StepReward
from verl_vllm_rm.rows import validate_reference_source
from verl_vllm_rm.scoring.rm_inputs import check_rubric_template
from verl_vllm_rm.scoring.step_format import StepFormat

__all__ = ["ConfigError", "ManagerOptions", "RewardModelOptions", "RouteOptions", "parse_options"]

InputFormat = Literal["token_ids", "chat_template"]
OverlongPolicy = Literal["truncate_prompt_left", "error"]
PairwiseMode = Literal["auto", "always", "never"]
MissingReference = Literal["raise", "skip"]
Whiten = Literal["none", "running"]


#: A reward model's name: it becomes part of ``reward_extra_info`` keys (``rm_score_<name>``) and metric names.
RM_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
#: The name of the one RM that the top-level options describe when ``reward_models`` is not given.
DEFAULT_RM_NAME = "rm"


def attribute_whitening_key(rm_name: str, attribute: str) -> str:
    """``<rm>/<attribute>``: the key of one attribute's running whitening (and of its checkpoint entry)."""
    return f"{rm_name}/{attribute}"


@dataclass(frozen=True)
class RewardModelOptions:
    """One reward model: where it is served, how its input is built, how its score is read.

    The top-level ``reward_kwargs`` options of these names describe the one RM of a single-RM
    run and are the defaults of every entry of ``reward_kwargs.reward_models``.
    """

    client: ClientOptions = inline(ClientOptions)
    """Where the RM is served and how it is asked: ``server_url``, ``api_key``, the timeouts, retries, batches."""
    name: str = DEFAULT_RM_NAME
    """The RM's name (with ``reward_models``, each entry's; ``[a-z][a-z0-9_]*``), used in routes and in per-RM keys
    and metrics."""
    input_format: InputFormat = "token_ids"
    """``token_ids``: the policy's prompt + response ids (the RM shares the policy tokenizer); ``chat_template``: the
    raw chat + decoded response rendered with the RM tokenizer's template (needs ``data.return_raw_chat=True``)."""
    rm_tokenizer_path: str | None = None
    """The RM's tokenizer, required for ``input_format=chat_template``."""
    max_length: int | None = None
    """Longest RM input in tokens; unset: the server's ``max_model_len`` (less the reward token it appends, where the
    model has one), read from ``/health``."""
    overlong_policy: OverlongPolicy = "truncate_prompt_left"
    """An input past ``max_length``: drop prompt tokens from the left so the whole response is scored, or ``error``."""
    failure_policy: FailurePolicy = "raise"
    """``raise``: a failed score stops the step naming the server and the cause; ``mask``: the sample gets no reward
    (0.0) with ``rm_valid=0.0`` and is counted in ``failed``."""
    normalize: bool | None = None
    """Sigmoid of the RM logit instead of the raw logit (a two-class head: P(good); a process RM: P(positive) per
    step); unset: true for a process reward model's steps (the number its card gives), false otherwise."""
    whiten: Whiten = "none"
    """``running``: whiten this RM's scores (an attribute RM: each attribute) with its running mean and std before
    the ensemble."""
    step_reward: StepReward = "none"
    """Process rewards from a server started with ``--step-tag-id``: ``min``, ``last``, ``mean`` of the step scores,
    ``prod`` of their sigmoids, or ``token`` (each step's score on the policy token that ends it)."""
    step_format: StepFormat = "auto"
    """How the response's steps reach a process RM: ``qwen_prm`` (steps joined by the step tag, one more after the
    last, in the RM's chat template after a system message and the question), ``math_shepherd`` (question, then one
    step per line each ending in the tag), ``tagged`` (the response carries the tags itself), or ``auto``: the
    served head's (a step classifier: ``qwen_prm``; a causal LM read at step tags: ``math_shepherd``; else
    ``tagged``)."""
    step_split: str | None = None
    """Where steps end in the response text (``qwen_prm``, ``math_shepherd``); steps of whitespace only are dropped.
    Unset: a blank line for ``qwen_prm``, a line break for ``math_shepherd``."""
    system_prompt: str | None = None
    """A system message placed first in every conversation rendered with the RM's chat template
    (``input_format=chat_template``, ``step_format=qwen_prm``), in place of the chat's own; unset: none
    (``qwen_prm``: its card's)."""
    rubric_template: str | None = None
    """Score a rubric text instead: a ``str.format`` template with ``{prompt}``, one ``{response}`` and optional
    ``{principles}``."""
    rubric_principles: list[str] = field(default_factory=lambda: ["helpfulness", "harmlessness", "honesty"])
    """The list put in the rubric's ``{principles}``, one ``- item`` per line."""
    replicas: ReplicaOptions | None = None
    """Servers the plugin starts and supervises on verl's Ray cluster, instead of ``server_url``."""
    attributes: dict[str, float] | None = None
    """An attribute head's outputs to use, each with its weight (e.g. ``{helpfulness: 1.0, verbosity: -0.2}``): the
    RM's reward is their weighted sum; weight 0 reports one without rewarding it."""

    def __post_init__(self) -> None:
        if self.replicas is not None and list(self.client.server_url) != [DEFAULT_SERVER_URL]:
            raise ValueError(f"reward model {self.name!r} has both server_url {list(self.client.server_url)} and "
                             "replicas: managed replicas replace server_url; drop one of them (an RM either has "
                             "servers you started or replicas the plugin starts)")
        if not RM_NAME.fullmatch(self.name):
            raise ValueError(f"reward model name {self.name!r} must match {RM_NAME.pattern} (it names metrics)")
        check_ranges(self, {"> 0": ("max_length",)})
        self._check_attributes()
        if self.rubric_template is not None:
            if self.input_format == "chat_template":
                raise ValueError("rubric_template replaces input_format=chat_template; use one of them")
            check_rubric_template(self.rubric_template)
        if self.step_reward == "token" and self.whiten != "none":
            raise ValueError("step_reward=token puts each raw step score on its token; whiten rescales one number per "
                             "sample: use whiten=none with it, or a scalar step_reward")
        if self.step_reward == "token" and (self.input_format != "token_ids" or self.rubric_template is not None):
            raise ValueError("step_reward=token places step scores on the policy's own response tokens: it needs "
                             "input_format=token_ids without rubric_template (or use a scalar step_reward: "
                             f"{', '.join(SCALAR_STEP_REWARDS)})")
        self._check_steps()
        if self.input_format == "chat_template" and not self.rm_tokenizer_path:
            raise ValueError(
                "input_format=chat_template needs reward_kwargs.rm_tokenizer_path "
                "(the reward model's tokenizer, whose chat template builds the RM input)"
            )

    def _check_steps(self) -> None:
        where = f"reward model {self.name!r}"
        if self.step_reward == "none" and (self.step_format != "auto" or self.step_split is not None):
            raise ValueError(f"{where}: step_format and step_split say how a process reward model reads the "
                             "response's steps, and step_reward is none: set step_reward (min, last, mean, prod, "
                             "token) or drop them")
        if self.step_split == "":
            raise ValueError(f"{where}: step_split is empty: give the text that ends a step (e.g. a blank line)")
        if self.system_prompt is not None and self.input_format != "chat_template" and self.step_reward == "none":
            raise ValueError(f"{where}: system_prompt goes into a conversation rendered with the RM's chat template, "
                             "and this RM reads the policy's own ids (input_format=token_ids): set "
                             "input_format=chat_template (with rm_tokenizer_path) or drop system_prompt")

    def _check_attributes(self) -> None:
        if self.attributes is None:
            return
        where = f"reward model {self.name!r}"
        if not self.attributes:
            raise ValueError(f"{where}: attributes is empty: name the attributes of its head to use, each with its "
                             "weight, e.g. {helpfulness: 1.0, verbosity: -0.2}")
        bad = {name: w for name, w in self.attributes.items() if not math.isfinite(w)}
        if bad:
            raise ValueError(f"{where}: attribute weights must be finite numbers, got {bad}")
        if self.step_reward != "none":
            raise ValueError(f"{where}: attributes are read once per response, step_reward per step: an attribute "
                             "head has no step scores; drop step_reward or attributes")

    @property
    def whitening_keys(self) -> tuple[str, ...]:
        """The keys of this RM's running whitenings (and of their entries in the whitening checkpoint): its name,
        or with ``attributes`` one per attribute, ``<name>/<attribute>`` (no RM name has a ``/``: no collision)."""
        if self.whiten == "none":
            return ()
        if self.attributes is None:
            return (self.name,)
        return tuple(attribute_whitening_key(self.name, attribute) for attribute in self.attributes)


@dataclass(frozen=True)
class RouteOptions:
    """Which scorers a sample gets, by its ``data_source`` (first matching route wins)."""

    data_source: list[str]
    """Exact names or fnmatch globs (``math/*``; ``"*"`` catches the rest); a data_source no route matches is an
    error."""
    reward_models: tuple[str, ...] | None = None
    """Names from ``reward_models``; unset: all of them; ``[]``: none (rules and ``compute_score`` only)."""
    ensemble: EnsembleMethod = "mean"
    """How the route's RMs combine; ``mean_minus_std`` is mean - ``uncertainty_penalty`` x std."""
    uncertainty_penalty: float = 1.0
    """The lambda of ``ensemble=mean_minus_std``."""
    rewards: RewardConfig | None = None
    """The route's composition (``rubric`` is the ensemble's value); unset: the manager's."""

    def __post_init__(self) -> None:
        check_ranges(self, {">= 0": ("uncertainty_penalty",)})


@dataclass(frozen=True)
class AttributeAlarmOptions:
    """Watch one attribute of an attribute RM against another (``alarm/attribute_rise/<rm>/<watch>_over_<against>``)."""

    watch: str
    """The attribute whose rise is watched (e.g. ``verbosity``)."""
    against: str
    """The attribute it is compared with (e.g. ``helpfulness``)."""
    reward_model: str = DEFAULT_RM_NAME
    """The attribute RM's name; both attributes must be in its ``attributes``."""


@dataclass(frozen=True)
class ManagerOptions:
    """All options of ``reward.reward_manager.name=vllm_rm`` (docs/rewards.md; each one:
    docs/reference/configuration.md)."""

    rm: RewardModelOptions = inline(RewardModelOptions)
    """The run's one reward model, or the defaults of every ``reward_models`` entry (keys at the top level)."""
    reward_models: tuple[dict, ...] = ()
    """Several named RMs, each entry over the top-level options of this section (what it leaves out it takes from
    them); unset: the top-level options are the one RM, ``rm``."""
    routes: tuple[RouteOptions, ...] = ()
    """Per-``data_source`` RMs, ensemble and composition (first matching route wins); unset: one route, every RM,
    ``mean``."""
    combine: CombineMode = "replace"
    """With verl's ``compute_score``: ``replace`` (RM only: the default without ``rewards``), ``add``, ``multiply``,
    ``weighted``; a shorthand for a ``rewards`` composition."""
    alpha: float = 0.5
    """``combine=weighted``: ``alpha * rm + (1 - alpha) * verifiable``."""
    coalesce_ms: float = 5.0
    """How long per-sample calls (``run_single``) arriving one at a time are collected into one grouped request
    (rows verl hands over together, in one event-loop iteration, are sent at once)."""
    num_examine: int = 1
    """Samples printed per data source (prompt, response, every component)."""
    rewards: RewardConfig | None = None
    """A weighted composition of reward components, the general form of ``combine``; unset: ``combine`` decides
    (``replace``: the RM score alone); ``{}``: RM-Gallery's recipe (0.95 rubric + 0.05 format + length + ngram)."""
    pairwise: PairwiseMode = "auto"
    """Compare each response with the prompt's reference answer: ``auto`` (in verl's validation), ``always`` or
    ``never``."""
    reference_source: str = "ground_truth"
    """Where the reference answer is: ``ground_truth``, ``extra_info:<key>``, or ``rm_gallery``."""
    missing_reference: MissingReference = "raise"
    """A sample without a reference: ``raise`` (naming the sample and the source) or ``skip`` (counted)."""
    judge: JudgeOptions | None = None
    """A generative judge for the ``judge`` component of the composition."""
    attribute_alarms: tuple[AttributeAlarmOptions, ...] = ()
    """Watched attribute pairs of an attribute RM: the alarm ``alarm/attribute_rise/<rm>/<watch>_over_<against>``."""
    compute_score_keys: tuple[str, ...] = ()
    """The keys of your ``compute_score``'s dict result (besides ``score`` and ``acc``) kept as ``reward_extra_info``
    columns, on every sample (None where a result lacks one); an undeclared key is left out, with a warning."""

    def __post_init__(self) -> None:
        check_ranges(self, {">= 0": ("coalesce_ms", "num_examine"), "in [0, 1]": ("alpha",)})
        validate_reference_source(self.reference_source)
        if self.rewards is not None and self.combine != "replace":
            raise ValueError(
                f"combine={self.combine!r} and rewards are exclusive: with a rewards composition, put "
                "'verifiable' in rewards.components and give it a weight (or in rewards.gate to multiply by it)"
            )
        by_name = {rm.name: rm for rm in self.rm_options}
        names = [rm.name for rm in self.rm_options]
        if len(set(names)) != len(names):
            raise ValueError(f"reward_models names must be unique, got {names}")
        for i, route in enumerate(self.route_options()):
            unknown = [n for n in route.reward_models or () if n not in names]
            if unknown:
                raise ValueError(f"routes[{i}].reward_models names {unknown}, which are not in reward_models "
                                 f"(names: {names})")
            token_level = [n for n in self.route_models(route) if by_name[n].step_reward == "token"]
            if token_level and len(self.route_models(route)) > 1:
                raise ValueError(f"routes[{i}] ensembles {list(self.route_models(route))}, and {token_level} gives "
                                 "token-level step rewards, which do not ensemble: give it a route of its own or a "
                                 f"scalar step_reward ({', '.join(SCALAR_STEP_REWARDS)})")
            composition = route.rewards or self.reward_config()
            if "judge" in composition.enabled and self.judge is None:
                raise ValueError(f"routes[{i}] (data_source {route.data_source}) composes 'judge' and reward_kwargs "
                                 "has no judge section: add judge: {server_url: [...], mode: ...} or drop 'judge'")
            if "rubric" in composition.enabled and not self.route_models(route):
                raise ValueError(f"routes[{i}] (data_source {route.data_source}) composes 'rubric' (the reward "
                                 "models' score) but scores with no reward model: list some in its reward_models "
                                 "or drop 'rubric' from its rewards")

        for i, watch in enumerate(self.attribute_alarms):
            rm = by_name.get(watch.reward_model)
            named = sorted(rm.attributes or ()) if rm is not None else []
            missing = [a for a in (watch.watch, watch.against) if a not in named]
            if rm is None or missing or watch.watch == watch.against:
                raise ValueError(f"attribute_alarms[{i}] watches {watch.watch!r} against {watch.against!r} of reward "
                                 f"model {watch.reward_model!r}, whose weighted attributes are {named}: name two "
                                 "different attributes of its attributes (weight 0 reports one without rewarding it)")
        if self.judge is not None and not any("judge" in (r.rewards or self.reward_config()).enabled
                                              for r in self.route_options()):
            raise ValueError("reward_kwargs.judge is set and no reward composition enables 'judge': add it to "
                             "rewards.components (with a weight) or drop the judge section")

    @cached_property
    def rm_options(self) -> tuple[RewardModelOptions, ...]:
        """The run's reward models: each ``reward_models`` entry over the top-level options, or the top-level
        options alone (one RM named ``rm``). Resolved and validated once, on first use (``__post_init__``)."""
        if not self.reward_models:
            return (self.rm,)
        inherited = flat_values(self.rm)
        out = []
        for i, entry in enumerate(self.reward_models):
            if "name" not in entry:
                raise ValueError(f"reward_models[{i}] needs a name (it names the RM in routes and metrics)")
            own = {**inherited, **entry}
            if "replicas" in entry and "server_url" not in entry:  # an entry's own servers replace the top level's
                own.pop("server_url")
            if "server_url" in entry and "replicas" not in entry:
                own.pop("replicas")
            out.append(build(RewardModelOptions, own, f"reward_models[{i}]"))
        return tuple(out)

    def route_options(self) -> tuple[RouteOptions, ...]:
        """The routes; without ``routes``, one route sending every data_source to every RM."""
        return self.routes or (RouteOptions(data_source=["*"]),)

    def route_models(self, route: RouteOptions) -> tuple[str, ...]:
        """The RM names a route scores with (``None`` in the route: all of them)."""
        if route.reward_models is not None:
            return tuple(route.reward_models)
        return tuple(rm.name for rm in self.rm_options)

    def reward_config(self) -> RewardConfig:
        """The reward composition: ``rewards`` when given, else the one ``combine``/``alpha`` stand for."""
        return self.rewards if self.rewards is not None else RewardConfig.from_combine(self.combine, self.alpha)


def per_member_columns(rm_options: Sequence[RewardModelOptions]) -> bool:
    """Whether ``reward_extra_info`` has columns per RM (``rm_score_<name>``, ...): with several RMs, or a whitened
    one."""
    return len(rm_options) > 1 or any(o.whiten != "none" for o in rm_options)


def reward_kwargs_of(config: Any) -> dict:
    """A composed verl config's ``reward.reward_kwargs`` as a plain dict (empty when it has none)."""
    from omegaconf import DictConfig, OmegaConf

    raw = config.get("reward", {}).get("reward_kwargs") if config is not None else None
    return OmegaConf.to_container(raw, resolve=True) if isinstance(raw, DictConfig) else dict(raw or {})


def run_options(config: Any) -> ManagerOptions | None:
    """The ``vllm_rm`` options of a composed verl config (None unless its reward manager is ``vllm_rm``)."""
    from omegaconf import OmegaConf

    if OmegaConf.select(config, "reward.reward_manager.name") != "vllm_rm":
        return None
    return parse_options(reward_kwargs_of(config))


def run_reward_models(config: Any) -> tuple[RewardModelOptions, ...]:
    """The reward models of a composed verl config (none unless its reward manager is ``vllm_rm``)."""
    options = run_options(config)
    return () if options is None else options.rm_options


def parse_options(raw: Mapping[str, Any] | None, cls: type = ManagerOptions) -> Any:
    """Validate ``reward.reward_kwargs`` (a mapping or DictConfig) into ``cls`` (ManagerOptions or ClientOptions)."""
    return build(cls, raw, "reward_kwargs")
