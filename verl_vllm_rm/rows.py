"""verl's rows as the package reads them: the one reader of a trajectory's valid ids and fields.

Scoring reads the ``DataProto`` rows verl hands the reward manager (left-padded prompts,
right-padded responses, one attention mask over both); online RM training reads the step's
rows from TransferQueue (jagged tensors, already unpadded). Both go through
:func:`unpadded`. Imports neither verl nor vllm: a ``DataProto`` is read through its
``batch``, ``non_tensor_batch`` and ``meta_info``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import numpy as np
import torch

REFERENCE_SOURCES = ("ground_truth", "rm_gallery")  # or "extra_info:<key>"


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


def unpadded(prompts: Any, responses: Any, attention_mask: Any = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each row's valid prompt ids and response ids, as int64 numpy views.

    ``prompts``/``responses`` are verl's padded 2-D tensors (or arrays) with ``attention_mask`` over
    both (prompts left-padded, responses right-padded), or jagged nested tensors (TransferQueue's),
    whose rows carry no padding and need no mask. Whole-array numpy calls: a numpy or torch call costs
    microseconds even on one row.
    """
    if attention_mask is None:
        if not (getattr(prompts, "is_nested", False) and getattr(responses, "is_nested", False)):
            raise ValueError("padded prompts and responses need their attention_mask (only jagged rows have none)")
        return [p.numpy() for p in prompts.unbind()], [r.numpy() for r in responses.unbind()]
    prompts, responses, mask = (np.asarray(t) for t in (prompts, responses, attention_mask))
    n = prompts.shape[-1]
    if n == 0:  # zero-width prompts (argmax has nothing to search): every prompt is empty
        return [prompts[i] for i in range(len(prompts))], _responses(responses, mask[:, n:])
    valid = mask[:, :n] != 0
    prompt_lens = np.count_nonzero(valid, axis=1)
    # verl left-pads prompts: the valid ids are the last prompt_len ones, unless the mask has holes (read by it)
    contiguous = (((n - np.argmax(valid, axis=1)) == prompt_lens) | (prompt_lens == 0)).tolist()
    starts = (n - prompt_lens).tolist()
    prompt_rows = [prompts[i, start:] if whole else prompts[i][valid[i]]
                   for i, (start, whole) in enumerate(zip(starts, contiguous))]
    return prompt_rows, _responses(responses, mask[:, n:])


def _responses(responses: np.ndarray, response_mask: np.ndarray) -> list[np.ndarray]:
    """Right-padded responses: each row's first ``count(mask)`` ids."""
    return [responses[i, :length] for i, length in enumerate(np.count_nonzero(response_mask, axis=1).tolist())]


def last_output(data: Any) -> Any:
    """The row verl's reward loop scores of one trajectory: its last output. verl 0.9.1's
    ``AgentLoopWorker._compute_score`` hands ``run_single`` one row per output of a trajectory (an agent loop may
    return several) and gives the reward to the last; its own managers score ``data[-1:]``."""
    batch = data.batch  # its batch size read directly: verl's ``DataProto.__len__`` costs four times as much
    return data if batch is not None and batch.batch_size[0] == 1 else data[-1:]


#: A validation row: verl 0.9.1's agent loop drops its ``validate`` flag before the reward call, so the trainer
#: modes tag each validation prompt with this non-tensor field (:class:`verl_vllm_rm.plugin.trainer_modes.
#: ValidationTagging`), which travels with the prompt's fields to the reward manager in every trainer mode.
VALIDATION_FIELD = "vllm_rm_validate"


def samples_of(datas: Sequence[Any]) -> list[Sample]:
    """Every row of verl ``DataProto``s, in order: one batch (the batch ``__call__``) or the one-row slices verl's
    reward loop hands ``run_single``, read together (which rows validate: :func:`_validates`)."""
    fields: list[dict[str, Any]] = []
    validates: list[bool] = []
    for data in datas:
        columns, size = list(data.non_tensor_batch.items()), len(data)
        rows = [{k: v[i] for k, v in columns} for i in range(size)]
        fields.extend(rows)
        validates.extend(_validates(data, row) for row in rows)
    return _samples(datas, fields, validates)


