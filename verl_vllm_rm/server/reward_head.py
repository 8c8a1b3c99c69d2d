"""The served reward head: vLLM set up for it before the engine starts, and its shape read once it has.

Before the engine (:func:`configure_reward_head`): ``--step-tag-id`` (or ``--step-tag TEXT``) makes vLLM pool at
that token (``tok_pooling_type=STEP``); ``--step-tokens GOOD,BAD`` serves a causal LM the Math-Shepherd way, as a
two-label classifier whose labels are the logits of those two tokens (vLLM's ``--convert classify`` with
``hf_overrides`` ``method=no_post_processing`` and ``classifier_from_token``), read at the step tags. Strings are
resolved as the model's card resolves them (its tokenizer's encoding), never by a bare vocabulary lookup, which
can pick another token silently. Once the engine runs (:func:`served_shape`), the head's family comes from vLLM's supported tasks and
the model's config (:func:`~verl_vllm_rm.protocol.model_shape.model_shape`), or the start-up is refused; a reward
token the config declares (:func:`reward_token`) is appended to every input, as the model's card does.
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
        "--step-tag", default=None, metavar="TEXT",
        help="The step tag as text (Math-Shepherd: ки), resolved as the model's card does: the last token of "
        "tokenizer.encode(TEXT). Sets --step-tag-id, or is checked against it.",
    )
    group.add_argument(
        "--reward-head", choices=HEAD_CHOICES, default="auto",
        help="How to read a head of several outputs: attributes (one reward per named output, weighted by the run) "
        "or two_class ([bad, good]); auto: attributes for problem_type regression or more than 2 outputs.",
    )
    group.add_argument(
        "--step-tokens", default=None, metavar="GOOD,BAD",
        help="Serve a causal LM as a process reward model (Math-Shepherd): the step score is P(GOOD) over the two "
        "tokens at each step tag. Two token ids, or two strings resolved as the card does (tokenizer.encode('GOOD "
        "BAD') without special tokens: one token each, refused where the vocabulary also spells one differently).",
    )


def _pieces(tokenizer, ids: list[int]) -> str:
    return ", ".join(f"{piece!r} ({i})" for piece, i in zip(tokenizer.convert_ids_to_tokens(ids), ids))


def step_token_ids(spec: str, tokenizer, model: str) -> tuple[int, int]:
    """``--step-tokens``: two token ids as given, or two strings encoded together as Math-Shepherd's card does
    (``tokenizer.encode("+ -")[1:]``: the pieces ``▁+`` and ``▁-``). A bare vocabulary lookup of the strings could
    pick other tokens (a bare ``+`` beside ``▁+``), so strings the vocabulary spells as another token are refused."""
    parts = spec.split(",")
    if len(parts) != 2 or not all(p.strip() for p in parts):
        raise SystemExit(f"verl-vllm-rm: --step-tokens takes two token ids or strings GOOD,BAD, got {spec!r}")
    if all(p.strip().isdigit() for p in parts):
        ids = [int(p) for p in parts]
        outside = [i for i in ids if i >= len(tokenizer)]
        if outside:
            raise SystemExit(f"verl-vllm-rm: --step-tokens ids {outside} are outside {model}'s tokenizer of "
                             f"{len(tokenizer)} tokens")
        return ids[0], ids[1]
    text = " ".join(parts)
    encoded = tokenizer.encode(text, add_special_tokens=False)
    if len(encoded) != 2:
        raise SystemExit(f"verl-vllm-rm: --step-tokens {spec!r}: the card's encoding of {text!r} gives "
                         f"{len(encoded)} tokens ({_pieces(tokenizer, encoded)}), not one per string: give the two "
                         "token ids (--step-tokens GOOD_ID,BAD_ID)")
    vocab = tokenizer.get_vocab()
    elsewhere = [vocab[p] for p, i in zip(parts, encoded) if p in vocab and vocab[p] != i]
    if elsewhere:
        raise SystemExit(f"verl-vllm-rm: --step-tokens {spec!r} is ambiguous in {model}'s vocabulary: the card's "
                         f"encoding of {text!r} reads {_pieces(tokenizer, encoded)}, and the vocabulary also holds "
                         f"{_pieces(tokenizer, elsewhere)}: give the ids the model's card reads "
                         f"(--step-tokens {encoded[0]},{encoded[1]})")
    return encoded[0], encoded[1]


def step_tag_id(text: str, given: int | None, tokenizer, model: str) -> int:
    """``--step-tag``: the last token of the card's ``tokenizer.encode(TEXT)``, refused when the text is several
    tokens (no single token marks a step) or disagrees with ``--step-tag-id``."""
    encoded = tokenizer.encode(text, add_special_tokens=False)
    if len(encoded) != 1:
        raise SystemExit(f"verl-vllm-rm: --step-tag {text!r} is {len(encoded)} tokens of {model}'s tokenizer "
                         f"({_pieces(tokenizer, encoded)}), not one: give the tag as one token's text, or its id "
                         "with --step-tag-id")
    if given is not None and given != encoded[0]:
        raise SystemExit(f"verl-vllm-rm: --step-tag {text!r} is token {_pieces(tokenizer, encoded)}, and "
                         f"--step-tag-id is {given} ({_pieces(tokenizer, [given])}): drop one of them")
    return encoded[0]


def local_architectures(model: str) -> list[str]:
    """The ``architectures`` of a local checkpoint's ``config.json`` (empty for a hub id or a config without)."""
    config = os.path.join(os.path.expanduser(model), "config.json")
    if not os.path.isfile(config):
        return []
    with open(config) as f:
        return json.load(f).get("architectures") or []


