"""What a reward server serves: the family of its model's head, told from its config and vLLM's tasks.

Published reward models come in shapes vLLM serves through different poolers:

==================  ==========================================================  ==============================
kind                published examples (architecture, config)                   the reward
==================  ==========================================================  ==============================
``scalar``          ``*ForSequenceClassification`` with ``num_labels=1``;       the head's value at the last
                    ``Qwen2ForRewardModel``, ``InternLM2ForRewardModel``         token
``attributes``      ``*ForSequenceClassification``, ``num_labels=N`` named in   N values, weighted by the run
                    ``id2label`` (``problem_type: regression``)                 (HelpSteer-style attributes)
``two_class``       ``*ForSequenceClassification``, ``num_labels=2``            P(good) or the logit margin
                    ([bad, good])
``step_classifier`` ``Qwen2ForProcessRewardModel`` (two labels per token)       P(positive) at each step tag
``step_tokens``     a ``*ForCausalLM`` (Math-Shepherd)                          P(good) over {good, bad} tokens
                                                                                at each step tag
==================  ==========================================================  ==============================

A ``scalar`` sequence classifier may also be read at step tags (``--step-tag-id``): its value there is the step's
score. Pure Python: the server builds a :class:`ModelShape` at start-up (refusing what it cannot serve, with the
fix), reports it in ``/health``, and the client checks a run's configuration against it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Collection, Mapping


class HeadKind(str, Enum):
    SCALAR = "scalar"
    ATTRIBUTES = "attributes"
    TWO_CLASS = "two_class"
    STEP_CLASSIFIER = "step_classifier"
    STEP_TOKENS = "step_tokens"


#: Reward models vLLM serves natively through a per-token pooler (``token_classify`` only, no ``classify``).
NATIVE_TOKEN_HEADS = {
    "Qwen2ForRewardModel": HeadKind.SCALAR,
    "InternLM2ForRewardModel": HeadKind.SCALAR,
    "Qwen2ForProcessRewardModel": HeadKind.STEP_CLASSIFIER,
}
HEAD_CHOICES = ("auto", HeadKind.SCALAR.value, HeadKind.ATTRIBUTES.value, HeadKind.TWO_CLASS.value)
STEP_KINDS = (HeadKind.STEP_CLASSIFIER, HeadKind.STEP_TOKENS)


SERVABLE = ("serve a *ForSequenceClassification reward model, Qwen2ForRewardModel, InternLM2ForRewardModel or "
            "Qwen2ForProcessRewardModel with --runner pooling; a causal LM read at step tags with --step-tokens "
            "GOOD,BAD and --step-tag-id; or a generative judge with --runner generate")


STEP_TOKENS_NEED_A_TAG = ("--step-tokens reads P(good) over the two tokens at each step tag: give --step-tag-id (or "
                          "--step-tag) too (the tokenizer's id of the step separator)")


class UnsupportedModel(ValueError):
    """The server cannot serve this model as a reward model; the message names what to change."""


@dataclass(frozen=True)
class ModelShape:
    """The served head: its kind, the name of each output column, where steps are read, and the dtypes."""

    kind: HeadKind
    architecture: str
    labels: tuple[str, ...]
    backbone_dtype: str
    head_dtype: str
    step_tag_id: int | None = None
    step_tokens: tuple[int, int] | None = None  # (good, bad) token ids of a step_tokens model

    @property
    def per_token(self) -> bool:
        """Whether the engine answers it with ``token_classify`` (native per-token heads and step readers)."""
        return self.architecture in NATIVE_TOKEN_HEADS or self.kind is HeadKind.STEP_TOKENS

    @property
    def reads_steps(self) -> bool:
        return self.step_tag_id is not None

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["kind"] = self.kind.value
        body["labels"] = list(self.labels)
        body["step_tokens"] = None if self.step_tokens is None else list(self.step_tokens)
        return body

    @classmethod
    def from_json(cls, body: Any) -> ModelShape:
        """A shape from a server's ``/health``; a malformed one is a ``ValueError`` naming the field."""
        if not isinstance(body, dict):
            raise ValueError(f"the server's model shape must be a JSON object, got {type(body).__name__}")
        try:
            kind = HeadKind(body["kind"])
            labels = tuple(str(label) for label in body["labels"])
            tokens = body.get("step_tokens")
            return cls(kind=kind, architecture=str(body["architecture"]), labels=labels,
                       backbone_dtype=str(body["backbone_dtype"]), head_dtype=str(body["head_dtype"]),
                       step_tag_id=body.get("step_tag_id"),
                       step_tokens=None if tokens is None else (int(tokens[0]), int(tokens[1])))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise ValueError(f"the server's model shape is malformed ({type(e).__name__}: {e}): {body!r}") from None