def samples_of_rows(rows: Sequence[Any]) -> list[Sample | Exception]:
    """One-row ``DataProto``s (``run_single``'s), read together; should that fail (rows of different widths, a
    malformed one), each row read alone: its sample or its own error.

    Each row's fields are read without asking its length (verl's ``DataProto.__len__`` costs about as much as
    reading the row): a row that is not one row long fails the joined read, then its own."""
    try:
        fields = [{k: v[0] for k, v in row.non_tensor_batch.items()} for row in rows]
        validates = [_validates(row, f) for row, f in zip(rows, fields)]
        return _samples(rows, fields, validates)
    except Exception:
        read: list[Sample | Exception] = []
        for row in rows:
            try:
                samples = samples_of([row])
                if len(samples) != 1:
                    raise ValueError(f"run_single was handed {len(samples)} rows in one DataProto: verl's reward "
                                     "loop hands it one row per call (last_output takes a trajectory's last)")
                read.append(samples[0])
            except Exception as e:
                read.append(e)
        return read


def _validates(data: Any, fields: dict[str, Any]) -> bool:
    """Whether a row validates: its batch's ``meta_info`` says so (the batch API) or its :data:`VALIDATION_FIELD`
    does (the per-trajectory reward loop)."""
    return bool(data.meta_info.get("validate", False) or fields.get(VALIDATION_FIELD, False))


def _samples(datas: Sequence[Any], fields: list[dict[str, Any]], validates: list[bool]) -> list[Sample]:
    """The samples of ``datas``' rows, given each row's fields. The rows' tensors are joined once and read by
    :func:`unpadded`; each sample's ids are views of the joined arrays. Rows of different widths cannot be joined
    (a ValueError: read them apart)."""
    tensors = [dict(data.batch.items()) for data in datas]  # one pass (TensorDict's __getitem__ costs ~1 us a key)
    prompts, responses, mask = (
        (tensors[0][key] if len(tensors) == 1 else _joined([t[key] for t in tensors])).numpy()
        for key in ("prompts", "responses", "attention_mask"))
    if len(prompts) != len(fields):
        # internal: only samples_of_rows' joined read reaches it, and it then reads each row alone (naming the row)
        raise ValueError(f"{len(prompts)} rows of tensors but {len(fields)} of non-tensor fields")
    prompt_rows, response_rows = unpadded(prompts, responses, mask)
    for i, row in enumerate(fields):
        if "prompt_len" in row:  # verl's agent-loop reward call: right-padded rows, their lengths beside them
            prompt_rows[i] = prompts[i, : int(row["prompt_len"])]
            response_rows[i] = responses[i, : int(row["response_len"])]
    return [Sample(*row) for row in zip(prompt_rows, response_rows, fields, validates)]


def _joined(tensors: list[torch.Tensor]) -> torch.Tensor:
    try:
        return torch.cat(tensors)  # checks the widths itself, in C (a Python pass over the shapes costs more)
    except RuntimeError as e:
        shapes = sorted({tuple(t.shape) for t in tensors})
        raise ValueError(f"rows of different widths cannot be read together: {shapes}") from e


def prompt_text(tokenizer: Any, sample: Sample) -> str:
    """The prompt as text: the raw chat's messages if the batch has them, else the decoded prompt ids."""
    messages = sample.fields.get("raw_prompt")
    if messages is not None:
        return "\n".join(f"{m['role']}: {m['content']}" for m in messages)
    return tokenizer.decode(sample.prompt_ids, skip_special_tokens=True)


def question_text(tokenizer: Any, sample: Sample) -> str:
    """The question as a process RM's card writes it: the raw chat's last user message if the batch has the chat
    (``data.return_raw_chat``), else the decoded prompt ids."""
    messages = sample.fields.get("raw_prompt")
    if messages is not None:
        users = [m["content"] for m in messages if m.get("role") == "user"]
        if users:
            return users[-1]
    return tokenizer.decode(sample.prompt_ids, skip_special_tokens=True)


def validate_reference_source(source: str) -> str:
    if source in REFERENCE_SOURCES or (source.startswith("extra_info:") and len(source) > len("extra_info:")):
        return source
    raise ValueError(
        f"reference_source={source!r} is not one of {list(REFERENCE_SOURCES)} or 'extra_info:<key>'"
    )


def reference_text(fields: dict[str, Any], source: str) -> str | None:
    """The reference answer in one sample's non-tensor fields (None when it has none)."""
    if source == "ground_truth":
        value = (fields.get("reward_model") or {}).get("ground_truth")
    elif source == "rm_gallery":  # rm-gallery's DataSample shape: extra_info["y"][0]["content"]
        ys = (fields.get("extra_info") or {}).get("y") or []
        value = ys[0].get("content") if ys and isinstance(ys[0], dict) else None
    else:
        value = (fields.get("extra_info") or {}).get(source.split(":", 1)[1])
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return str(value)
