"""Four reward models in verl's real ``main_ppo`` in its ``colocate_async`` mode (GRPO on CPU through the harness,
trainer mode ``vllm_rm_colocate_async``: the next batch is generated and scored while a step trains): ``helpful`` on the session's
server, ``safety`` on a replica the plugin starts and manages on verl's Ray cluster, and two published families
on servers of this module: ``attrs``, a multi-attribute head (HelpSteer-style) weighted by the run, and ``prm``, a
two-class process reward model (Qwen2.5-Math-PRM kind) read as its card reads the policy's plain-text steps, with
``step_reward=min``. A quarter of the prompts (``math_dapo``) take a route of their own: the same PRM with
``step_reward=token``, each step's reward on the policy token that ends it. Each dumped reward of the others is
the uncertainty-penalised ensemble of the RMs' scores of the exact token ids verl generated (``safety`` whitened),
plus the rules, each member equal to a direct score; the per-token rewards verl trained on sit on the step-ending
tokens, each the card's number for that step; the replica served every safety score, every per-replica,
per-attribute metric and the attribute alarm are in verl's logger, the whitening statistics are in the run's
checkpoint, and no replica process outlives the run. One replica: two managed replicas sharing the load in
``main_ppo`` are shown by test_tiny_ppo_online.py (and the fleet's own tests), so a second here would prove
nothing more for one more server start."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import numpy as np
import pytest
import requests
from ppo_runs import check_scored_once_whole, expected_totals, generations, read_jsonl, tiny_ppo
from process_helpers import wait_for_no_orphaned_engines
from server_starts import servers_started_together

from verl_vllm_rm.dev.ppo_report import read_dump, read_metrics
from verl_vllm_rm.dev.tiny_rm import STEP, TinyRMSpec, build_tiny_rm
from verl_vllm_rm.dev.tiny_rm_families import build_tiny_attribute_rm, build_tiny_qwen2_prm
from verl_vllm_rm.dev.tiny_task import MATH_DAPO
from verl_vllm_rm.monitor.alarms import MIN_SAMPLES

pytestmark = [pytest.mark.server, pytest.mark.ray]
PENALTY = 0.5
MATH_DAPO_EVERY = 4  # every fourth prompt from the first is a math_dapo one (the PRM's token-level route)
ATTRIBUTES = {"helpfulness": 1.0, "verbosity": -0.5}  # helpfulness minus a share of verbosity
MEMBERS = ("helpful", "safety", "attrs", "prm")
#: the tiny policy writes no line breaks: its steps are its words
STEP_SPLIT = " "
#: the system message of Qwen2.5-Math-PRM's card
CARD_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."


@pytest.fixture(scope="module")
def second_rm(tmp_path_factory, tiny_rm) -> Path:
    """Another RM on the session RM's tokenizer (other weights, 10x the head scale), for this module only."""
    return build_tiny_rm(tmp_path_factory.mktemp("second_rm"), TinyRMSpec(init_seed=7, head_std=1.0))


@pytest.fixture(scope="module")
def safety_model(second_rm):
    """The safety RM in transformers (the reference of every safety score), loaded once for the module."""
    from verl_vllm_rm.parity.reference import load_reward_model

    return load_reward_model(str(second_rm))


@pytest.fixture(scope="module")
def family_servers(tmp_path_factory, tokenizer, server_args):
    """The attribute RM and the Qwen2 PRM, started at once. The PRM's step tag is the tokenizer's step token, which
    the policy never writes: the client inserts it after each of the policy's plain-text steps, as the card does
    (``step_format`` auto: ``qwen_prm``), and reads P(positive) at each."""
    attrs = build_tiny_attribute_rm(tmp_path_factory.mktemp("attrs"))
    prm = build_tiny_qwen2_prm(tmp_path_factory.mktemp("prm"))
    pooling = [*server_args, "--runner", "pooling"]
    step_tag = ["--step-tag-id", str(tokenizer.convert_tokens_to_ids(STEP))]
    with servers_started_together([(attrs, pooling), (prm, [*pooling, *step_tag])]) as servers:
        yield dict(zip(("attrs", "prm"), servers))


