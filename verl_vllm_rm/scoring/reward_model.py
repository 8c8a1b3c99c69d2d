"""One named reward model as the manager uses it: input rendering, grouped requests, scale.

Each RM of a run (``reward_kwargs.reward_models``, or the one the top-level options
describe) gets its own client (its servers), its own group batcher (groups coalesce per
RM), its own input format and tokenizer, its ``max_model_len`` and its running
whitening. The manager submits a sample to every RM of its route at once, so the
requests to different RMs for one sample are concurrent.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from verl_vllm_rm.protocol.model_shape import STEP_KINDS, HeadKind, ModelShape
from verl_vllm_rm.protocol.score import longest_input
from verl_vllm_rm.rewards.ensemble import RunningWhitening
from verl_vllm_rm.rewards.steps import aggregate_steps, response_steps
from verl_vllm_rm.client.batching import GroupBatcher
from verl_vllm_rm.client.length import fit_to_length
from verl_vllm_rm.rows import Sample, prompt_text, question_text
from verl_vllm_rm.client.reward_client import VLLMRewardClient
from verl_vllm_rm.scoring.options import ConfigError, RewardModelOptions, attribute_whitening_key
from verl_vllm_rm.scoring.pairwise import ReferenceCache
from verl_vllm_rm.scoring.rm_inputs import RMInput, chat_template_ids, rubric_template_ids
from verl_vllm_rm.scoring.step_format import (CARD_STEP_FORMATS, DEFAULT_STEP_SPLIT, math_shepherd_ids, qwen_prm_ids,
                                              resolve_step_format, split_steps, step_end_tokens, step_spans,
                                              with_system_prompt)


@dataclass(frozen=True, slots=True)
class Scored:
    """One RM's answer for one input: the score (None from a process reward model: steps only), the weight
    version that computed it, when it came, the step scores (a server in step mode), and how often its request
    failed over to another server."""

    score: float | None
    version: int
    done: float
    steps: list[float] | None = None
    failovers: int = 0
    attributes: list[float] | None = None  # an attribute head's outputs, in its label order


class StepRewardError(ValueError):
    """A process reward that cannot be read: no step tag in the response, or a server not in step mode."""


class ServedHeadError(ValueError):
    """The served model's head (its ``/health`` shape) does not give what this RM's options read."""


class RewardModel:
    def __init__(self, options: RewardModelOptions, tokenizer: Any, *, coalesce_s: float):
        self.options = options
        self.name = options.name
        self.tokenizer = tokenizer  # the policy's
        self.client = VLLMRewardClient(options=options.client)
        if options.replicas is not None:  # the run's fleet of this RM, started by the first worker that asks
            from verl_vllm_rm.replicas.fleet import fleet_for

            fleet = fleet_for(options.name, options.replicas, options.client.api_key)

            async def replica_urls() -> list[str]:
                return await fleet.urls.remote()

            self.client.follow(replica_urls)
        self.batcher = GroupBatcher(self._score_chunk, coalesce_s=coalesce_s, max_seqs=options.client.max_batch_seqs,
                                    max_tokens=options.client.max_batch_tokens)
        self.rm_tokenizer = None
        if options.rm_tokenizer_path:
            from transformers import AutoTokenizer

            self.rm_tokenizer = AutoTokenizer.from_pretrained(options.rm_tokenizer_path)
        #: the running whitenings by key (:attr:`RewardModelOptions.whitening_keys`): the checkpoint's entries
        self.whitenings = {key: RunningWhitening() for key in options.whitening_keys}
        #: the weighted attributes by name: the order of their columns, weights, whitenings and values (the same
        #: in every RM, so an ensemble lines up its members' attributes)
        self.attribute_names = sorted(options.attributes or ())
        self.weights = [options.attributes[a] for a in self.attribute_names]
        self.attribute_whitenings = [self.whitenings[attribute_whitening_key(self.name, a)]
                                     for a in self.attribute_names if self.whitenings]
        self.references = ReferenceCache()
        self.failed = 0
        self._health: asyncio.Future | None = None  # of the server's /health (max_model_len, step_tag_id, shape)
        self._max_length: int | None = options.max_length
        self.step_tag_id: int | None = None  # known once the health probe ran (step_reward needs it)
        self.step_tag: str | None = None  # the tag's text, which the card formats insert after each step
        self.step_format: str = "tagged"  # step_format, resolved by the probe (auto: from the served head)
        self.normalize = bool(options.normalize)  # the probe sets it for a process RM when the option is unset
        self.attribute_columns: dict[str, int] | None = None  # each weighted attribute's column, from the probe

    @property
    def whitening(self) -> RunningWhitening | None:
        """A scalar RM's running whitening (``whiten=running``); an attribute RM whitens per attribute instead."""
        return self.whitenings.get(self.name)

    @property
    def ready(self) -> bool:
        """Whether :meth:`rm_input` can run: ``max_model_len`` (and with ``step_reward`` the step tag, with
        ``attributes`` their columns) known."""
        return self._max_length is not None and (self.options.step_reward == "none" or self.step_tag_id is not None
                                                 ) and (self.options.attributes is None or self.attribute_columns is not None)

    def rm_input(self, sample: Sample) -> RMInput:
        """The sample's input to this RM (:attr:`ready`: else await :meth:`max_len` first)."""
        prompt_ids, response_ids = self.render(sample, sample.response_ids, None)
        ids, dropped = fit_to_length(prompt_ids, response_ids, self._max_length, self.options.overlong_policy)
        return RMInput(ids, sample.group_key, dropped, len(prompt_ids) - dropped)

    def value(self, scored: Scored, rm_input: RMInput) -> float:
        """This RM's raw reward for the input: the score at the last token, or (``step_reward``) the response's
        step scores aggregated (``token``: their sum, what the token-level rewards add up to)."""
        method = self.options.step_reward
        if self.attribute_columns is not None:  # weighted attributes (the probe found each one's column)
            return self._weighted(self._attribute_values(scored))
        if method == "none":
            if scored.score is None:  # the probe refuses such a head first, unless max_length skipped it
                raise ServedHeadError(f"reward model {self.name!r}: its server gave no outcome score (its head gives "
                                      "step scores or attributes only: see the shape in its /health)")
            return scored.score
        steps = self.response_steps(scored, rm_input)
        if not steps:
            raise StepRewardError(
                f"reward model {self.name!r} (step_reward={method}): the response has no step tag "
                f"(token id {self.step_tag_id}), so it has no process reward; have the policy mark its steps (a "
                "format reward helps), or set failure_policy=mask to mask such samples")
        return float(sum(steps)) if method == "token" else aggregate_steps(steps, method, self.normalize)

    def response_steps(self, scored: Scored, rm_input: RMInput) -> list[float]:
        if scored.steps is None:
            raise StepRewardError(f"reward model {self.name!r} has step_reward={self.options.step_reward} but its "
                                  "server returns no step scores: start it with --step-tag-id")
        return response_steps(scored.steps, rm_input.token_ids, rm_input.prompt_len, self.step_tag_id)

    def submit(self, rm_input: RMInput) -> asyncio.Future:
        """The future of this input's :class:`Scored` (grouped with its prompt group's other members)."""
        return self.batcher.submit(rm_input.group_key, rm_input.token_ids)

    async def reference_score(self, sample: Sample, rm_input: RMInput, text: str,
                              version: int | None = None) -> tuple[Scored, float]:
        """The answer and raw reward (:meth:`value`) of the prompt's reference answer ``text``, scored once per
        prompt group and weight version: on ``version`` when kept, else on the one the server serves now (None:
        whichever)."""
        prompt_ids, ref_ids = self.render(sample, None, text)
        ids, dropped = fit_to_length(prompt_ids, ref_ids, await self.max_len(), self.options.overlong_policy)
        scored = await self.references.score((rm_input.group_key, text),
                                             lambda: self.batcher.submit(rm_input.group_key, ids), version)
        return scored, self.value(scored, RMInput(ids, rm_input.group_key, dropped, len(prompt_ids) - dropped))

    def scale(self, scored: Scored, raw: float, *, update: bool) -> tuple[float, list[float] | None]:
        """The score the ensemble uses and, for an attribute RM, the attribute values it weighs (else None).

        ``whiten=running`` whitens the raw score, or each attribute with its own statistics before the weights
        apply (attributes have scales of their own); with ``update``, a training sample's value first joins the
        statistics. Without whitening the score is the raw one."""
        if self.attribute_columns is None:
            whitening = self.whitening
            if whitening is None:
                return raw, None
            return (whitening.update_and_whiten(raw) if update else whitening.whiten(raw)), None
        values = self._attribute_values(scored)
        if not self.attribute_whitenings:
            return raw, values  # raw is already their weighted sum (:meth:`value`)
        values = [w.update_and_whiten(x) if update else w.whiten(x) for w, x in zip(self.attribute_whitenings, values)]
        return self._weighted(values), values

    def _attribute_values(self, scored: Scored) -> list[float]:
        """The weighted attributes' values in an answer, in :attr:`attribute_names` order."""
        return [scored.attributes[column] for column in self.attribute_columns.values()]

    def _weighted(self, values: list[float]) -> float:
        return sum(w * x for w, x in zip(self.weights, values))

    async def max_len(self) -> int:
        """The option, else the server's ``max_model_len`` (with ``step_reward``, the health probe runs either
        way: it also gives the step tag). The probe checks the served head too (:meth:`check_head`)."""
        if not self.ready:
            await self.probe()
        return self._max_length

    async def probe(self) -> None:
        """Read the server's ``/health`` once, shared by all concurrent callers; a failed probe is asked again by
        the next caller, not kept for the whole run."""
        probe = self._health
        if probe is None:
            probe = self._health = asyncio.ensure_future(self.client.health())
        try:
            health = await asyncio.shield(probe)
        except Exception:
            if self._health is probe:
                self._health = None
            raise
        if self.options.step_reward != "none" and health.get("step_tag_id") is None:
            raise StepRewardError(f"reward model {self.name!r} has step_reward={self.options.step_reward}, and its "
                                  f"server {self.client.urls} is not in step mode: start it with --step-tag-id "
                                  "<the step token's id>, or set step_reward=none")
        self.step_tag_id = health.get("step_tag_id")
        shape = None if health.get("shape") is None else ModelShape.from_json(health["shape"])
        if self.options.step_reward != "none":
            self.read_steps_as(shape, health.get("step_tag"))
        if shape is not None:
            self.check_head(shape)
        elif self.options.attributes is not None:
            raise ServedHeadError(f"reward model {self.name!r} weights attributes {sorted(self.options.attributes)}, "
                                  f"and its server {self.client.urls} does not describe its head (its /health has no "
                                  "shape), so their outputs are unknown: serve the model with verl-vllm-rm's server "
                                  "(python -m verl_vllm_rm.server), whose /health names them")
        if self._max_length is None:
            self._max_length = longest_input(health)

    def check_head(self, shape: ModelShape) -> None:
        """Refuse a served head these options cannot read, before any of its answers counts."""
        where = f"reward model {self.name!r}: its server {self.client.urls} serves {shape.architecture}"
        if shape.kind in STEP_KINDS and self.options.step_reward == "none":
            raise StepRewardError(f"{where}, a process reward model ({shape.kind.value}): it scores steps only, "
                                  "with no outcome score; set step_reward to min, last, mean, prod or token")
        weights = self.options.attributes
        if shape.kind is HeadKind.ATTRIBUTES and weights is None:
            raise ServedHeadError(f"{where} with {len(shape.labels)} attributes ({', '.join(shape.labels)}) and no "
                                  "single reward: name the ones to use, each with its weight, in attributes (e.g. "
                                  f"{{{shape.labels[0]}: 1.0}})")
        if weights is not None and shape.kind is not HeadKind.ATTRIBUTES:
            raise ServedHeadError(f"{where}, a {shape.kind.value} head without attributes, and reward model "
                                  f"{self.name!r} weights attributes {sorted(weights)}: drop attributes, or serve the "
                                  "attribute head they name")
        if weights is not None:
            unknown = sorted(set(weights) - set(shape.labels))
            if unknown:
                raise ServedHeadError(f"{where}, whose attributes are {list(shape.labels)}; attributes names {unknown}, "
                                      "which it does not have")
            self.attribute_columns = {name: shape.labels.index(name) for name in self.attribute_names}

    async def _score_chunk(self, ids: list) -> list[Scored]:
        """One /score request."""
        scores = await self.client.score_request(ids, normalize=self.normalize)
        version, done = -1 if scores.version is None else scores.version, time.perf_counter()
        steps = scores.steps or [None] * len(scores)
        attributes = scores.attributes or [None] * len(scores)
        return [Scored(score, version, done, step, scores.failovers, values)
                for score, step, values in zip(scores, steps, attributes)]

    def read_steps_as(self, shape: ModelShape | None, step_tag: dict | None) -> None:
        """The step format (``auto``: the served head's), the tag's text a card format inserts (``/health``'s
        ``step_tag``) and, unless the option says, P(positive) for a process RM's steps (its card's number)."""
        opts = self.options
        self.step_format = resolve_step_format(opts.step_format, shape)
        if opts.normalize is None:
            self.normalize = shape is not None and shape.kind in STEP_KINDS
        where = f"reward model {self.name!r} (step_format={self.step_format})"
        if self.step_format not in CARD_STEP_FORMATS:
            if opts.system_prompt is not None and opts.input_format != "chat_template":
                raise ConfigError(f"{where}: system_prompt goes into a conversation rendered with the RM's chat "
                                  "template, and this RM reads the response as it is: drop system_prompt, or set "
                                  "step_format=qwen_prm or input_format=chat_template")
            return
        if self.step_format == "math_shepherd" and opts.system_prompt is not None:
            raise ConfigError(f"{where}: Math-Shepherd's input is the question and the steps, with no chat template "
                              "to hold a system_prompt: drop system_prompt, or use step_format=qwen_prm")
        if opts.input_format != "token_ids" or opts.rubric_template is not None:
            raise ConfigError(f"{where} builds the RM's input from the question and the steps as the model's card "
                              "does, which replaces input_format=chat_template and rubric_template: drop them, or "
                              "set step_format=tagged")
        if step_tag is None or not step_tag.get("token"):
            raise StepRewardError(f"{where} inserts the server's step tag after each step, and its server "
                                  f"{self.client.urls} does not name the tag's text in /health: serve the model with "
                                  "this version's server (python -m verl_vllm_rm.server), or set step_format=tagged")
        self.step_tag = step_tag["token"]

    @property
    def step_split(self) -> str:
        """Where a card format's steps end in the response text (the option, else the card's)."""
        return self.options.step_split or DEFAULT_STEP_SPLIT[self.step_format]

    def step_token_positions(self, response_ids: Sequence[int]) -> list[int]:
        """The index of the policy token that ends each of the response's steps (``step_reward=token``): its step
        tags as they are (``tagged``), else the token whose text reaches the end of each step of the decoded
        response (a card format: the steps travel as text, so the RM's tokenizer need not be the policy's)."""
        if self.step_format not in CARD_STEP_FORMATS:
            return np.flatnonzero(np.asarray(response_ids) == self.step_tag_id).tolist()
        text = self.tokenizer.decode(response_ids, skip_special_tokens=True)
        return step_end_tokens(self.tokenizer, response_ids, [end for _, end in step_spans(text, self.step_split)])

    def card_step_ids(self, sample: Sample, response_text: str) -> tuple[list[int], list[int]]:
        """(prompt part, response part) ids of the question and the response's steps in the card's format."""
        split = self.step_split
        steps = split_steps(response_text, split)
        where = f"reward model {self.name!r} (step_format={self.step_format})"
        if not steps:
            raise StepRewardError(f"{where}: the response has no step text (it is empty or only {split!r}), so it "
                                  "has no process reward; failure_policy=mask masks such samples")
        tokenizer = self.rm_tokenizer or self.tokenizer
        question = question_text(self.tokenizer, sample)
        if self.step_format == "qwen_prm":
            ids = qwen_prm_ids(tokenizer, question, steps, self.step_tag, self.options.system_prompt)
        else:
            ids = math_shepherd_ids(tokenizer, question, steps, self.step_tag)
        tags = ids[1].count(self.step_tag_id)
        if tags != len(steps):
            raise StepRewardError(f"{where}: the response's {len(steps)} steps hold {tags} step tags "
                                  f"({self.step_tag!r}, id {self.step_tag_id}) once rendered: a step's own text "
                                  "holds the tag, or the RM's tokenizer joins it with a neighbour; set step_split "
                                  "to where the policy's steps end, or step_format=tagged")
        return ids

    def render(self, sample: Sample, response_ids: list[int] | None, response_text: str | None):
        """(prompt part, response part) ids of the RM input for a response given as ids or text."""
        opts = self.options
        card = self.step_format in CARD_STEP_FORMATS
        if card or opts.rubric_template is not None or opts.input_format == "chat_template":  # the RM reads text
            if response_text is None:
                response_text = self.tokenizer.decode(response_ids, skip_special_tokens=True)
            if card:
                return self.card_step_ids(sample, response_text)
            if opts.rubric_template is not None:
                return rubric_template_ids(self.rm_tokenizer or self.tokenizer, opts.rubric_template,
                                           opts.rubric_principles, prompt_text(self.tokenizer, sample), response_text)
            messages = sample.fields.get("raw_prompt")
            if messages is None:
                raise ValueError("input_format=chat_template needs the raw chat: set data.return_raw_chat=True")
            return chat_template_ids(self.rm_tokenizer, with_system_prompt(messages, opts.system_prompt),
                                     response_text)
        if response_ids is None:
            response_ids = self.tokenizer(response_text, add_special_tokens=False).input_ids
        return sample.prompt_ids, response_ids

    async def close(self) -> None:
        await self.client.close()


