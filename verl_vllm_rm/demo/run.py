"""The demo, stage by stage: train a tiny RM, serve it with vLLM, score a GRPO batch
through verl's own loader, train one more step and publish it into the running server.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from verl_vllm_rm.dev.tiny_task import bad_answers, good_answer, preference_pairs, question

SERVER_ARGS = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--enable-weight-updates"]


def say(stage: str, text: str) -> None:
    print(f"\n=== {stage} === {text}", flush=True)


def _encode_pairs(tokenizer, pairs):
    from verl_vllm_rm.training.bt import collate_pairs

    return collate_pairs(
        [tokenizer(p.prompt + p.chosen).input_ids for p in pairs],
        [tokenizer(p.prompt + p.rejected).input_ids for p in pairs],
        tokenizer.pad_token_id,
    )


def pair_accuracy(model, batch) -> float:
    import torch

    from verl_vllm_rm.training.bt import sequence_rewards

    with torch.no_grad():
        chosen = sequence_rewards(model, batch.chosen_ids, batch.chosen_mask)
        rejected = sequence_rewards(model, batch.rejected_ids, batch.rejected_mask)
    return float((chosen > rejected).float().mean())


def train_tiny_rm(workdir: Path, seconds: float, seed: int):
    """Stage 1: build the tiny RM and train it (Bradley-Terry, full) for ``seconds``."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from verl_vllm_rm.tiny_rm import build_tiny_rm
    from verl_vllm_rm.training.bt import BradleyTerryTrainer, prepare_reward_model

    base = build_tiny_rm(workdir / "tiny-rm-base")
    tokenizer = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(seed)
    model = prepare_reward_model(AutoModelForSequenceClassification.from_pretrained(base, dtype=torch.float32), "full")
    held_out = _encode_pairs(tokenizer, preference_pairs(256, seed=seed + 1000))
    before = pair_accuracy(model, held_out)
    trainer = BradleyTerryTrainer(model, lr=1e-3)
    pairs = preference_pairs(100_000, seed=seed)
    t0, step = time.monotonic(), 0
    with tqdm(total=int(seconds), desc="training the tiny RM", unit="s") as bar:
        while time.monotonic() - t0 < seconds and (step + 1) * 32 <= len(pairs):
            metrics = trainer.step(_encode_pairs(tokenizer, pairs[step * 32 : (step + 1) * 32]))
            step += 1
            bar.n = min(int(time.monotonic() - t0), int(seconds))
            bar.set_postfix(step=step, loss=f"{metrics['rm/bt_loss']:.3f}")
    after = pair_accuracy(model, held_out)
    out = workdir / "tiny-rm-trained"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"held-out preference accuracy: {before:.2f} before -> {after:.2f} after {step} BT steps")
    return out, model, tokenizer, trainer


def start_server_with_progress(model_path: Path):
    """Stage 2: start the real vLLM server, with a progress bar while the engine loads."""
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as StillStarting

    from tqdm import tqdm

    from verl_vllm_rm.server_process import start_server

    with ThreadPoolExecutor(max_workers=1) as pool, tqdm(desc="starting vLLM (pooling runner)", unit="s") as bar:
        pending = pool.submit(start_server, model_path, SERVER_ARGS, log_path=model_path.parent / "server.log")
        while True:
            try:
                server = pending.result(timeout=1.0)  # re-raises a failed start here
                break
            except StillStarting:
                bar.update(1)
    print(f"server ready at {server.url} in {server.startup_s:.0f} s (log: {server.log_path})")
    return server


def demo_groups(tokenizer, seed: int):
    import random

    from verl_vllm_rm.grpo_batch import Group

    rng = random.Random(seed)
    groups = []
    for a, b in [(3, 4), (12, 5), (9, 9), (14, 6)]:
        responses = [good_answer(a, b), *bad_answers(a, b, rng)]
        groups.append(Group(
            tokenizer(question(a, b)).input_ids,
            [tokenizer(r, add_special_tokens=False).input_ids for r in responses],
            ground_truth=good_answer(a, b),
            data_source="demo/arithmetic",
        ))
    return groups


