"""Build the reward model's input for one verl trajectory (pure functions over ids).

``token_ids`` mode sends the policy's own prompt + response ids (no decode and
re-tokenize: the RM must share the policy's tokenizer). ``chat_template`` mode
renders the raw chat plus the decoded response with the RM tokenizer's template.
Either way an overlong input is fitted by dropping prompt tokens from the left,
so the whole response, whose last token carries the score, is always scored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable

import numpy as np


class OverlongInputError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Sample:
    """One trajectory as plain Python: valid prompt/response ids and its non-tensor fields."""

    prompt_ids: list[int]
    response_ids: list[int]
    fields: dict[str, Any]
    validate: bool = False

    @property
    def group_key(self) -> Hashable:
        uid = self.fields.get("uid")
        return ("uid", str(uid)) if uid is not None else ("prompt", hash(tuple(self.prompt_ids)))


def _arrays(data: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Numpy views of a verl ``DataProto``'s prompts, responses and attention mask, from one ``items()`` pass
    (TensorDict's ``__getitem__`` costs ~3 us a key; a torch call costs microseconds even on one row)."""
    batch = dict(data.batch.items())
    return batch["prompts"].numpy(), batch["responses"].numpy(), batch["attention_mask"].numpy()


def _sample(prompts: np.ndarray, responses: np.ndarray, mask: np.ndarray, columns: Any, i: int,
            validate: bool) -> Sample:
    """Row ``i``: the prompt's valid (left-padded) ids, the response's valid (right-padded) ids, read with a
    few numpy calls on views."""
    row_mask, n = mask[i], prompts.shape[-1]
    response_len = int(np.count_nonzero(row_mask[n:]))
    return Sample(prompts[i][row_mask[:n] != 0].tolist(), responses[i, :response_len].tolist(),
                  {k: v[i] for k, v in columns}, validate)


def samples_from_batch(data: Any, validate: bool = False) -> list[Sample]:
    """Every row of a verl ``DataProto`` (the batch ``__call__``); ``validate``: validation rows whatever the
    batch's ``meta_info`` says."""
    prompts, responses, mask = _arrays(data)
    columns, validate = data.non_tensor_batch.items(), _validating(data, validate)
    return [_sample(prompts, responses, mask, columns, i, validate) for i in range(len(mask))]


def sample_of_row(data: Any, i: int = -1, validate: bool = False) -> Sample:
    """One row of a verl ``DataProto``: ``run_single`` gets one-row slices from verl's reward loop."""
    return _sample(*_arrays(data), data.non_tensor_batch.items(), i, _validating(data, validate))


def _validating(data: Any, validate: bool) -> bool:
    return validate or bool(data.meta_info.get("validate", False))


@dataclass(frozen=True, slots=True)
class RMInput:
    token_ids: list[int]
    group_key: Hashable
    prompt_tokens_dropped: int
    prompt_len: int = 0  # ids before the response part (after truncation)


def fit_to_length(prompt: list[int], response: list[int], max_length: int, policy: str) -> tuple[list[int], int]:
    """Concatenate, dropping prompt tokens from the left when the total exceeds ``max_length``."""
    overflow = len(prompt) + len(response) - max_length
    if overflow <= 0:
        return prompt + response, 0
    if policy == "error":
        raise OverlongInputError(
            f"prompt ({len(prompt)}) + response ({len(response)}) tokens exceed the reward model's max length "
            f"{max_length}; set reward_kwargs.overlong_policy=truncate_prompt_left or raise the server's --max-model-len"
        )
    if overflow >= len(prompt) and response:
        raise OverlongInputError(
            f"the response alone has {len(response)} tokens, more than the reward model's max length {max_length} "
            "minus one prompt token; raise the server's --max-model-len or lower data.max_response_length"
        )
    return prompt[overflow:] + response, overflow


def chat_template_ids(rm_tokenizer: Any, messages: list[dict], response_text: str) -> tuple[list[int], list[int]]:
    """(prompt part, response part) ids of the chat rendered with the RM's template."""
    full_text = rm_tokenizer.apply_chat_template(
        [*messages, {"role": "assistant", "content": response_text}], tokenize=False
    )
    prompt_text = rm_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    full = rm_tokenizer(full_text, add_special_tokens=False).input_ids
    prompt = rm_tokenizer(prompt_text, add_special_tokens=False).input_ids
    shared = 0
    for a, b in zip(prompt, full):
        if a != b:
            break
        shared += 1
    return full[:shared], full[shared:]


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


def prompt_text(tokenizer: Any, sample: Sample) -> str:
    """The prompt as text: the raw chat's messages if the batch has them, else the decoded prompt ids."""
    messages = sample.fields.get("raw_prompt")
    if messages is not None:
        return "\n".join(f"{m['role']}: {m['content']}" for m in messages)
    return tokenizer.decode(sample.prompt_ids, skip_special_tokens=True)

