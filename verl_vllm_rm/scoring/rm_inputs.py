"""Build the reward model's input for one verl trajectory (pure functions over ids).

``token_ids`` mode sends the policy's own prompt + response ids (no decode and
re-tokenize: the RM must share the policy's tokenizer). ``chat_template`` mode
renders the raw chat plus the decoded response with the RM tokenizer's template.
Either way an overlong input is fitted by dropping prompt tokens from the left,
so the whole response, whose last token carries the score, is always scored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import numpy as np
import torch


class OverlongInputError(ValueError):
    pass


@dataclass(frozen=True, slots=True, eq=False)
class Sample:
    """One trajectory: its valid prompt/response ids (1-D integer numpy arrays, views of the batch's tensors:
    neither copied into Python ints nor traversed by the garbage collector) and its non-tensor fields."""

    prompt_ids: np.ndarray
    response_ids: np.ndarray
    fields: dict[str, Any]
    validate: bool = False

    @property
    def group_key(self) -> Hashable:
        uid = self.fields.get("uid")
        return ("uid", str(uid)) if uid is not None else ("prompt", hash(self.prompt_ids.tobytes()))


def samples_of(datas: Sequence[Any], validate: bool = False) -> list[Sample]:
    """Every row of verl ``DataProto``s, in order: one batch (the batch ``__call__``) or the one-row slices verl's
    reward loop hands ``run_single``, read together. ``validate``: validation rows whatever ``meta_info`` says.

    The rows' tensors are joined once and read with whole-array numpy calls (a numpy or torch call costs
    microseconds even on one row); each sample's ids are views of the joined arrays. Rows of different widths
    cannot be joined (a ValueError: read them apart)."""
    tensors = [dict(data.batch.items()) for data in datas]  # one pass (TensorDict's __getitem__ costs ~2 us a key)
    prompts, responses, mask = (
        (tensors[0][key] if len(tensors) == 1 else _joined([t[key] for t in tensors])).numpy()
        for key in ("prompts", "responses", "attention_mask"))
    fields: list[dict[str, Any]] = []
    validates: list[bool] = []
    for data in datas:
        columns, size = list(data.non_tensor_batch.items()), len(data)
        fields.extend({k: v[i] for k, v in columns} for i in range(size))
        validates.extend([_validating(data, validate)] * size)
    n = prompts.shape[-1]
    valid = mask[:, :n] != 0
    prompt_lens = np.count_nonzero(valid, axis=1)
    response_lens = np.count_nonzero(mask[:, n:], axis=1).tolist()
    # verl left-pads prompts: the valid ids are the last prompt_len ones, unless the mask has holes (read alone)
    contiguous = ((n - np.argmax(valid, axis=1)) == prompt_lens) | (prompt_lens == 0)
    samples = []
    starts = (n - prompt_lens).tolist()
    for i, (start, whole, response_len) in enumerate(zip(starts, contiguous.tolist(), response_lens)):
        prompt = prompts[i, start:] if whole else prompts[i][valid[i]]
        samples.append(Sample(prompt, responses[i, :response_len], fields[i], validates[i]))
    return samples


def samples_of_rows(rows: Sequence[Any], validate: bool = False) -> list[Sample | Exception]:
    """One-row ``DataProto``s (``run_single``'s), read together; should that fail (rows of different widths, a
    malformed one), each row read alone: its sample or its own error."""
    try:
        return samples_of(rows, validate)
    except Exception:
        read: list[Sample | Exception] = []
        for row in rows:
            try:
                read.extend(samples_of([row], validate))
            except Exception as e:
                read.append(e)
        return read


def _joined(tensors: list[torch.Tensor]) -> torch.Tensor:
    try:
        return torch.cat(tensors)  # checks the widths itself, in C (a Python pass over the shapes costs more)
    except RuntimeError as e:
        shapes = sorted({tuple(t.shape) for t in tensors})
        raise ValueError(f"rows of different widths cannot be read together: {shapes}") from e


def _validating(data: Any, validate: bool) -> bool:
    return validate or bool(data.meta_info.get("validate", False))


@dataclass(frozen=True, slots=True, eq=False)
class RMInput:
    token_ids: np.ndarray  # 1-D, integer: JSON-encoded as a list (orjson's OPT_SERIALIZE_NUMPY)
    group_key: Hashable
    prompt_tokens_dropped: int
    prompt_len: int = 0  # ids before the response part (after truncation)


def fit_to_length(prompt: Sequence[int], response: Sequence[int], max_length: int,
                  policy: str) -> tuple[np.ndarray, int]:
    """Concatenate (as one int64 array), dropping prompt tokens from the left when the total exceeds
    ``max_length``."""
    overflow = max(0, len(prompt) + len(response) - max_length)
    if overflow and policy == "error":
        raise OverlongInputError(
            f"prompt ({len(prompt)}) + response ({len(response)}) tokens exceed the reward model's max length "
            f"{max_length}; set reward_kwargs.overlong_policy=truncate_prompt_left or raise the server's --max-model-len"
        )
    if overflow and overflow >= len(prompt) and len(response):
        raise OverlongInputError(
            f"the response alone has {len(response)} tokens, more than the reward model's max length {max_length} "
            "minus one prompt token; raise the server's --max-model-len or lower data.max_response_length"
        )
    kept = np.asarray(prompt[overflow:], dtype=np.int64)
    return np.concatenate((kept, np.asarray(response, dtype=np.int64))), overflow


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

