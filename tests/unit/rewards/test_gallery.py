"""The rm-gallery adapter: rewards by name, clear errors, and judges that fail loudly.

rm-gallery is required here (CI installs it): these tests fail, never skip, without it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from rm_gallery.core.data.schema import DataOutput, DataSample, Step
from rm_gallery.core.model.message import ChatMessage, MessageRole

from verl_vllm_rm.rewards import (
    GalleryReward,
    GalleryRewardError,
    RewardConfig,
    build_gallery_rewards,
    compute_rule_rewards,
    gallery_reward_names,
)
from repo_paths import REPO



def judge_params(base_url: str) -> dict:
    # No client retries: the unreachable case then fails in well under a second.
    return {"llm": {"model": "judge", "base_url": base_url, "openai_api_key": "test-key", "max_retries": 0},
            "max_retries": 1}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rule_rewards_by_name():
    formatted = GalleryReward("reasoning_format")(["<think>a</think><answer>b</answer>", "<think>a</think>"])
    np.testing.assert_array_equal(formatted, [1.0, 0.0])
    length = GalleryReward("length_penalty", {"min_length": 3, "max_length": 5, "penalty_rate": 1.0})
    np.testing.assert_array_equal(length(["ab", "abcd", "abcdefg", ""]), [-1.0, 0.0, -2.0, -3.0])
    accuracy = GalleryReward("accuracy")
    np.testing.assert_array_equal(accuracy(["42", " 42 ", "41"], references=["42", "42", "42"]), [1.0, 1.0, 0.0])


def test_gallery_component_through_the_config():
    config = RewardConfig.from_dict({
        "components": ["gallery:length_penalty", "gallery:reasoning_format"],
        "gallery": {"length_penalty": {"min_length": 0, "max_length": 4, "penalty_rate": 0.5}},
    })
    adapters = build_gallery_rewards(config)
    texts = ["<think>x</think><answer>y</answer>", "abc"]
    ids = np.zeros((2, 3), dtype=np.int64)
    values = compute_rule_rewards(config, ids, [3, 3], texts, gallery=adapters)
    assert list(values) == ["gallery:length_penalty", "gallery:reasoning_format"]
    np.testing.assert_array_equal(values["gallery:length_penalty"], [-(len(texts[0]) - 4) * 0.5, 0.0])
    np.testing.assert_array_equal(values["gallery:reasoning_format"], [1.0, 0.0])
    with pytest.raises(ValueError, match=r"no adapter for 'gallery:length_penalty': build them once with "
                                         r"build_gallery_rewards\(config\) and pass them as gallery="):
        compute_rule_rewards(config, ids, [3, 3], texts)


def test_unknown_name_lists_the_valid_names():
    with pytest.raises(ValueError, match="unknown rm-gallery reward 'no_such_reward'") as err:
        GalleryReward("no_such_reward")
    names = gallery_reward_names()
    assert len(names) >= 30 and {"reasoning_format", "length_penalty", "ngram_repetition_penalty"} <= set(names)
    assert all(name in str(err.value) for name in names)


def test_listwise_rewards_are_refused_with_the_pointwise_names():
    with pytest.raises(ValueError, match="ranks several responses at once") as err:
        GalleryReward("safety_listwise_reward")
    assert "reasoning_format" in str(err.value) and "safety_listwise_reward" not in str(err.value).split("rewards:")[-1]


def test_unknown_parameter_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"'gallery:length_penalty' has no parameter\(s\) \['min_len'\]; valid: "
                                         r".*min_length"):
        GalleryReward("length_penalty", {"min_len": 3})


def test_judge_without_llm_settings_or_prompts_is_an_error():
    with pytest.raises(ValueError, match="is an LLM judge: give params.llm"):
        GalleryReward("base_helpfulness_pointwise")
    judge = GalleryReward("base_helpfulness_pointwise", judge_params(f"http://127.0.0.1:{closed_port()}/v1"))
    with pytest.raises(ValueError, match="'gallery:base_helpfulness_pointwise' is an LLM judge and needs the prompts"):
        judge(["hello"])


def test_unreachable_judge_raises_instead_of_scoring_zero():
    judge = GalleryReward("base_helpfulness_pointwise", judge_params(f"http://127.0.0.1:{closed_port()}/v1"))
    # What rm-gallery itself does with the same judge: a 0.0 score, no exception.
    sample = DataSample(unique_id="0", input=[ChatMessage(role=MessageRole.USER, content="Hi?")],
                        output=[DataOutput(answer=Step(role=MessageRole.ASSISTANT, content="Hello."))])
    assert judge.reward.evaluate(sample).output[0].answer.reward.score == 0.0
    with pytest.raises(GalleryRewardError, match=r"gave no score for response 0: Connection error.*127\.0\.0\.1"):
        judge(["Hello.", "Hi there."], prompts=["Hi?", "Hi?"])


class _JudgeHandler(BaseHTTPRequestHandler):
    """A stand-in OpenAI-compatible judge on 127.0.0.1 that reports one violated rubric."""

    def do_POST(self) -> None:  # noqa: N802 (http.server naming)
        self.rfile.read(int(self.headers["Content-Length"]))
        content = "<think>checked</think>\n<violation>['Inquiring for More Information']</violation>"
        body = json.dumps({
            "id": "cmpl-0", "object": "chat.completion", "created": 0, "model": "judge",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_reachable_judge_scores_every_response():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _JudgeHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        judge = GalleryReward("base_helpfulness_pointwise", judge_params(f"http://127.0.0.1:{server.server_port}/v1"))
        scores = judge(["a", "b", "c"], prompts=["q1", "q2", "q3"])
    finally:
        server.shutdown()
        server.server_close()
    # one violated rubric out of rm-gallery's three helpfulness rubrics
    np.testing.assert_allclose(scores, [2 / 3] * 3)


def test_missing_rm_gallery_gives_the_install_commands():
    code = ("import sys; sys.modules['rm_gallery'] = None\n"  # makes `import rm_gallery` fail, as when absent
            "from verl_vllm_rm.rewards import GalleryReward\nGalleryReward('reasoning_format')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "pip install --no-deps rm-gallery==0.1.7" in proc.stderr
    assert "pip install -r requirements/gallery.txt" in proc.stderr
    assert "(import failed: No module named 'rm_gallery.core'" in proc.stderr  # the cause, kept
    first_line = (REPO / "requirements" / "gallery.txt").read_text().splitlines()[0]
    assert first_line.startswith("#") and "--no-deps rm-gallery==0.1.7" in first_line


def test_building_a_gallery_reward_leaves_the_hosts_logging_alone(tmp_path):
    """rm-gallery's import would remove the host's loguru handlers and write ./log/rm_gallery.log."""
    code = ("from loguru import logger\nseen = []\nlogger.add(seen.append, format='{message}')\n"
            "from verl_vllm_rm.rewards import GalleryReward\nGalleryReward('reasoning_format')\n"
            "logger.info('host message')\nassert seen == ['host message\\n'], seen\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []  # no ./log directory