def server_processes(model: Path) -> list[int]:
    """Pids of reward servers serving ``model`` (from /proc: whoever started them)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"verl_vllm_rm.server" in cmd and str(model).encode() in cmd:
            pids.append(int(proc.name))
    return pids


@pytest.fixture(scope="module")
def two_rm_run(tmp_path_factory, tiny_rm, tiny_task, rm_server, second_rm, server_args, family_servers) -> dict:
    args = ",".join(f"'{a}'" for a in server_args)
    replicas = f"{{model:'{second_rm}',num_replicas:1,server_args:[{args}]}}"
    weights = ",".join(f"{name}:{weight}" for name, weight in ATTRIBUTES.items())
    prm = f"server_url:'{family_servers['prm'].url}',failure_policy:mask,step_split:'{STEP_SPLIT}'"
    families = (f"{{name:attrs,server_url:'{family_servers['attrs'].url}',attributes:{{{weights}}}}},"
                f"{{name:prm,{prm},step_reward:min}},{{name:prm_steps,{prm},step_reward:token}}")
    overrides = [
        f"+reward.reward_kwargs.reward_models=[{{name:helpful}},{{name:safety,whiten:running,replicas:{replicas}}},"
        f"{families}]",
        "+reward.reward_kwargs.attribute_alarms=[{watch:verbosity,against:helpfulness,reward_model:attrs}]",
        f"+reward.reward_kwargs.routes=[{{data_source:{MATH_DAPO},reward_models:[prm_steps]}},"
        f"{{data_source:'*',reward_models:[{','.join(MEMBERS)}],ensemble:mean_minus_std,"
        f"uncertainty_penalty:{PENALTY}}}]",
        # one reward-loop worker: one whitening stream, which test_whitened_scores_replay_from_the_raw_ones replays
        "reward.num_workers=1",
        # the prompts in the dataset's order (verl shuffles with an unseeded generator by default): the two steps
        # train on the first 8 prompts, 2 of them math_dapo ones, in an order colocate_async's completions decide
        "data.shuffle=False",
    ]
    run = tiny_ppo(tmp_path_factory.mktemp("ppo_two_rms"), tiny_rm, tiny_task["policy"], rm_server.url, steps=2,
                   validate=False, mode="colocate_async", math_dapo_every=MATH_DAPO_EVERY,
                   extra_overrides=[*overrides, "trainer.save_freq=2"])
    deadline = time.monotonic() + 60  # each server notices its replica actor is gone within a second or two
    while server_processes(second_rm) and time.monotonic() < deadline:
        time.sleep(1)
    run["replica_processes_after"] = server_processes(second_rm)
    run["orphaned_engines_after"] = wait_for_no_orphaned_engines()
    return run


def family_scores(url: str, sequences: list[list[int]], normalize: bool = False) -> list[dict]:
    """Direct ``/score`` answers of a family server for these token ids."""
    answer = requests.post(f"{url}/score", json={"input": sequences, "normalize": normalize}, timeout=120)
    answer.raise_for_status()
    return answer.json()["data"]


def is_math_dapo(row: dict) -> bool:
    """A row of a math_dapo prompt (the PRM's token-level route): verl's DAPO scorer gives the tiny policy -1
    (ppo_runs.expected_totals)."""
    return row["verifiable_score"] == -1.0


def ensemble_rows(work: Path, step: int) -> list[dict]:
    return [row for row in read_dump(work, step) if not is_math_dapo(row)]


def card_step_probabilities(url: str, tokenizer, row: dict) -> list[float]:
    """Qwen2.5-Math-PRM's card on a dumped row: the system message, the question, then the response's steps (its
    words) joined by the step tag with one more after the last as the assistant turn, rendered with the chat
    template and encoded; P(positive) at each tag, from the server's own /score."""
    question = re.search(r"What is \d+ \+ \d+\? Please compute the sum\.", row["input"]).group(0)
    steps = [step for step in row["output"].split(STEP_SPLIT) if step.strip()]
    if not steps:
        return []
    messages = [{"role": "system", "content": CARD_SYSTEM_PROMPT}, {"role": "user", "content": question},
                {"role": "assistant", "content": STEP.join(steps) + STEP}]
    ids = tokenizer.encode(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False))
    return family_scores(url, [ids], normalize=True)[0]["step_scores"]