#: the class attribute by which a verl trainer says it places ``step_reward=token``'s per-token rewards (the
#: package's trainer modes, :class:`~verl_vllm_rm.plugin.trainer_modes.RewardMetrics`)
PLACES_TOKEN_REWARDS = "places_token_rewards"


def refuse_token_level_when_streaming(config: Any, rm_options: Sequence[RewardModelOptions]) -> None:
    """verl's agent loop scores each trajectory as it finishes and keeps one scalar at its last token: token-level
    step rewards reach the reward tensor through this package's trainer modes (which place each response's
    ``token_rewards`` before the advantage), or through verl's batch path, which verl 0.9.1 takes only when its
    own reward model is enabled on the training resources. A trainer that cannot place them is refused here,
    before any step: it would train on the scalar alone."""
    token_level = [o.name for o in rm_options if o.step_reward == "token"]
    reward = config.get("reward", {}) if config is not None else {}
    rm_cfg = reward.get("reward_model", {}) or {}
    streaming = not rm_cfg.get("enable", False) or rm_cfg.get("enable_resource_pool", False)
    if not token_level or not streaming:
        return
    trainer = config.get("trainer", {}) or {}
    mode = (trainer.get("v1", {}) or {}).get("trainer_mode", "sync") if trainer.get("use_v1", True) else None
    if mode is not None and getattr(trainer_class(mode), PLACES_TOKEN_REWARDS, False):
        return
    raise ConfigError(
        f"reward model(s) {token_level} have step_reward=token, and this run's trainer "
        f"({'the legacy trainer' if mode is None else f'trainer.v1.trainer_mode={mode}'}) keeps only the scalar "
        "verl's agent loop places at the last token, so the step rewards would be dropped: select this package's "
        "trainer mode, trainer.v1.trainer_mode=vllm_rm (or vllm_rm_colocate_async, vllm_rm_separate_async; "
        "trainer.use_v1=True), which places them, or use a scalar step_reward (min, last, mean, prod)")


def trainer_class(mode: str) -> type | None:
    """The trainer class verl's registry holds for ``trainer.v1.trainer_mode`` (None: none; verl refuses the
    name itself)."""
    from verl.trainer.ppo.v1 import get_trainer_cls

    try:
        return get_trainer_cls(mode)
    except ValueError:
        return None
