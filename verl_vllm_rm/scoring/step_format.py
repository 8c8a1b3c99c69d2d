"""A process reward model's input as its model card writes it, from a policy's plain-text steps (pure functions).

A policy writes "step one\\n\\nstep two\\n\\nanswer", with no step separator; a process RM reads a score at each of its
step tags. The formats (``step_format``):

- ``qwen_prm`` (Qwen2.5-Math-PRM's card): the steps joined by the tag, with one more after the last, as the
  assistant turn of the RM's chat template after a system message and the question.
- ``math_shepherd`` (Math-Shepherd's card): ``question + " " + output``, the output one step per line, each
  ending in ``" " + tag``.
- ``tagged``: the response already carries the tags; it is sent as it is.

``auto`` takes the format from the served head (``/health``'s shape): ``qwen_prm`` for a step classifier,
``math_shepherd`` for a causal LM read at step tags, ``tagged`` for a scalar head read at step tags. Steps are the
response's text split at ``step_split``; a step of whitespace only is dropped, the others are kept as they are.
"""

from __future__ import annotations

from typing import Any, Literal, Sequence

from verl_vllm_rm.protocol.model_shape import HeadKind, ModelShape
from verl_vllm_rm.scoring.rm_inputs import chat_template_ids, shared_prefix_split

StepFormat = Literal["auto", "qwen_prm", "math_shepherd", "tagged"]
#: the format ``auto`` takes for each process-reward head kind (any other head read at step tags: ``tagged``)
FORMAT_OF_KIND = {HeadKind.STEP_CLASSIFIER: "qwen_prm", HeadKind.STEP_TOKENS: "math_shepherd"}
#: where steps end in the response text, per card format, unless ``step_split`` says otherwise
DEFAULT_STEP_SPLIT = {"qwen_prm": "\n\n", "math_shepherd": "\n"}
#: the formats in which the client inserts the step tags itself
CARD_STEP_FORMATS = tuple(DEFAULT_STEP_SPLIT)
#: the system message of Qwen2.5-Math-PRM's card, used by ``qwen_prm`` unless ``system_prompt`` is set
QWEN_PRM_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."


def resolve_step_format(option: str, shape: ModelShape | None) -> str:
    """The format ``option`` names, or for ``auto`` the served head's (``tagged`` when the server does not say)."""
    if option != "auto":
        return option
    return FORMAT_OF_KIND.get(shape.kind, "tagged") if shape is not None else "tagged"


def step_spans(text: str, step_split: str) -> list[tuple[int, int]]:
    """``(start, end)`` character offsets in ``text`` of each step: ``text`` split at ``step_split``, steps of
    whitespace only dropped."""
    spans, start = [], 0
    for piece in text.split(step_split):
        if piece.strip():
            spans.append((start, start + len(piece)))
        start += len(piece) + len(step_split)
    return spans


def split_steps(text: str, step_split: str) -> list[str]:
    """The response's steps (:func:`step_spans`' texts)."""
    return [text[start:end] for start, end in step_spans(text, step_split)]


def step_end_tokens(tokenizer: Any, response_ids: Sequence[int], ends: Sequence[int]) -> list[int]:
    """For each step's end (a character offset, ascending, into ``tokenizer.decode(response_ids,
    skip_special_tokens=True)``), the index of the policy token whose text reaches it: the first ``k`` whose
    prefix ``response_ids[:k + 1]`` decodes to at least ``end`` characters. The mapping goes through the decoded
    text, so the RM's tokenizer need not be the policy's; a token holding the end of two steps ends both."""
    def reaches(k: int, end: int) -> bool:
        return len(tokenizer.decode(response_ids[: k + 1], skip_special_tokens=True)) >= end

    indices, low = [], 0
    for end in ends:
        high = len(response_ids) - 1
        while low < high:  # prefixes decode to texts that only grow: a binary search
            middle = (low + high) // 2
            if reaches(middle, end):
                high = middle
            else:
                low = middle + 1
        indices.append(low)
    return indices


def with_system_prompt(messages: Sequence[dict], system_prompt: str | None) -> list[dict]:
    """``messages`` with ``system_prompt`` as the first message (in place of the chat's own system message, which
    was written for the policy); unchanged without one."""
    messages = list(messages)
    if system_prompt is None:
        return messages
    if messages and messages[0].get("role") == "system":
        messages = messages[1:]
    return [{"role": "system", "content": system_prompt}, *messages]


def qwen_prm_ids(tokenizer: Any, question: str, steps: Sequence[str], tag: str,
                 system_prompt: str | None) -> tuple[list[int], list[int]]:
    """Qwen2.5-Math-PRM's card: system, question, then the steps joined by ``tag`` and one ``tag`` after the last
    as the assistant's turn."""
    messages = with_system_prompt([{"role": "user", "content": question}], system_prompt or QWEN_PRM_SYSTEM_PROMPT)
    return chat_template_ids(tokenizer, messages, tag.join(steps) + tag)


def math_shepherd_ids(tokenizer: Any, question: str, steps: Sequence[str], tag: str) -> tuple[list[int], list[int]]:
    """Math-Shepherd's card: ``tokenizer.encode(question + " " + output)``, the output one step per line, each
    ending in ``" " + tag``."""
    output = "\n".join(f"{step} {tag}" for step in steps)
    return shared_prefix_split(tokenizer(question).input_ids, tokenizer(f"{question} {output}").input_ids)
