"""A custom rule reward added to the composition.

verl's own hook for custom rewards, reward.custom_reward_function.path, supplies the
`verifiable` component; reward_kwargs.rewards weighs it next to the RM (`rubric`) and
the built-in rules: total = 0.8 * rubric + 0.5 * politeness + format.

    .venv/bin/python examples/custom_rule_reward.py
"""

import os
import tempfile

from transformers import AutoTokenizer

from verl_vllm_rm.dev.grpo_batch import Group, build_batch
from verl_vllm_rm.replicas.launcher import running_server
from verl_vllm_rm.dev.tiny_rm import build_tiny_rm
from verl_vllm_rm.dev.loader import load_manager

RESPONSES = [" <think>add</think> <answer>7, thanks</answer>", " The answer is 7.", " please: 7"]
WEIGHTS = {"rubric": 0.8, "verifiable": 0.5, "format": 1.0}


def score(server_url: str, model_path: str) -> dict[str, list]:
    """Score RESPONSES with the RM, my_rule.politeness and the format rule; returns reward_extra_info."""
    tok = AutoTokenizer.from_pretrained(model_path)
    group = Group(tok("What is 3 + 4?").input_ids, [tok(r, add_special_tokens=False).input_ids for r in RESPONSES])
    rule = os.path.join(os.path.dirname(os.path.abspath(__file__)), "my_rule.py")
    rewards = {"components": list(WEIGHTS), "weights": WEIGHTS}
    manager = load_manager(tok, server_url, model_path, {"num_examine": 0, "rewards": rewards}, overrides=[
        f"reward.custom_reward_function.path={rule}", "reward.custom_reward_function.name=politeness"])
    info = manager(build_batch([group], tok.pad_token_id), return_dict=True)["reward_extra_info"]
    manager.close()
    for i, text in enumerate(RESPONSES):
        print(f"total={info['score'][i]:+.3f} rubric={info['rm_score'][i]:+.3f} "
              f"politeness={info['verifiable_score'][i]:.0f} format={info['format'][i]:.0f}  {text.strip()}")
    return info


if __name__ == "__main__":
    path = str(build_tiny_rm(tempfile.mkdtemp() + "/tiny-rm"))
    with running_server(path, ["--dtype", "float32", "--enforce-eager"]) as server:
        score(server.url, path)
