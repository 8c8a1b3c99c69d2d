"""The trainer's LoRA side (``weight_sync.lora_wire``), no server: its merge matches peft's and leaves the trained
model alone, and a publisher's fallback to merged weights is warned once and offered at most twice."""

from __future__ import annotations

import copy
import logging
import re

import pytest
import torch
from log_records import messages_of
from sync_helpers import load_rm

from verl_vllm_rm.online.trainable import prepare_reward_model
from verl_vllm_rm.protocol.inventory import WeightUpdateRefused
from verl_vllm_rm.protocol.lora import LoraBases, merge_lora_weight
from verl_vllm_rm.protocol.names import normalize_name
from verl_vllm_rm.weight_sync.lora_wire import LoraWire, find_lora_modules, lora_scalings
from verl_vllm_rm.weight_sync.outgoing import Selection
from verl_vllm_rm.weight_sync.transfer import WeightSyncError


def test_lora_merge_matches_peft_and_leaves_the_model_alone(tiny_rm):
    model = prepare_reward_model(load_rm(tiny_rm), "lora", lora_rank=4, lora_alpha=16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state_dict = model.state_dict()
    modules = find_lora_modules(state_dict, lora_scalings(model))
    merged = {m.base: m.merged(state_dict) for m in modules}
    assert len(merged) == 14  # 7 linear layers x 2 decoder layers
    for m in modules:  # the trainer's merge is the one the server computes too, bit for bit
        assert torch.equal(merged[m.base], merge_lora_weight(state_dict[m.base], state_dict[m.lora_a],
                                                             state_dict[m.lora_b], m.scaling, torch.float32))
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    for base, tensor in merged.items():
        assert torch.allclose(tensor, reference[normalize_name(base)], atol=1e-6)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match=r"no LoRA scaling for 'base_model\.model\.model\.layers\.0\.mlp\.down_proj': "
                                         r"pass the PEFT model itself to publish\(\), or lora_scaling=alpha/r"):
        find_lora_modules(state_dict, None)


@pytest.fixture(scope="module")
def lora_state_dict(tiny_rm) -> dict[str, torch.Tensor]:
    """A PEFT LoRA model's state dict (rank 4 on every linear layer)."""
    return prepare_reward_model(load_rm(tiny_rm), "lora", lora_rank=4, lora_alpha=16).state_dict()


Q = "base_model.model.model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize("dropped, missing", [
    (f"{Q}.lora_B.default.weight", f"['{Q}.lora_B.default.weight']"),
    (f"{Q}.base_layer.weight", f"['{Q}.base_layer.weight']"),
], ids=["lora_B", "base weight"])
def test_a_lora_module_missing_a_tensor_is_refused_naming_it(lora_state_dict, dropped, missing):
    """A hand-filtered state dict that keeps a module's lora_A but drops its lora_B or base weight cannot be
    merged: refused before anything is sent, naming the tensor and asking for the whole state dict."""
    state_dict = {k: v for k, v in lora_state_dict.items() if k != dropped}
    with pytest.raises(ValueError, match=re.escape(
            f"LoRA module '{Q}' has '{Q}.lora_A.default.weight' but the state dict lacks {missing}: publish the "
            "PEFT model's whole state dict (each adapted module's base weight, lora_A and lora_B)")):
        find_lora_modules(state_dict, 4.0)


def test_dora_adapters_are_refused(tiny_rm):
    """DoRA rescales each merged column by its magnitude vector, which the plain ``W + s * B @ A`` merge would
    silently drop: a DoRA model (peft's own, ``use_dora=True``) is refused, naming the fix."""
    from peft import get_peft_model

    from verl_vllm_rm.online.trainable import lora_config

    base = load_rm(tiny_rm)
    config = lora_config(base, rank=4, alpha=16)
    config.use_dora = True
    model = get_peft_model(base, config)
    with pytest.raises(ValueError, match=re.escape(
            "DoRA adapters (lora_magnitude_vector) are not supported: train the adapters with "
            "LoraConfig(use_dora=False), or merge them yourself and publish in training_mode 'full'")):
        find_lora_modules(model.state_dict(), lora_scalings(model))


ADAPTERS = Selection([], {"model.layers.0.self_attn.q_proj": 2.0})
MERGED = Selection([], None, "its LoRA base store is unavailable: the copy failed")
LOG = logging.getLogger("test_lora.publisher")