def test_every_reward_is_the_ensemble_of_the_servers_direct_scores(two_rm_run, rm_server, safety_model,
                                                                   family_servers, tokenizer):
    """Each member's dumped score equals a direct score of a generation with the row's text: ``attrs`` the
    weighted sum of its two named attributes (each dumped raw), ``prm`` the minimum of the card's step
    probabilities for the response's words, masked (never a number) exactly where the response has no step; the
    reward is the ensemble of the members present (``safety`` whitened), plus the rules."""

    from verl_vllm_rm.parity.reference import sequence_scores

    labels = requests.get(f"{family_servers['attrs'].url}/health", timeout=30).json()["shape"]["labels"]

    def attrs(sequences):  # each candidate: (weighted sum, helpfulness, verbosity)
        return [(sum(w * item["attributes"][labels.index(a)] for a, w in ATTRIBUTES.items()),
                 *(item["attributes"][labels.index(a)] for a in ATTRIBUTES))
                for item in family_scores(family_servers["attrs"].url, sequences)]

    work = Path(two_rm_run["rollout_data_dir"]).parent
    gens = generations(work)
    checked, masked = 0, 0
    for step in (1, 2):
        dump = ensemble_rows(work, step)
        direct = [expected_totals(dump, gens, tokenizer, scorer) for scorer in
                  (rm_server.url, lambda seqs: sequence_scores(safety_model, seqs), attrs)]
        for (row, helpful, rules), (_, safety, _), (_, attributes, _) in zip(*direct):
            assert min(abs(row["rm_score_helpful"] - c) for c in helpful) <= 1e-4
            assert min(abs(row["rm_score_safety"] - c) for c in safety) <= 1e-4
            dumped = (row["rm_score_attrs"], row["rm_attr_attrs_helpfulness"], row["rm_attr_attrs_verbosity"])
            assert min(max(abs(d - c) for d, c in zip(dumped, candidate)) for candidate in attributes) <= 1e-4
            steps = card_step_probabilities(family_servers["prm"].url, tokenizer, row)
            if row["rm_valid_prm"] == 0.0:  # no step in the response: masked, never a number
                assert row["rm_score_prm"] is None and not steps
                masked += 1
            else:
                assert row["rm_score_prm"] == pytest.approx(min(steps), abs=1e-4)
            present = [row["rm_score_helpful"], row["rm_scaled_safety"], row["rm_score_attrs"]]
            present += [row["rm_score_prm"]] if row["rm_valid_prm"] == 1.0 else []
            std = float(np.std(present))  # population std of the members present
            assert row["rm_ensemble_std"] == pytest.approx(std, abs=1e-5)
            assert row["rm_score"] == pytest.approx(float(np.mean(present)) - PENALTY * std, abs=1e-5)
            assert row["score"] == pytest.approx(row["rm_score"] + rules, abs=1e-4)
            checked += 1
    assert 0 < checked < 32 and masked < checked  # both routes had rows; the PRM scored most responses
    print(f"PRM steps: {checked - masked} of {checked} responses scored, {masked} masked (no step)")


