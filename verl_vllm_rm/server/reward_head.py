"""The served reward head: vLLM set up for it before the engine starts, and its shape read once it has.

Before the engine (:func:`configure_reward_head`): ``--step-tag-id`` makes vLLM pool at that token
(``tok_pooling_type=STEP``); ``--step-tokens GOOD,BAD`` serves a causal LM the Math-Shepherd way, as a
two-label classifier whose labels are the logits of those two tokens (vLLM's ``--convert classify`` with
``hf_overrides`` ``method=no_post_processing`` and ``classifier_from_token``), read at the step tags. Token
strings are checked against the model's own vocabulary first: vLLM maps an unknown one to the unknown token,
silently. Once the engine runs (:func:`served_shape`), the head's family comes from vLLM's supported tasks and
the model's config (:func:`~verl_vllm_rm.protocol.model_shape.model_shape`), or the start-up is refused.
"""

from __future__ import annotations

import argparse
import json
import os

from verl_vllm_rm.protocol.model_shape import HEAD_CHOICES, SERVABLE, STEP_TOKENS_NEED_A_TAG, ModelShape, UnsupportedModel, model_shape


def add_reward_head_args(group) -> None:
    group.add_argument(
        "--step-tag-id", type=int, default=None,
        help="Process-reward mode: /score also returns one score per occurrence of this token id.",
    )
    group.add_argument(
        "--reward-head", choices=HEAD_CHOICES, default="auto",
        help="How to read a head of several outputs: attributes (one reward per named output, weighted by the run) "
        "or two_class ([bad, good]); auto: attributes for problem_type regression or more than 2 outputs.",
    )
    group.add_argument(
        "--step-tokens", default=None, metavar="GOOD,BAD",
        help="Serve a causal LM as a process reward model (Math-Shepherd): the step score is P(GOOD) over the two "
        "tokens at each --step-tag-id. Token strings of the model's vocabulary.",
    )


def step_token_ids(args: argparse.Namespace) -> tuple[int, int] | None:
    """``--step-tokens`` as token ids of the served tokenizer; an unknown or malformed token is refused."""
    if args.step_tokens is None:
        return None
    tokens = [t for t in args.step_tokens.split(",")]
    if len(tokens) != 2 or not all(tokens):
        raise SystemExit(f"verl-vllm-rm: --step-tokens takes two token strings GOOD,BAD, got {args.step_tokens!r}")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model, trust_remote_code=args.trust_remote_code)
    vocab = tokenizer.get_vocab()
    missing = [t for t in tokens if t not in vocab]
    if missing:
        raise SystemExit(f"verl-vllm-rm: --step-tokens {missing} not in {args.tokenizer or args.model}'s vocabulary "
                         "(vLLM would read the unknown token instead): give tokens as the tokenizer spells them "
                         "(tokenizer.convert_ids_to_tokens)")
    return vocab[tokens[0]], vocab[tokens[1]]


def _refuse_a_bare_causal_lm(args: argparse.Namespace) -> None:
    """A local causal LM without ``--step-tokens`` or ``--convert``: vLLM's pooling runner would only embed it. Said
    before the engine loads (the check after it, :func:`served_shape`, says the same ~40 s later)."""
    config = os.path.join(os.path.expanduser(args.model), "config.json")
    if args.step_tokens is not None or args.convert not in (None, "auto") or not os.path.isfile(config):
        return
    with open(config) as f:
        architectures = json.load(f).get("architectures") or []
    if architectures and all(a.endswith("ForCausalLM") for a in architectures):
        raise SystemExit(f"verl-vllm-rm: {args.model}: {architectures[0]} is a causal LM, without a reward head "
                         f"(vLLM's pooling runner would only embed it): {SERVABLE}")


def configure_reward_head(args: argparse.Namespace) -> None:
    """Set vLLM's pooler (and, for ``--step-tokens``, its convert and head) before the engine starts."""
    _refuse_a_bare_causal_lm(args)
    if args.step_tokens is not None:
        if args.step_tag_id is None:
            raise SystemExit(f"verl-vllm-rm: {STEP_TOKENS_NEED_A_TAG}")
        if args.convert not in (None, "auto", "classify"):
            raise SystemExit(f"verl-vllm-rm: --step-tokens serves the model with --convert classify; drop "
                             f"--convert {args.convert}")
        args.step_token_ids = step_token_ids(args)
        args.convert = "classify"
        args.hf_overrides = {**dict(args.hf_overrides or {}), "method": "no_post_processing",
                             "classifier_from_token": args.step_tokens.split(",")}
    else:
        args.step_token_ids = None
    if args.step_tag_id is not None:
        pooler = dict(args.pooler_config or {}) if not hasattr(args.pooler_config, "__dataclass_fields__") else {}
        pooler.update(tok_pooling_type="STEP", step_tag_id=args.step_tag_id)
        args.pooler_config = pooler


def served_shape(args: argparse.Namespace, supported_tasks, model_config) -> ModelShape:
    """The head the engine serves, or a refusal naming the fix (the server does not start)."""
    hf = model_config.hf_config
    try:
        return model_shape(
            model_config.architecture, set(supported_tasks or ()),
            num_labels=int(getattr(hf, "num_labels", 1) or 1), id2label=getattr(hf, "id2label", None),
            problem_type=getattr(hf, "problem_type", None), head=args.reward_head, step_tag_id=args.step_tag_id,
            step_tokens=args.step_token_ids, backbone_dtype=str(model_config.dtype).removeprefix("torch."),
            head_dtype=str(model_config.head_dtype).removeprefix("torch."))
    except UnsupportedModel as e:
        raise SystemExit(f"verl-vllm-rm: {model_config.model}: {e}") from None
