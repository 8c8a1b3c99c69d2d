"""A custom rule reward added to the composition.

verl's own hook for custom rewards, reward.custom_reward_function.path, supplies the
`verifiable` component; reward_kwargs.rewards weighs it next to the RM (`rubric`) and
the built-in rules: total = 0.8 * rubric + 0.5 * politeness + format.

    .venv/bin/python examples/custom_rule_reward.py
"""

import os
import tempfile

import verl
from hydra import compose, initialize_config_dir
from transformers import AutoTokenizer
from verl.trainer.ppo.reward import load_reward_manager

from verl_vllm_rm.dev.grpo_batch import Group, build_batch
from verl_vllm_rm.dev.server_launcher import running_server
from verl_vllm_rm.dev.tiny_rm import build_tiny_rm

RESPONSES = [" <think>add</think> <answer>7, thanks</answer>", " The answer is 7.", " please: 7"]
WEIGHTS = {"rubric": 0.8, "verifiable": 0.5, "format": 1.0}


def score(server_url: str, model_path: str) -> dict[str, list]:
    """Score RESPONSES with the RM, my_rule.politeness and the format rule; returns reward_extra_info."""
    tok = AutoTokenizer.from_pretrained(model_path)
    group = Group(tok("What is 3 + 4?").input_ids, [tok(r, add_special_tokens=False).input_ids for r in RESPONSES])
    rule = os.path.join(os.path.dirname(os.path.abspath(__file__)), "my_rule.py")
    weights = ",".join(f"{k}:{v}" for k, v in WEIGHTS.items())
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose("ppo_trainer", overrides=[
            "reward.reward_manager.name=vllm_rm", f"actor_rollout_ref.model.path={model_path}",
            f"reward.custom_reward_function.path={rule}", "reward.custom_reward_function.name=politeness",
            f"+reward.reward_kwargs.server_url={server_url}", "+reward.reward_kwargs.num_examine=0",
            f"+reward.reward_kwargs.rewards={{components:[rubric,verifiable,format],weights:{{{weights}}}}}",
        ])
    manager = load_reward_manager(cfg, tok)
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
