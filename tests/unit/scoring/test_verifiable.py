"""The verifiable scorer's columns (``scoring/verifiable.py``) under verl's own names, the same keys on every sample
whatever the mix of data sources, and what ``compute_score`` receives, each checked against verl's ``naive`` manager
(the control) on the same rows and through verl 0.9.1's own assembly of a step (tests/support/verl_assembly.py).

No reward server: the routes score with no reward model (rules and ``compute_score`` only), so the tests are
in-process; the reward-model columns are then None, and every other column is what a run with an RM gets."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from verl_assembly import agent_loop_worker, assembled_step

from verl_vllm_rm.dev.grpo_batch import Group, build_batch
from verl_vllm_rm.rows import VALIDATION_FIELD
from verl_vllm_rm.scoring.options import ConfigError

NO_RM = {"routes": [{"data_source": ["*"], "reward_models": []}], "rewards": {"components": ["verifiable"]},
         "num_examine": 0}
ANSWERS = {"math_dapo": ["Answer: 7", "Answer: 9"], "openai/gsm8k": ["#### 7", "#### 8"]}  # right, wrong


def rows_of(tokenizer, first: str, second: str):
    """Two rows of each data source, ``first``'s before ``second``'s, each a one-row ``DataProto`` as verl's
    reward loop hands ``run_single``, and each row's (prompt ids, response ids)."""
    prompt = tokenizer("What is 3 + 4?").input_ids
    groups = [Group(prompt, [tokenizer(a).input_ids for a in ANSWERS[source]], ground_truth="7",
                    data_source=source, extra_info={"index": i}) for i, source in enumerate((first, second))]
    data = build_batch(groups, tokenizer.pad_token_id)
    return [data[i: i + 1] for i in range(len(data))], [(g.prompt_ids, r) for g in groups for r in g.response_ids]


def run_singles(manager, rows) -> list[dict]:
    async def score():
        import asyncio

        return await asyncio.gather(*(manager.run_single(row) for row in rows))

    return manager.loop.run_until_complete(score())


@pytest.fixture()
def naive(compose_config, tiny_rm, tokenizer):
    """verl's own ``naive`` manager with verl's default scorer: the control."""
    from verl.trainer.ppo.reward import load_reward_manager

    return load_reward_manager(
        compose_config(["reward.reward_manager.name=naive", f"actor_rollout_ref.model.path={tiny_rm}"]), tokenizer)


@pytest.fixture()
def no_rm_manager(load_manager, verl_config, dead_url, tokenizer):
    def load(*extra: str, **reward_kwargs):
        return load_manager(verl_config(dead_url, *extra, **{**NO_RM, **reward_kwargs}), tokenizer)

    return load


@pytest.mark.parametrize("order", [("math_dapo", "openai/gsm8k"), ("openai/gsm8k", "math_dapo")])
def test_mixed_data_sources_assemble_with_verls_names_in_either_order(order, no_rm_manager, naive, tokenizer,
                                                                      verl_config, dead_url):
    """math_dapo's ``{score, acc, pred}`` and gsm8k's number: naive's keys differ per sample, so verl's assembly
    raises (math_dapo first) or drops ``pred`` (gsm8k first); vllm_rm's samples all carry ``acc`` and ``pred`` (None
    where a result has none), equal to naive's values, and verl assembles both orders into the same columns."""
    import asyncio

    manager = no_rm_manager()
    rows, ids = rows_of(tokenizer, *order)
    ours, control = run_singles(manager, rows), run_singles(naive, rows)
    for mine, theirs in zip(ours, control):
        assert mine["reward_score"] == pytest.approx(float(theirs["reward_score"]))
        info = mine["reward_extra_info"]
        assert list(info) == list(ours[0]["reward_extra_info"]) and info["verifiable_score"] == mine["reward_score"]
        assert info["acc"] == theirs["reward_extra_info"]["acc"]
        assert info["pred"] == theirs["reward_extra_info"].get("pred")
    assert [o["reward_extra_info"]["acc"] for o in ours] == ([True, False, 1.0, 0.0] if order[0] == "math_dapo"
                                                             else [1.0, 0.0, True, False])
    worker = agent_loop_worker(verl_config(dead_url, **NO_RM))
    step = asyncio.run(assembled_step(worker, ids, ours))
    assert {"acc", "pred", "verifiable_score", "score"} <= set(step.meta_info["reward_extra_keys"])
    assert step.non_tensor_batch["acc"].tolist() == [o["reward_extra_info"]["acc"] for o in ours]
    if order[0] == "math_dapo":
        with pytest.raises(KeyError):
            asyncio.run(assembled_step(worker, ids, control))
    else:
        assert "pred" not in asyncio.run(assembled_step(worker, ids, control)).meta_info["reward_extra_keys"]


def scorer(correct: bool = True, **extra):
    """A user's compute_score returning ``{"score", "correct", **extra}`` and recording what it was given."""
    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        compute_score.seen.append(extra_info)
        return {"score": 1.0, "correct": correct, **extra}

    compute_score.seen = []
    return compute_score


def manager_with(compute_score, verl_config, dead_url, tokenizer, **reward_kwargs):
    from verl_vllm_rm.scoring.manager import VLLMRewardManager

    return VLLMRewardManager(verl_config(dead_url, **{**NO_RM, **reward_kwargs}), tokenizer, compute_score)


