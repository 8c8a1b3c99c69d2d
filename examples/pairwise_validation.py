"""Pairwise validation on a toy set: each response against the prompt's reference answer.

Runs verl's own loader with reward.reward_manager.name=vllm_rm and meta_info["validate"]
set, as verl's validation does, and prints win / win_and per response and overall.

    .venv/bin/python examples/pairwise_validation.py
"""

import tempfile

from transformers import AutoTokenizer

from verl_vllm_rm.dev.grpo_batch import Group, build_batch
from verl_vllm_rm.replicas.launcher import running_server
from verl_vllm_rm.dev.tiny_rm import build_tiny_rm
from verl_vllm_rm.dev.loader import load_manager

REFERENCE = " <think>add 3 and 4</think> The answer is 7."
RESPONSES = [REFERENCE, " The answer is 7.", " The answer is 8.", " so so so so"]


def validate(server_url: str, model_path: str) -> dict[str, list]:
    """Score RESPONSES in validation mode; returns verl's reward_extra_info."""
    tok = AutoTokenizer.from_pretrained(model_path)
    group = Group(tok("What is 3 + 4?").input_ids, [tok(r, add_special_tokens=False).input_ids for r in RESPONSES],
                  ground_truth=REFERENCE)
    manager = load_manager(tok, server_url, model_path, {"num_examine": 0})
    data = build_batch([group], tok.pad_token_id)
    data.meta_info["validate"] = True
    info = manager(data, return_dict=True)["reward_extra_info"]
    manager.close()
    for text, win, win_and, margin in zip(RESPONSES, info["win"], info["win_and"], info["ref_margin"]):
        print(f"win={win:.0f} win_and={win_and:.0f} margin={margin:+.3f}  {text.strip()}")
    print(f"win rate {sum(info['win']) / len(RESPONSES):.2f}, win_and rate {sum(info['win_and']) / len(RESPONSES):.2f}")
    return info


if __name__ == "__main__":
    path = str(build_tiny_rm(tempfile.mkdtemp() + "/tiny-rm"))
    with running_server(path, ["--dtype", "float32", "--enforce-eager"]) as server:
        validate(server.url, path)