def test_token_level_rewards_verl_trained_on_sit_on_the_step_ending_tokens(two_rm_run, family_servers, tokenizer):
    """The math_dapo route's PRM with ``step_reward=token`` in verl's agent loop (trainer mode
    ``vllm_rm_colocate_async`` writes each response's per-token rewards into ``rm_scores``): the ``rm_scores`` verl
    trained on (dumped as ``token_rewards``) hold, on the policy token whose text reaches the end of each step
    (growing prefixes of the generated ids decoded here), the card's P(positive) for that step (rubric weight 1),
    and the rules (DAPO's -1, the format reward) on the last token; nothing anywhere else. They sum to the row's
    score; ``reward/token_rewards_placed`` is 1 at every step with such rows."""
    from verl_vllm_rm.dev.tiny_ppo import FORM_PATTERN, FORM_WEIGHT

    work = Path(two_rm_run["rollout_data_dir"]).parent
    by_text: dict[tuple[str, str], list[list[int]]] = {}
    for g in generations(work):
        key = (tokenizer.decode(g["prompt_ids"], skip_special_tokens=True),
               tokenizer.decode(g["response_ids"], skip_special_tokens=True))
        by_text.setdefault(key, []).append(g["response_ids"])
    metrics = dict(read_metrics(work))
    checked, steps_placed = 0, 0
    for step in (1, 2):
        rows = [row for row in read_dump(work, step) if is_math_dapo(row)]
        if rows:
            assert metrics[step]["reward/token_rewards_placed"] == 1.0
        for row in rows:
            tokens, text = np.array(row["token_rewards"]), row["output"]
            ids = next(ids for ids in by_text[(row["input"], text)] if len(ids) == len(tokens))
            probabilities = card_step_probabilities(family_servers["prm"].url, tokenizer, row)
            if not probabilities:  # no step text: masked, the reward 0.0 and no step anywhere
                assert row["rm_valid"] == 0.0 and not tokens.any()
                continue
            ends, cursor = [], 0
            for piece in (step for step in text.split(STEP_SPLIT) if step.strip()):
                cursor = text.index(piece, cursor) + len(piece)
                ends.append(cursor)
            ending = [next(k for k in range(len(ids))
                           if len(tokenizer.decode(ids[:k + 1], skip_special_tokens=True)) >= end) for end in ends]
            expected = np.zeros(len(ids))
            np.add.at(expected, ending, probabilities)
            expected[-1] += -1.0 + FORM_WEIGHT * float(re.search(FORM_PATTERN, text, re.DOTALL) is not None)
            assert np.allclose(tokens, expected, atol=1e-4), (row["output"], tokens.tolist(), expected.tolist())
            assert row["rm_score"] == pytest.approx(sum(probabilities), abs=1e-4)
            assert tokens.sum() == pytest.approx(row["score"], abs=1e-4)
            checked += 1
            steps_placed += len(ending)
    assert checked > 0
    print(f"token-level PRM: {checked} responses, {steps_placed} steps placed on their ending tokens")


def whitening_order(pairs: list[tuple[float, float]]) -> list[int] | None:
    """An order of one whitening stream in which every row's whitened value is ``(x - mean) / std`` of the raw
    scores up to and including its own (population std, 1 until two scores), or None if there is none.

    Found backwards: the whole stream's moments come from the raw scores alone; the last row must whiten to its
    value under them; removing it gives the moments before it (Welford run backwards), and so on. The moments
    before a row depend only on the set of rows before it, so a set that led nowhere is not tried again."""
    dead_ends: set[frozenset[int]] = set()

    def back(remaining: frozenset[int], n: int, mean: float, m2: float) -> list[int] | None:
        if not remaining:
            return []
        if remaining in dead_ends:
            return None
        std = math.sqrt(m2 / n) if n >= 2 and m2 > 0 else 1.0
        tried = set()
        for i in sorted(remaining):
            x, w = pairs[i]
            if (x, w) in tried or abs((x - mean) / std - w) > 1e-5 * (1 + abs(w)):
                continue
            tried.add((x, w))  # rows alike in both values are interchangeable: one try covers them
            before = mean if n == 1 else (n * mean - x) / (n - 1)
            rest = back(remaining - {i}, n - 1, before, max(0.0, m2 - (x - before) * (x - mean)))
            if rest is not None:
                return [*rest, i]
        dead_ends.add(remaining)
        return None

    raw = np.array([x for x, _ in pairs])
    return back(frozenset(range(len(pairs))), len(pairs), float(raw.mean()), float(((raw - raw.mean()) ** 2).sum()))