def _refuse_a_bare_causal_lm(args: argparse.Namespace) -> None:
    """A local causal LM without ``--step-tokens`` or ``--convert``: vLLM's pooling runner would only embed it. Said
    before the engine loads (the check after it, :func:`served_shape`, says the same ~40 s later)."""
    if args.step_tokens is not None or args.convert not in (None, "auto"):
        return
    architectures = local_architectures(args.model)
    if architectures and all(a.endswith("ForCausalLM") for a in architectures):
        raise SystemExit(f"verl-vllm-rm: {args.model}: {architectures[0]} is a causal LM, without a reward head "
                         f"(vLLM's pooling runner would only embed it): {SERVABLE}")


def _tokenizer(args: argparse.Namespace):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(args.tokenizer or args.model, trust_remote_code=args.trust_remote_code)


def configure_reward_head(args: argparse.Namespace) -> None:
    """Set vLLM's pooler (and, for ``--step-tokens``, its convert and head) before the engine starts."""
    _refuse_a_bare_causal_lm(args)
    tokenizer = _tokenizer(args) if args.step_tokens is not None or args.step_tag is not None else None
    if args.step_tag is not None:
        args.step_tag_id = step_tag_id(args.step_tag, args.step_tag_id, tokenizer, args.tokenizer or args.model)
    args.step_token_ids = None
    if args.step_tokens is not None:
        if args.step_tag_id is None:
            raise SystemExit(f"verl-vllm-rm: {STEP_TOKENS_NEED_A_TAG}")
        if args.convert not in (None, "auto", "classify"):
            raise SystemExit(f"verl-vllm-rm: --step-tokens serves the model with --convert classify; drop "
                             f"--convert {args.convert}")
        args.step_token_ids = step_token_ids(args.step_tokens, tokenizer, args.tokenizer or args.model)
        args.convert = "classify"
        # vLLM looks the head's rows up by token string (convert_tokens_to_ids): the resolved pieces
        args.hf_overrides = {**dict(args.hf_overrides or {}), "method": "no_post_processing",
                             "classifier_from_token": tokenizer.convert_ids_to_tokens(list(args.step_token_ids))}
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


def step_tag(args: argparse.Namespace) -> tuple[int, str] | None:
    """The step tag's id and its text, which a client inserts after each step of a plain-text response
    (``step_format``): ``--step-tag`` as given, else the tokenizer's decoding of ``--step-tag-id``
    (``<extra_0>`` for Qwen2.5-Math-PRM, ``ки`` for Math-Shepherd, whose card writes it after a space)."""
    if args.step_tag_id is None:
        return None
    if args.step_tag is not None:
        return args.step_tag_id, args.step_tag
    return args.step_tag_id, _tokenizer(args).decode([args.step_tag_id]).strip()


def reward_token(args: argparse.Namespace, model_config) -> tuple[int, str] | None:
    """The token the model is read at, when its config declares one (``reward_token_id``: InternLM2-Reward's card
    appends it to the rendered conversation and reads ``v_head`` there), as its id and the tokenizer's spelling."""
    token_id = getattr(model_config.hf_config, "reward_token_id", None)
    if token_id is None:
        return None
    tokenizer = _tokenizer(args)
    if not 0 <= int(token_id) < len(tokenizer):
        raise SystemExit(f"verl-vllm-rm: {args.model}: the config's reward_token_id {token_id} is outside its "
                         f"tokenizer's {len(tokenizer)} tokens: serve the tokenizer the model was published with "
                         "(--tokenizer)")
    return int(token_id), tokenizer.convert_ids_to_tokens(int(token_id))