def score_through_verl(server_url: str, model_path: Path, tokenizer, groups):
    """Stage 3: verl's ``load_reward_manager`` with ``reward.reward_manager.name=vllm_rm``."""
    import os

    import verl
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.reward import load_reward_manager

    from verl_vllm_rm.grpo_batch import build_batch

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose("ppo_trainer", overrides=[
            "reward.reward_manager.name=vllm_rm", f"actor_rollout_ref.model.path={model_path}",
            f"+reward.reward_kwargs.server_url={server_url}", "+reward.reward_kwargs.num_examine=0",
        ])
    manager = load_reward_manager(cfg, tokenizer)
    data = build_batch(groups, tokenizer.pad_token_id)
    data.meta_info["validate"] = True  # as in verl's validation: pairwise vs the reference answer
    try:
        return manager(data, return_dict=True)["reward_extra_info"]
    finally:
        manager.close()


def print_tables(tokenizer, groups, info) -> None:
    row = 0
    for g in groups:
        print(f"\nprompt: {tokenizer.decode(g.prompt_ids)}")
        print(f"  {'response':<46} {'rm':>8} {'total':>8} {'vs ref':>7}")
        for r in g.response_ids:
            text = tokenizer.decode(r).strip()
            verdict = "win" if info["win"][row] else ("tie" if info["win_and"][row] else "loss")
            print(f"  {text[:46]:<46} {info['rm_score'][row]:>8.3f} {info['score'][row]:>8.3f} {verdict:>7}")
            row += 1
    wins, ties = sum(info["win"]), sum(info["win_and"])
    print(f"\noverall win rate vs reference: win={wins / row:.2f}  win_and (win or tie)={ties / row:.2f}  ({row} responses)")


def train_step_and_publish(server, model, tokenizer, trainer, seed: int, probe_ids) -> None:
    """Stage 4: one more BT step, publish into the running server, prove parity."""
    from verl_vllm_rm.client import VLLMRewardClient
    from verl_vllm_rm.hf_reference import sequence_scores
    from verl_vllm_rm.sync import RewardModelPublisher

    metrics = trainer.step(_encode_pairs(tokenizer, preference_pairs(32, seed=seed + 7)))
    client = VLLMRewardClient(server.url)

    async def version_and_scores():
        try:
            return await client.get_model_version(), await client.score_batch(probe_ids)
        finally:
            await client.close()

    before, _ = asyncio.run(version_and_scores())
    with RewardModelPublisher(server.url) as publisher:
        result = publisher.publish(model, version=before + 1, training_mode="full")
    after, served = asyncio.run(version_and_scores())
    reference = sequence_scores(model.eval(), probe_ids)
    diff = max(abs(a - b) for a, b in zip(served, reference))
    print(f"BT step: loss={metrics['rm/bt_loss']:.4f}; published {result.num_params} tensors "
          f"({result.num_bytes / 1e6:.1f} MB) in {result.seconds * 1000:.0f} ms")
    print(f"/runtime_version: {before} -> {after}")
    print(f"parity on {len(probe_ids)} probes: max |server - trainer| = {diff:.2e} "
          f"({'OK' if diff < 1e-4 else 'MISMATCH'})")
    if diff >= 1e-4:
        raise RuntimeError(f"server scores differ from the trainer's model by {diff:.2e} after the publish")


def main(workdir: str | None = None, train_seconds: float = 60.0, seed: int = 0) -> None:
    t_start = time.monotonic()
    work = Path(workdir or tempfile.mkdtemp(prefix="verl-vllm-rm-demo-"))
    say("1/5", "build a tiny reward model offline and train it on a synthetic preference task")
    model_path, model, tokenizer, trainer = train_tiny_rm(work, train_seconds, seed)
    say("2/5", "start the real vLLM reward server on it")
    server = start_server_with_progress(model_path)
    try:
        say("3/5", "score a GRPO batch (4 prompts x 4 responses) through verl's loader with vllm_rm")
        groups = demo_groups(tokenizer, seed)
        info = score_through_verl(server.url, model_path, tokenizer, groups)
        print_tables(tokenizer, groups, info)
        say("4/5", "one more RM training step, published into the running server")
        probes = [g.prompt_ids + r for g in groups for r in g.response_ids]
        train_step_and_publish(server, model, tokenizer, trainer, seed, probes)
    finally:
        say("5/5", "stop the server")
        server.stop()
    print(f"\ndone in {time.monotonic() - t_start:.0f} s; the tiny RMs and the server log stay in {work}.")
    print("Next: recipes/ for GPU runs, README 'Quick start on GPUs'.")
