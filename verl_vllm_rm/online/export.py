"""The trained RM out of verl's checkpoint of its engine, as the ``*ForSequenceClassification`` it started as.

verl saves each rank's shards (``model_world_size_N_rank_K.pt``, FSDP2 DTensors); its own merger
(``python -m verl.model_merger``) knows causal LMs and token classifiers only and casts to bf16. Here
the shards are joined in their own dtype (fp32 masters) and loaded into the RM's architecture, a LoRA
run's adapters merged, so the result serves and scores like the trainer's model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

RM_STATE_FILE = "rm_state.json"  # beside the engine's own checkpoint files: what the RM run was


def merged_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every rank's shards of verl's FSDP checkpoint in ``folder`` joined into whole tensors."""
    folder = Path(folder)
    world = json.loads((folder / "fsdp_config.json").read_text())["world_size"]
    shards = [torch.load(folder / f"model_world_size_{world}_rank_{rank}.pt", map_location="cpu", weights_only=False)
              for rank in range(world)]
    merged = {}
    for name, first in shards[0].items():
        if not hasattr(first, "placements"):
            merged[name] = first
            continue
        (placement,) = first.placements  # FSDP2 shards over one mesh dimension
        locals_ = [shard[name]._local_tensor for shard in shards]
        merged[name] = torch.cat(locals_, dim=placement.dim) if placement.is_shard() else locals_[0]
    return merged


def rm_run_state(folder: str | Path) -> dict[str, Any]:
    """What the RM run saved beside its engine checkpoint in ``folder`` (:func:`write_rm_run_state`)."""
    return json.loads((Path(folder) / RM_STATE_FILE).read_text())


def write_rm_run_state(folder: str | Path, state: dict[str, Any]) -> None:
    """Save ``state`` in ``folder``; a crash mid-write never leaves a truncated file."""
    target = Path(folder) / RM_STATE_FILE
    staged = target.with_name(f"{RM_STATE_FILE}.tmp")
    staged.write_text(json.dumps(state))
    staged.replace(target)


def load_trained_rm(folder: str | Path) -> torch.nn.Module:
    """The RM of the checkpoint ``folder`` (an ``online_rm`` folder of a verl run) as a sequence classifier in
    eval mode (fp32)."""
    from transformers import AutoModelForSequenceClassification

    from verl_vllm_rm.online.trainable import prepare_reward_model

    state = rm_run_state(folder)
    model = AutoModelForSequenceClassification.from_pretrained(state["model_path"], dtype=torch.float32)
    lora = state["training_mode"] == "lora"
    if lora:
        model = prepare_reward_model(model, "lora", lora_rank=state["lora_rank"], lora_alpha=state["lora_alpha"],
                                     lora_target_modules=state["target_modules"])
    missing, unexpected = model.load_state_dict(merged_state_dict(folder), strict=False)
    if missing or unexpected:
        raise ValueError(f"the checkpoint at {folder} does not fit its RM {state['model_path']}: missing "
                         f"{missing[:4]}, unexpected {unexpected[:4]}. The RM is rebuilt from model_path in "
                         f"{RM_STATE_FILE} (the run's online_rm.model_path): put the model the run started from "
                         "back there, or set model_path to where it is now")
    return (model.merge_and_unload() if lora else model).eval()


def export_trained_rm(folder: str | Path, out_dir: str | Path) -> Path:
    """Write the checkpoint's RM (and its tokenizer) to ``out_dir`` as a Hugging Face model a server can load."""
    from transformers import AutoTokenizer

    model = load_trained_rm(folder)
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(rm_run_state(folder)["model_path"]).save_pretrained(out)
    return out