def test_a_declared_key_of_a_users_function_is_a_column_and_an_undeclared_one_is_left_out_with_a_warning(
        verl_config, dead_url, tokenizer, caplog):
    rows, _ = rows_of(tokenizer, "math_dapo", "openai/gsm8k")
    declared = manager_with(scorer(), verl_config, dead_url, tokenizer, compute_score_keys=["correct"])
    try:
        infos = [o["reward_extra_info"] for o in run_singles(declared, rows)]
    finally:
        declared.close()
    assert [i["correct"] for i in infos] == [True] * 4 and [i["acc"] for i in infos] == [None] * 4
    assert "pred" not in infos[0]  # a user's function: verl's default scorer's pred is not declared
    undeclared = manager_with(scorer(), verl_config, dead_url, tokenizer)
    try:
        with caplog.at_level(logging.WARNING, logger="verl_vllm_rm"):
            infos = [o["reward_extra_info"] for o in run_singles(undeclared, rows)]
    finally:
        undeclared.close()
    assert all("correct" not in i for i in infos)
    warnings = [r.getMessage() for r in caplog.records if "compute_score_keys" in r.getMessage()]
    assert len(warnings) == 1 and "'correct'" in warnings[0]
    assert "+reward.reward_kwargs.compute_score_keys=[correct]" in warnings[0]


def test_a_users_key_that_is_one_of_the_packages_columns_is_refused(verl_config, dead_url, tokenizer):
    """At the first batch that returns it (naming the key, the column and the fix), or at start-up when declared."""
    rows, _ = rows_of(tokenizer, "math_dapo", "openai/gsm8k")
    clashing = manager_with(scorer(format=1.0), verl_config, dead_url, tokenizer,
                            rewards={"components": ["verifiable", "format"]})
    try:
        with pytest.raises(ConfigError, match=r"compute_score returned the key 'format', which collides with "
                                              r"vllm_rm's own reward_extra_info column 'format'.*rename 'format' in "
                                              r"your compute_score \(docs/metrics.md"):
            run_singles(clashing, rows)
    finally:
        clashing.close()
    with pytest.raises(ConfigError, match=r"reward_kwargs.compute_score_keys declares the key 'win', which collides "
                                          r"with vllm_rm's own reward_extra_info column 'win'"):
        manager_with(scorer(), verl_config, dead_url, tokenizer, compute_score_keys=["win"])


@pytest.mark.parametrize("is_async", [False, True])
def test_compute_score_gets_naives_extra_info_on_a_copy(verl_config, dead_url, tokenizer, compose_config, tiny_rm,
                                                        is_async):
    """``num_turns``, ``rollout_reward_scores`` and the row's ``tool_extra_fields`` as verl's naive hands them, the
    row's own ``extra_info`` unchanged; ``is_async_reward_score`` as naive's."""
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager

    rows, _ = rows_of(tokenizer, "openai/gsm8k", "math_dapo")
    for row in rows:
        row.non_tensor_batch["__num_turns__"] = np.array([3])
        row.non_tensor_batch["tool_extra_fields"] = np.array([{"tool_calls": 2}], dtype=object)
        row.non_tensor_batch["reward_scores"] = np.array([{"tool": 0.5}], dtype=object)
    sync = scorer()
    compute_score = sync
    if is_async:
        async def compute_score(**kwargs):
            return sync(**kwargs)

    ours = manager_with(compute_score, verl_config, dead_url, tokenizer)
    try:
        run_singles(ours, rows[:1])
    finally:
        ours.close()
    assert rows[0].non_tensor_batch["extra_info"][0] == {"index": 0}  # the row's own dict is not changed
    control = NaiveRewardManager(compose_config([f"actor_rollout_ref.model.path={tiny_rm}"]), tokenizer, compute_score)
    run_singles(control, rows[:1])
    assert sync.seen[0] == sync.seen[1] == {"index": 0, "tool_calls": 2, "num_turns": 3,
                                            "rollout_reward_scores": {"tool": 0.5}}
    assert ours.is_async_reward_score is control.is_async_reward_score is is_async


@pytest.mark.parametrize("pairwise", ["auto", "never"])
def test_win_keys_are_on_every_sample_unless_pairwise_is_never(no_rm_manager, tokenizer, verl_config, dead_url,
                                                               pairwise):
    """A validation row and training rows in one step (the async trainer modes mix them): the same keys on each."""
    import asyncio

    manager = no_rm_manager(pairwise=pairwise, missing_reference="skip")
    rows, ids = rows_of(tokenizer, "openai/gsm8k", "math_dapo")
    rows[1].non_tensor_batch[VALIDATION_FIELD] = np.array([True], dtype=object)
    infos = [o["reward_extra_info"] for o in run_singles(manager, rows)]
    assert all(("win" in i and "win_and" in i and "ref_margin" in i) == (pairwise != "never") for i in infos)
    step = asyncio.run(assembled_step(agent_loop_worker(verl_config(dead_url, **NO_RM)), ids,
                                      run_singles(manager, rows)))
    assert ("win" in step.meta_info["reward_extra_keys"]) == (pairwise != "never")
