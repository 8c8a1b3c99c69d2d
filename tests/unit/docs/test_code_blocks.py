"""Every flag and config key that a code block of README.md or docs/ names exists: the in-process tests (no server; those on the real server: tests/integration/docs/test_code_blocks.py)."""

from __future__ import annotations

from doc_code_blocks import Known, cli_options, problems

FAKE_SERVER = Known(frozenset({"--model", "--port", "--step-tag-id", "--max-model-len"}), cli_options())


def test_a_made_up_server_flag_is_caught_and_other_programs_flags_are_not():
    text = """
```bash
# the server
CUDA_VISIBLE_DEVICES=0 .venv-server/bin/python -m verl_vllm_rm.server --model /m \\
  --port 8001 --no-such-flag 3 --max_model_len=512
pytest -q --no-such-pytest-flag && pip install --no-such-pip-flag x | make --no-such-make-flag
python -m verl.trainer.main_ppo trainer.no_such_key=1 --no-such-verl-flag
```
"""
    assert problems(text, FAKE_SERVER) == ["line 2: python -m verl_vllm_rm.server has no flag --no-such-flag"]


def test_cli_flags_are_checked_per_subcommand():
    text = """
```console
$ verl-vllm-rm score --url http://127.0.0.1:8001 --normalize "a text"
$ verl-vllm-rm score --probes 3
$ verl-vllm-rm serve --model /m --step-tag-id 5 --nope
$ verl-vllm-rm tiny-ppo --steps 2 -- --anything +online_rm.lr=1e-5
$ verl-vllm-rm no-such-command
```
"""
    assert problems(text, FAKE_SERVER) == ["line 2: verl-vllm-rm score has no flag --probes",
                                           "line 2: verl-vllm-rm serve has no flag --nope",
                                           "line 2: unknown subcommand verl-vllm-rm no-such-command"]


def test_config_keys_are_checked_down_into_their_values():
    text = """
```bash
python -m verl.trainer.main_ppo reward.reward_manager.name=vllm_rm trainer.whatever=1 \\
  +reward.reward_kwargs.judge='{server_url:http://127.0.0.1:8002,mode:listwise,no_such_judge_key:1}' \\
  +reward.reward_kwargs.rewards.ngram.ngram_size=4 +reward.reward_kwargs.rewards.weights.anything=1 \\
  +reward.reward_kwargs.routes='[{data_source:"*",ensemble:mean,nope:1}]' \\
  +reward.reward_kwargs.reward_models='[{name:a,replicas:{model:/m,gpus:1}}]' \\
  +reward.reward_kwargs.no_such_option=1 +online_rm.lr=1e-5 +online_rm.no_such=2 \\
  +reward.reward_kwargs.rm_tokenizer_path=<path>
```

```yaml
reward:
  reward_manager: {name: vllm_rm}
  reward_kwargs:
    server_url: http://127.0.0.1:8001
    routes: [{data_source: "*", ensembel: mean}]
online_rm: {model_path: /m, lr_typo: 1}
```
"""
    assert problems(text, FAKE_SERVER) == [
        "line 2: unknown key reward.reward_kwargs.judge.no_such_judge_key",
        "line 2: unknown key reward.reward_kwargs.routes.nope",
        "line 2: unknown key reward.reward_kwargs.reward_models.replicas.gpus",
        "line 2: unknown key reward.reward_kwargs.no_such_option",
        "line 2: unknown key online_rm.no_such",
        "line 12: unknown key online_rm.lr_typo",
        "line 12: unknown key reward.reward_kwargs.routes.ensembel",
    ]