def test_whitened_scores_replay_from_the_raw_ones(two_rm_run, safety_model):
    """Every whitened safety score the ensemble used is recomputed here from the raw scores alone: there is an
    order of the run's one whitening stream (one reward-loop worker, both steps) in which each equals its raw score
    whitened by the running moments up to it. The stream is every training sample of the ensemble's route that
    verl asked a reward for (the harness's reward-call log, with each call's answer), trained on or not:
    colocate_async also scores groups that no step takes (a step takes the first groups to complete, of its batch
    or the next). Each raw score equals the safety RM's in transformers, and each dumped row is one of the calls."""
    from verl_vllm_rm.parity.reference import sequence_scores

    work = Path(two_rm_run["rollout_data_dir"]).parent
    calls = [call for call in read_jsonl(work / "reward_calls.jsonl")
             if not call["validate"] and call["data_source"] != MATH_DAPO]
    pairs = [(c["reward_extra_info"]["rm_score_safety"], c["reward_extra_info"]["rm_scaled_safety"]) for c in calls]
    assert pairs and all(w is not None for _, w in pairs)
    reference = sequence_scores(safety_model, [c["prompt_ids"] + c["response_ids"] for c in calls])
    assert np.allclose([x for x, _ in pairs], reference, atol=1e-4)
    dumped = [(row["rm_score_safety"], row["rm_scaled_safety"]) for step in (1, 2) for row in ensemble_rows(work, step)]
    unmatched = list(pairs)
    for x, w in dumped:  # each dumped row is a call of its own (its values as verl dumped them)
        call = next((c for c in unmatched if all(abs(a - b) <= 1e-5 * (1 + abs(b)) for a, b in zip(c, (x, w)))),
                    None)
        assert call is not None, f"the dumped row {(x, w)} is none of the reward calls: {unmatched}"
        unmatched.remove(call)
    order = whitening_order(pairs)
    assert order is not None, f"no order of the stream whitens like the run (a second reward-loop worker?): {pairs}"
    assert sorted(order) == list(range(len(pairs)))
    print(f"whitening stream: {len(pairs)} samples, {len(dumped)} of them dumped")


def test_per_rm_metrics_are_in_verls_logger(two_rm_run):
    """Each column's metric is over the rows that have it: a member's columns are None on the other route's rows;
    ``rm_ensemble_std`` is on every scored row (0.0 on the PRM's route: one RM) and None on a masked one (a
    math_dapo row whose response is empty has no step for the PRM to score: ``failure_policy=mask``)."""
    work = Path(two_rm_run["rollout_data_dir"]).parent
    metrics = dict(read_metrics(work))
    for step in (1, 2):
        dump = read_dump(work, step)
        scored = [r for r in dump if r["rm_valid"] == 1.0]
        for name in ("rm_score_helpful", "rm_score_safety", "rm_ensemble_std", "rm_score_attrs",
                     "rm_attr_attrs_helpfulness", "rm_attr_attrs_verbosity", "rm_valid_prm"):
            values = [r[name] for r in dump if r[name] is not None]
            assert len(values) == (len(scored) if name == "rm_ensemble_std" else len(ensemble_rows(work, step)))
            assert metrics[step][f"reward/{name}/mean"] == pytest.approx(np.mean(values))
        for name in MEMBERS[:3]:
            assert metrics[step][f"reward/rm_valid_{name}/mean"] == 1.0


def test_the_attribute_alarm_is_in_verls_logger_from_the_runs_attributes(two_rm_run):
    """``alarm/attribute_rise/attrs/verbosity_over_helpfulness`` in verl's logger: 0 at the first step with enough
    scored samples (nothing has risen since it), then the rise of verbosity's step mean minus helpfulness's, each
    in that step's std; absent at a step with fewer than MIN_SAMPLES."""
    work = Path(two_rm_run["rollout_data_dir"]).parent
    metrics = dict(read_metrics(work))
    key = "alarm/attribute_rise/attrs/verbosity_over_helpfulness"

    def column(step: int, attribute: str) -> np.ndarray:
        return np.array([row[f"rm_attr_attrs_{attribute}"] for row in ensemble_rows(work, step)])

    # a step takes the first 4 groups to complete (colocate_async), so how many are the attribute RM's (gsm8k)
    # varies; with 2 math_dapo prompts among the first 8 each step has at least 2 (MIN_SAMPLES) unless it also took
    # one of the next batch's. The alarm's rule: the first step with MIN_SAMPLES scored samples sets the baseline
    # (0), later ones rise from it, and a step with fewer logs nothing.
    counted = [step for step in (1, 2) if len(column(step, "verbosity")) >= MIN_SAMPLES]
    assert counted, [len(column(step, "verbosity")) for step in (1, 2)]
    for step in set((1, 2)) - set(counted):
        assert key not in metrics[step]
    first = counted[0]
    assert metrics[first][key] == pytest.approx(0.0, abs=1e-9)
    for step in counted[1:]:
        rise = {a: (column(step, a).mean() - column(first, a).mean()) / column(first, a).std()
                for a in ("verbosity", "helpfulness")}
        assert metrics[step][key] == pytest.approx(rise["verbosity"] - rise["helpfulness"], rel=1e-4, abs=1e-6)
    print(f"attribute alarm: logged at steps {counted}")


