"""``make demo``: the whole loop on CPU, stage by stage.

1. Train a tiny RM offline on a preference task (small sums, good vs bad answers).
2. Serve it with the real vLLM engine (``python -m verl_vllm_rm.server``).
3. Run verl's own ``main_ppo`` GRPO with ``reward.reward_manager.name=vllm_rm``: the reward is the RM's
   score composed with gsm8k correctness and an answer-form rule; after every PPO step one RM training
   step on the run's own rollouts is published into the running server and parity-checked; validation
   before and after reports the pairwise win rate against reference answers.
4. The summary table, and the run's report (``verl-vllm-rm report``): reward components, RM health and the
   reward-hacking alarms over the steps, as a PNG and a short text.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path


RM_RANKS = 2  # the online RM's ranks: verl's FSDP engine shards its weights, gradients and optimizer over them


def say(stage: str, text: str) -> None:
    print(f"\n=== {stage} === {text}", flush=True)


def main(workdir: str | None = None, train_seconds: float = 60.0, seed: int = 0, steps: int = 10,
         online: str = "lora") -> dict:
    from verl_vllm_rm.dev.ppo_report import print_summary
    from verl_vllm_rm.dev.tiny_ppo import FORM_WEIGHT, TinyPPOConfig, run_tiny_ppo
    from verl_vllm_rm.dev.tiny_task import train_tiny_rm

    t_start = time.monotonic()
    work = Path(workdir or tempfile.mkdtemp(prefix="verl-vllm-rm-demo-"))
    say("1/4", "build a tiny reward model offline and train it on a synthetic preference task")
    rm = train_tiny_rm(work, train_seconds, seed)
    say("2/4", f"serve it with the real vLLM engine, then run verl's main_ppo GRPO for {steps} steps with "
               f"reward.reward_manager.name=vllm_rm")
    print(f"reward = RM score + gsm8k correctness + {FORM_WEIGHT:g} * answer form; after each PPO step the RM "
          f"trains one step ({online}, on verl's training engine sharded over {RM_RANKS} ranks) on the run's "
          "rollouts and is published into the server (parity checked)")
    print(f"(first step includes Ray start-up and warm-up; log: {work / 'main_ppo.log'})", flush=True)
    cfg = TinyPPOConfig(work, steps=steps, rm=str(rm), online=online, seed=seed, batch_prompts=8,
                        extra_overrides=["actor_rollout_ref.actor.optim.lr=5e-4", f"+online_rm.num_workers={RM_RANKS}"])
    summary = run_tiny_ppo(cfg)
    say("3/4", "what verl trained on, step by step")
    print_summary(summary)
    say("4/4", "what happened")
    first, last = summary["steps"][0], summary["steps"][-1]
    print(f"reward per sample: {first['reward_mean']:+.3f} at step 1 -> {last['reward_mean']:+.3f} at step "
          f"{last['step']}; the RM server went from version 0 to {last['rm_version']}, one publish per step, "
          f"each matching the trainer's RM within {max(s['parity_max_abs'] or 0 for s in summary['steps']):.1e}")
    print(f"\nthe run's report ({summary['plot']}; again with `verl-vllm-rm report {work}`):")
    print(Path(summary["report"]).read_text().rstrip())
    print(f"\ndone in {time.monotonic() - t_start:.0f} s; everything stays in {work}.")
    print("Try your own RM: verl-vllm-rm tiny-ppo --rm DIR; GPU runs: recipes/ and docs/quickstart.md, 'On GPUs'.")
    return summary
