"""Rule-reward composition inside the manager (through verl's loader, real server): the in-process tests (no server; those on the real server: tests/integration/scoring/test_manager_composition.py)."""

from __future__ import annotations

import pytest
from verl_vllm_rm.scoring.options import ConfigError
from verl_vllm_rm.dev.grpo_batch import build_batch


@pytest.mark.parametrize(
    "rewards,extra,needle",
    [
        ("{components:[rubric,style]}", {}, "style"),
        ("{components:[rubric,ngram],ngram:{ngram_size:-2}}", {}, "ngram_size"),
        ("{components:[rubric],weights:{format:1.0}}", {}, "not enabled"),
        ("{components:[rubric,verifiable]}", {"combine": "add"},
         r"combine='add' and rewards are exclusive: with a rewards composition, put 'verifiable' in "
         r"rewards\.components and give it a weight"),
    ],
)
def test_composition_config_errors_are_clear(load_manager, verl_config, tokenizer, rewards, extra, needle):
    with pytest.raises(ConfigError, match=needle):
        load_manager(verl_config("http://127.0.0.1:1", rewards=rewards, **extra), tokenizer)


def test_a_compute_score_dict_without_score_is_an_error_naming_its_keys(load_manager, verl_config, tokenizer,
                                                                         grpo_groups, tmp_path):
    """A user's ``reward.custom_reward_function`` that returns a dict without ``score`` stops the batch naming the
    keys it did return; never a reward read from some other key. Its route asks no RM, so no server is needed."""
    verifier = tmp_path / "verifier.py"
    verifier.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                        "    return {'acc': 1.0, 'pred': solution_str[-2:]}\n")
    cfg = verl_config("http://127.0.0.1:1", f"reward.custom_reward_function.path={verifier}",
                      "reward.custom_reward_function.name=compute_score",
                      routes="[{data_source:['*'],reward_models:[],rewards:{components:[verifiable]}}]")
    mgr = load_manager(cfg, tokenizer)
    with pytest.raises(ValueError, match=r"compute_score returned a dict without 'score': \['acc', 'pred'\]; return "
                                         r"a number or a dict whose 'score' is the reward"):
        mgr(build_batch(grpo_groups, tokenizer.pad_token_id))
