"""Build the reward model's input for one verl trajectory (pure functions over ids).

``token_ids`` mode sends the policy's own prompt + response ids (no decode and
re-tokenize: the RM must share the policy's tokenizer). ``chat_template`` mode
renders the raw chat plus the decoded response with the RM tokenizer's template.
Either way an overlong input is fitted by :func:`verl_vllm_rm.client.length.fit_to_length`.
The trajectory itself is read by :mod:`verl_vllm_rm.rows`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import numpy as np


@dataclass(frozen=True, slots=True, eq=False)
class RMInput:
    token_ids: np.ndarray  # 1-D, integer: JSON-encoded as a list (orjson's OPT_SERIALIZE_NUMPY)
    group_key: Hashable
    prompt_tokens_dropped: int
    prompt_len: int = 0  # ids before the response part (after truncation)


def chat_template_ids(rm_tokenizer: Any, messages: list[dict], response_text: str) -> tuple[list[int], list[int]]:
    """(prompt part, response part) ids of the chat rendered with the RM's template."""
    full_text = rm_tokenizer.apply_chat_template(
        [*messages, {"role": "assistant", "content": response_text}], tokenize=False
    )
    prompt_text = rm_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return shared_prefix_split(rm_tokenizer(prompt_text, add_special_tokens=False).input_ids,
                               rm_tokenizer(full_text, add_special_tokens=False).input_ids)


def shared_prefix_split(prompt: Sequence[int], full: Sequence[int]) -> tuple[list[int], list[int]]:
    """(prompt part, response part) of ``full``: the prompt part is what ``full`` shares with ``prompt`` from the
    start (a tokenizer may merge the boundary's tokens differently once the response follows)."""
    shared = 0
    for a, b in zip(prompt, full):
        if a != b:
            break
        shared += 1
    return list(full[:shared]), list(full[shared:])


RUBRIC_FIELDS = ("prompt", "response", "principles")


def check_rubric_template(template: str) -> None:
    """A rubric template is a ``str.format`` text with ``{prompt}``, one ``{response}`` and optional ``{principles}``."""
    import string

    fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    unknown = sorted(set(fields) - set(RUBRIC_FIELDS))
    if unknown or fields.count("response") != 1 or "prompt" not in fields:
        raise ValueError(
            f"rubric_template must use {{prompt}} and exactly one {{response}} (and optionally {{principles}}); "
            f"found fields {fields}"
        )


def rubric_template_ids(
    tokenizer: Any, template: str, principles: list[str], prompt: str, response: str
) -> tuple[list[int], list[int]]:
    """(text before the response, response and the rest) ids of ``template`` filled in.

    The two parts are tokenized separately so that left truncation only ever
    removes text before the response.
    """
    head, tail = template.split("{response}", 1)
    values = {"prompt": prompt, "principles": "\n".join(f"- {p}" for p in principles)}
    before = tokenizer(head.format(**values), add_special_tokens=True).input_ids
    after = tokenizer(response + tail.format(**values), add_special_tokens=False).input_ids
    return before, after