def test_the_checkpoint_holds_the_whitened_rms_statistics(two_rm_run):
    """The trainer mode saves global_step_N/vllm_rm/whitening.json: the whitened RM's running statistics over every
    raw score so far (the unwhitened RM has none). In colocate_async the next batch is generated and scored while
    step 2 trains, so the statistics hold the ensemble route's trained-on scores and some of the batches generated
    ahead (the exact statistics over the trained-on scores alone are checked in the sync run of test_tiny_ppo_online.py). One
    reward-loop worker here; the merge over several is tested with real Ray workers in
    tests/integration/plugin/test_whitening_checkpoint.py."""
    work = Path(two_rm_run["rollout_data_dir"]).parent
    saved = json.loads((work / "checkpoints" / "global_step_2" / "vllm_rm" / "whitening.json").read_text())
    seen = np.array([row["rm_score_safety"] for step in (1, 2) for row in ensemble_rows(work, step)], dtype=float)
    assert list(saved["reward_models"]) == ["safety"]
    state = saved["reward_models"]["safety"]
    assert len(seen) <= state["count"] <= len(generations(work))
    if state["count"] == len(seen):  # nothing of the next batch scored before the save
        assert state["mean"] == pytest.approx(seen.mean(), abs=1e-6)
        assert state["m2"] == pytest.approx(((seen - seen.mean()) ** 2).sum(), rel=1e-6)
    else:  # the extra scores only add spread: m2 over all is at least m2 over the trained-on ones
        assert state["m2"] >= ((seen - seen.mean()) ** 2).sum() * (1 - 1e-6)


def test_each_reward_call_scored_a_whole_trajectory_once(two_rm_run):
    """colocate_async pauses generation from the end of sampling to the weight sync (verl aborts what is in flight
    and resumes it after): each reward call of the four-RM manager scored a whole trajectory, none twice. This run's
    rollout is not slowed, so it seldom has generation in flight at the pause: that resumed trajectories are scored
    once, whole, in colocate_async is shown by the slowed colocate_async run of test_tiny_ppo_any_rm.py, which
    asserts at least one."""
    check_scored_once_whole(Path(two_rm_run["rollout_data_dir"]).parent)


def test_the_managed_replica_served_and_none_outlives_the_run(two_rm_run):
    """Per-replica metrics in verl's logger every step: the one replica in routing on version 0, no failure, no
    restart, and it scored every ensembled sample's safety; after main_ppo exits, no server of the replica's model
    is left."""
    work = Path(two_rm_run["rollout_data_dir"]).parent
    metrics = dict(read_metrics(work))
    for step in (1, 2):
        replicas = {k.split("/")[2] for k in metrics[step] if k.startswith("replicas/safety/") and k.count("/") == 3}
        assert replicas == {"0"}, replicas
        m = {k.rsplit("/", 1)[1]: v for k, v in metrics[step].items() if k.startswith("replicas/safety/0/")}
        assert m["routed"] == 1.0 and m["version"] == 0.0 and m["failures"] == 0.0 and m["restarts"] == 0.0, m
        assert m["requests"] == 0.0 or m["latency_ms"] > 0.0
    served = sum(metrics[step]["replicas/safety/0/inputs"] for step in (1, 2))
    ensembled = sum(len(ensemble_rows(work, step)) for step in (1, 2))
    assert served >= ensembled > 0  # every such sample's safety score came from it (the probes' none)
    assert two_rm_run["replica_processes_after"] == [] and two_rm_run["orphaned_engines_after"] == []
