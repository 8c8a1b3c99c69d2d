"""The ``rubric`` component under a rubric template (principles around prompt and response)."""

import numpy as np

from verl_vllm_rm.dev.grpo_batch import build_batch
from verl_vllm_rm.parity.reference import sequence_scores


TEMPLATE = "Judge by {principles}\nQ: {prompt}\nA: {response}\nVerdict:"


def rendered(tokenizer, prompt: str, response: str) -> list[int]:
    principles = "- helpfulness\n- honesty"
    head = tokenizer(f"Judge by {principles}\nQ: user: {prompt}\nA: ").input_ids
    return head + tokenizer(response + "\nVerdict:", add_special_tokens=False).input_ids


def test_rubric_template_scores_the_rendered_text(load_manager, rm_server, verl_config, tokenizer, hf_model, grpo_groups):
    cfg = verl_config(rm_server.url, rubric_template=f"'{TEMPLATE}'", rubric_principles="[helpfulness,honesty]",
                      pairwise="always")
    mgr = load_manager(cfg, tokenizer)
    data = build_batch(grpo_groups, tokenizer.pad_token_id)
    info = mgr(data, return_dict=True)["reward_extra_info"]
    rows, refs = [], []
    for g in grpo_groups:
        question = g.raw_prompt[0]["content"]
        rows += [rendered(tokenizer, question, tokenizer.decode(r, skip_special_tokens=True)) for r in g.response_ids]
        refs += [rendered(tokenizer, question, g.ground_truth)] * len(g.response_ids)
    assert np.allclose(info["rm_score"], sequence_scores(hf_model, rows), atol=1e-4)
    assert np.allclose(np.array(info["rm_score"]) - info["ref_margin"], sequence_scores(hf_model, refs), atol=1e-4)