class Server:
    """Stands in for a publisher's server: refuses the offers listed in ``refuse``, reports its store as ``bases``;
    records the plans made, the selections offered and the times its store was asked for."""

    def __init__(self, plans: list[Selection], refuse: tuple[int, ...] = (0,), bases: str = "unavailable",
                 error: Exception | None = None) -> None:
        self.plans, self.refuse, self.bases, self.error = list(plans), refuse, bases, error
        self.planned, self.offered, self.asked = 0, [], 0

    def plan(self) -> Selection:
        self.planned += 1
        return self.plans.pop(0)

    def announce(self, selection: Selection) -> str:
        self.offered.append(selection)
        if len(self.offered) - 1 in self.refuse:
            raise self.error or WeightUpdateRefused(f"refused offer {len(self.offered)}")
        return f"accepted offer {len(self.offered)}"

    def bases_now(self) -> LoraBases:
        self.asked += 1
        return LoraBases(self.bases, "host", reason=None if self.bases == "held" else "the copy failed")


def _offer(server: Server, wire: str = "auto", leader: bool = True):
    return LoraWire(wire, "http://rm", LOG).offer(server.plan, server.announce, server.bases_now, leader=leader)


def test_refused_adapters_are_offered_once_more_merged_with_one_warning(caplog):
    server = Server([ADAPTERS, MERGED])
    with caplog.at_level(logging.INFO, logger=LOG.name):
        assert _offer(server) == (MERGED, "accepted offer 2")
    assert (server.planned, server.offered, server.asked) == (2, [ADAPTERS, MERGED], 1)
    warnings = messages_of(caplog, LOG.name, logging.WARNING)
    assert warnings == ["http://rm cannot merge LoRA adapters (its LoRA base store is unavailable: the copy failed): "
                        "publishing merged weights instead; start the server with --weight-update-lora-bases "
                        "host|device (and room for the bases) to send only the adapters"]


def test_a_merged_offer_refused_again_is_raised_after_two_offers():
    server = Server([ADAPTERS, MERGED, MERGED], refuse=(0, 1))
    with pytest.raises(WeightUpdateRefused, match="^refused offer 2$"):
        _offer(server)
    assert (server.planned, len(server.offered), server.asked) == (2, 2, 1)


@pytest.mark.parametrize("wire, first, bases", [
    ("auto", ADAPTERS, "held"),  # the store is fine: the refusal was about something else
    ("adapters", ADAPTERS, "unavailable"),  # merged weights were ruled out
    ("auto", MERGED, "unavailable"),  # no adapters travelled: nothing to fall back from
], ids=["store held", "lora_wire adapters", "merged refused"])
def test_a_refusal_that_is_no_lost_store_is_raised_after_one_offer(wire, first, bases):
    server = Server([first, MERGED], bases=bases)
    with pytest.raises(WeightUpdateRefused, match="^refused offer 1$"):
        _offer(server, wire)
    assert (server.planned, len(server.offered)) == (1, 1)
    assert server.asked == (1 if wire == "auto" and first is ADAPTERS else 0)


def test_a_broken_transfer_is_not_answered_with_merged_weights():
    server = Server([ADAPTERS, MERGED], error=WeightSyncError("rank 0 failed: connection reset"))
    with pytest.raises(WeightSyncError, match="connection reset"):
        _offer(server)
    assert (server.planned, len(server.offered), server.asked) == (1, 1, 0)


def test_the_fallback_warns_once_per_reason_and_only_on_the_leader(caplog):
    wire = LoraWire("auto", "http://rm", LOG)
    with caplog.at_level(logging.INFO, logger=LOG.name):
        for reason in ("cap", "cap", "memory"):
            wire.warn(reason)
        assert wire.offer(lambda: MERGED, lambda s: "ok", lambda: LoraBases("held", "host"), leader=False)[1] == "ok"
    levels = [(r.levelname, r.getMessage().split("(")[1].split(")")[0]) for r in caplog.records
              if r.name == LOG.name]
    assert levels == [("WARNING", "cap"), ("INFO", "cap"), ("WARNING", "memory")]


def test_an_unknown_lora_wire_is_refused():
    with pytest.raises(ValueError, match=re.escape("lora_wire must be one of ['auto', 'adapters', 'merged'], "
                                                   "got 'both'")):
        LoraWire("both", "http://rm", LOG)
