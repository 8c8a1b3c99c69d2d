"""Validation groups with reference answers (one response equal to its reference), as the pairwise tests build
them, and verl's validation batch of them."""

from __future__ import annotations

from verl_vllm_rm.dev.grpo_batch import Group, build_batch


def reference_groups(tokenizer) -> list[Group]:
    """Unequal groups; in the first, one response is exactly the reference answer."""
    groups = []
    for (a, b), n in zip([(3, 4), (12, 30), (7, 8)], [4, 2, 3]):
        reference = f" <think>add {a} and {b}</think> The answer is {a + b}."
        responses = [tokenizer(f" The answer is {a + b + k}. so so").input_ids for k in range(n)]
        if a == 3:
            responses[1] = tokenizer(reference, add_special_tokens=False).input_ids
        groups.append(Group(tokenizer(f"What is {a} + {b}?").input_ids, responses, ground_truth=reference,
                            extra_info={"answer": reference, "y": [{"role": "assistant", "content": reference}]}))
    return groups


def validation_batch(groups, pad_id):
    data = build_batch(groups, pad_id)
    data.meta_info["validate"] = True
    return data