def _labels(num_labels: int, id2label: Mapping[Any, str] | None) -> tuple[str, ...]:
    """Output names in column order: ``id2label``'s, or ``label_<i>``."""
    names = {int(k): str(v) for k, v in (id2label or {}).items()}
    return tuple(names.get(i, f"label_{i}") for i in range(num_labels))


def auto_head_kind(num_labels: int, problem_type: str | None) -> HeadKind:
    """How a classifier's outputs read without ``--reward-head``: one output is a scalar; regression outputs, or
    more than two, are attributes; two others are a two-class head ([bad, good])."""
    if num_labels == 1:
        return HeadKind.SCALAR
    return HeadKind.ATTRIBUTES if problem_type == "regression" or num_labels > 2 else HeadKind.TWO_CLASS


def model_shape(
    architecture: str,
    tasks: Collection[str],
    *,
    num_labels: int,
    id2label: Mapping[Any, str] | None = None,
    problem_type: str | None = None,
    head: str = "auto",
    step_tag_id: int | None = None,
    step_tokens: tuple[int, int] | None = None,
    backbone_dtype: str,
    head_dtype: str,
) -> ModelShape:
    """The head the server serves, or :class:`UnsupportedModel` with the fix.

    ``tasks`` are vLLM's supported pooling tasks for the model; ``head`` is ``--reward-head`` (``auto`` tells
    ``two_class`` from ``attributes`` by ``problem_type``: ``regression`` outputs are attributes).
    """
    if head not in HEAD_CHOICES:
        raise UnsupportedModel(f"--reward-head must be one of {list(HEAD_CHOICES)}, got {head!r}")
    common = dict(architecture=architecture, backbone_dtype=backbone_dtype, head_dtype=head_dtype)
    if step_tokens is not None:
        if step_tag_id is None:
            raise UnsupportedModel(STEP_TOKENS_NEED_A_TAG)
        return ModelShape(HeadKind.STEP_TOKENS, labels=("good", "bad"), step_tag_id=step_tag_id,
                          step_tokens=step_tokens, **common)
    if architecture in NATIVE_TOKEN_HEADS:
        if "token_classify" not in tasks:  # internal: vLLM's own class for this architecture pools per token
            raise UnsupportedModel(f"vLLM serves {architecture} without token_classify (tasks: {sorted(tasks)})")
        kind = NATIVE_TOKEN_HEADS[architecture]
        if head not in ("auto", kind.value):
            raise UnsupportedModel(f"{architecture} has a {kind.value} head; --reward-head {head} does not fit it: "
                                   "leave --reward-head auto")
        if kind is HeadKind.STEP_CLASSIFIER and step_tag_id is None:
            raise UnsupportedModel(f"{architecture} scores steps at a step tag: start the server with --step-tag-id "
                                   "ID (the tokenizer's id of the step separator, <extra_0> in Qwen2.5-Math-PRM)")
        if kind is HeadKind.SCALAR and step_tag_id is not None:
            raise UnsupportedModel(f"{architecture} gives one reward at the last token; --step-tag-id would make "
                                   "vLLM pool it at step tags and lose that reward: drop --step-tag-id")
        labels = ("negative", "positive") if kind is HeadKind.STEP_CLASSIFIER else ("score",)
        return ModelShape(kind, labels=labels, step_tag_id=step_tag_id, **common)
    if "classify" not in tasks:
        raise UnsupportedModel(f"{architecture} has no classification head vLLM serves (tasks: {sorted(tasks)}): "
                               + SERVABLE)
    if num_labels < 1:  # internal: transformers refuses a config without outputs before vLLM sees it
        raise UnsupportedModel(f"{architecture} has num_labels={num_labels}")
    kind = HeadKind(head) if head != "auto" and num_labels != 1 else auto_head_kind(num_labels, problem_type)
    if kind is HeadKind.SCALAR and num_labels != 1:
        raise UnsupportedModel(f"--reward-head scalar needs num_labels=1, and {architecture} has {num_labels} "
                               "outputs: use --reward-head attributes (or two_class for [bad, good])")
    if kind is HeadKind.TWO_CLASS and num_labels != 2:
        raise UnsupportedModel(f"--reward-head two_class needs num_labels=2 ([bad, good]), and {architecture} has "
                               f"{num_labels}: use --reward-head attributes")
    if kind is not HeadKind.SCALAR and step_tag_id is not None:
        raise UnsupportedModel(f"--step-tag-id reads one score per step from a scalar head; this {kind.value} head "
                               f"has {num_labels} outputs: drop --step-tag-id, or serve a process reward model")
    return ModelShape(kind, labels=_labels(num_labels, id2label) if num_labels > 1 else ("score",),
                      step_tag_id=step_tag_id, **common)
