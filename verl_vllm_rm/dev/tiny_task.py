"""The tiny task everything on CPU runs on: small sums, answered well or badly.

Prompts ask for a small sum. The preferred answer reasons in a ``<think>`` block,
states the correct result and ends with gsm8k's ``#### N`` (so verl's own gsm8k
``compute_score`` grades it); rejected answers get the arithmetic wrong, skip the
think block, or ramble (without a think block, so that no rejected style shares the preferred
answer's first token but the wrong sum). The tiny RM learns this preference in about a minute on
CPU (:func:`train_tiny_rm`), a tiny policy is pre-trained on a mix of all four
styles (:mod:`verl_vllm_rm.dev.tiny_policy`), and GRPO with the RM then moves the
policy towards the preferred style within a few steps.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

DATA_SOURCE = "openai/gsm8k"  # verl's default_compute_score grades "#### N" answers for this source
#: verl's DAPO scorer (``{score, acc, pred}``), which wants "Answer: N": the tiny policy never writes it, so its
#: groups' ``acc`` is uniform (False) and DAPO's filter (``algorithm.filter_groups``) evicts every one of them
MATH_DAPO = "math_dapo"
MAX_OPERAND = 20


@dataclass(frozen=True)
class Pair:
    prompt: str
    chosen: str
    rejected: str


def question(a: int, b: int) -> str:
    return f"What is {a} + {b}? Please compute the sum."


def good_answer(a: int, b: int) -> str:
    return f" <think>add {a} and {b}</think> The answer is {a + b}. #### {a + b}"


def bad_answers(a: int, b: int, rng: random.Random) -> list[str]:
    wrong = a + b + rng.choice([-3, -2, -1, 1, 2, 3, 10])
    return [
        f" <think>add {a} and {b}</think> The answer is {wrong}. #### {wrong}",
        f" The answer is {a + b}.",
        f" {'so ' * rng.randint(4, 10)}so so so so so",
    ]


def all_answers(a: int, b: int, rng: random.Random) -> list[str]:
    return [good_answer(a, b), *bad_answers(a, b, rng)]


def preference_pairs(n: int, seed: int = 0, max_operand: int = MAX_OPERAND) -> list[Pair]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        pairs.append(Pair(question(a, b), good_answer(a, b), rng.choice(bad_answers(a, b, rng))))
    return pairs


def write_dataset(out_dir: str | Path, n_train: int = 64, n_val: int = 8, seed: int = 0,
                  math_dapo_every: int = 0) -> tuple[Path, Path]:
    """``train.parquet`` and ``val.parquet`` in verl's RLHF format.

    Each row: the chat in ``prompt``, gsm8k's ``ground_truth`` (the sum) for the
    verifiable reward, and the preferred answer in ``extra_info.reference`` for the
    pairwise validation (``reference_source=extra_info:reference``). ``math_dapo_every``:
    every such row (from the first) is a ``math_dapo`` one (mixed data sources; 0: none).
    """
    import pandas as pd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    paths = []
    for split, n in (("train", n_train), ("val", n_val)):
        rows = []
        for index in range(n):
            a, b = rng.randint(0, MAX_OPERAND), rng.randint(0, MAX_OPERAND)
            rows.append({
                "data_source": MATH_DAPO if math_dapo_every and index % math_dapo_every == 0 else DATA_SOURCE,
                "prompt": [{"role": "user", "content": question(a, b)}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": split, "index": index, "reference": good_answer(a, b)},
            })
        path = out / f"{split}.parquet"
        pd.DataFrame(rows).to_parquet(path)
        paths.append(path)
    return paths[0], paths[1]


def encode_pairs(tokenizer, pairs: list[Pair]):
    from verl_vllm_rm.dev.offline_bt import collate_pairs

    return collate_pairs(
        [tokenizer(p.prompt + p.chosen).input_ids for p in pairs],
        [tokenizer(p.prompt + p.rejected).input_ids for p in pairs],
        tokenizer.pad_token_id,
    )


def pair_accuracy(model, batch) -> float:
    import torch

    from verl_vllm_rm.dev.offline_bt import sequence_rewards

    with torch.no_grad():
        chosen = sequence_rewards(model, batch.chosen_ids, batch.chosen_mask)
        rejected = sequence_rewards(model, batch.rejected_ids, batch.rejected_mask)
    return float((chosen > rejected).float().mean())


def train_tiny_rm(workdir: str | Path, seconds: float = 60.0, seed: int = 0) -> Path:
    """Build the tiny RM and train it (Bradley-Terry, full) on the preference task for ``seconds``.

    Returns the trained checkpoint's directory (``workdir/tiny-rm-trained``); prints the
    held-out preference accuracy before and after.
    """
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from verl_vllm_rm.dev.offline_bt import OfflineBradleyTerry
    from verl_vllm_rm.dev.tiny_rm import build_tiny_rm
    from verl_vllm_rm.online.trainable import prepare_reward_model

    work = Path(workdir)
    base = build_tiny_rm(work / "tiny-rm-base")
    tokenizer = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(seed)
    model = prepare_reward_model(AutoModelForSequenceClassification.from_pretrained(base, dtype=torch.float32), "full")
    held_out = encode_pairs(tokenizer, preference_pairs(256, seed=seed + 1000))
    before = pair_accuracy(model, held_out)
    trainer = OfflineBradleyTerry(model, lr=1e-3)
    pairs = preference_pairs(100_000, seed=seed)
    t0, step = time.monotonic(), 0
    with tqdm(total=int(seconds), desc="training the tiny RM", unit="s") as bar:
        while time.monotonic() - t0 < seconds and (step + 1) * 32 <= len(pairs):
            metrics = trainer.step(encode_pairs(tokenizer, pairs[step * 32: (step + 1) * 32]))
            step += 1
            bar.n = min(int(time.monotonic() - t0), int(seconds))
            bar.set_postfix(step=step, loss=f"{metrics['rm/bt_loss']:.3f}")
    after = pair_accuracy(model, held_out)
    out = work / "tiny-rm-trained"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"held-out preference accuracy: {before:.2f} before -> {after:.2f} after {step} BT steps")
    return out
