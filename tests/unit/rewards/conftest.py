"""Shared data for the rule-reward tests: a corpus of responses, token-batch helpers and rm-gallery's own scores."""

from __future__ import annotations

import random

import numpy as np
import pytest


def pad_rows(rows: list[list[int]], pad: int = 0, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad token rows into ``(ids [B, width], lengths [B])``."""
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    width = max([*lengths.tolist(), 1]) if width is None else width
    ids = np.full((len(rows), width), pad, dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    return ids, lengths


def _build_corpus() -> list[str]:
    """Hand-made edge cases plus generated responses with varied structure and repetition."""
    corpus = [
        "",
        "   ",
        "short",
        "<think>reason</think><answer>42</answer>",
        "<think></think><answer></answer>",
        "<think>only thinking, never answers",
        "<think>closed</think> but the answer is untagged",
        "<answer>answer first</answer> then <think>thinking</think>",
        "<think>outer <answer>nested</answer> still thinking</think>",
        "no tags at all, just a plain answer that is long enough",
        "<think>数学推理：二加二等于四。</think><answer>四 🎉</answer>",
        "Ünïcödé wörds ünïcödé wörds ünïcödé wörds ünïcödé wörds ünïcödé wörds",
        "the the the the the the the the the the the the the the the the",
        "a b c d e a b c d e a b c d e a b c d e a b c d e a b c d e",
        "One two three four five six seven eight nine ten eleven twelve",
        "ONE one One oNe one ONE one One oNe one ONE one One oNe one",
        "x" * 1005,
        "word " * 250,
        "<think>" + "loop again " * 40 + "</think><answer>done</answer>",
        "\n\t<think>\nlines\n</think>\n\n<answer>\nyes\n</answer>\n",
    ]
    rng = random.Random(1234)
    vocab = [f"w{i}" for i in range(40)] + ["ß", "ça", "日本", "🙂", "x̃"]
    for _ in range(60):
        words = [rng.choice(vocab[: rng.randint(3, len(vocab))]) for _ in range(rng.randint(0, 300))]
        body = " ".join(words)
        shape = rng.randrange(5)
        if shape == 0:
            body = f"<think>{body}</think> <answer>{rng.choice(vocab)}</answer>"
        elif shape == 1:
            body = f"<think>{body}"
        elif shape == 2:
            body = f"{body}</think><answer>{rng.choice(vocab)}</answer>"
        elif shape == 3:
            body = " ".join([body] * rng.randint(1, 4))
        corpus.append(body)
    return corpus


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    return _build_corpus()


@pytest.fixture(scope="session")
def padded():
    """The ``pad_rows`` helper, as a fixture (test modules cannot import conftest reliably)."""
    return pad_rows


@pytest.fixture(scope="session")
def word_tokenizer():
    """A local Hugging Face tokenizer (one token per word) with ``<think>``/``</think>`` as added tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "[PAD]", "a", "b", "c", "answer", "the"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")
    tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    return tok


@pytest.fixture(scope="session")
def gallery_results():
    """``gallery_results(name, texts, **params)``: (score, extra_data) per text from rm-gallery's reward ``name``,
    to hold ours against (rm-gallery is required here, as CI installs it: these tests fail, never skip, without it)."""
    from rm_gallery.core.data.schema import DataOutput, DataSample, Step
    from rm_gallery.core.model.message import MessageRole
    from rm_gallery.core.reward.registry import RewardRegistry

    def results(name: str, texts: list[str], **params) -> list[tuple[float, dict]]:
        reward = RewardRegistry.get(name)(**params)
        out = []
        for i, text in enumerate(texts):
            answer = Step(role=MessageRole.ASSISTANT, content=text)
            sample = DataSample(unique_id=str(i), output=[DataOutput(answer=answer)])
            answer = reward.evaluate(sample).output[0].answer
            out.append((answer.reward.score, answer.additional_kwargs[reward.name]))
        return out

    return results
