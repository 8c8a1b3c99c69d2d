"""LoRA on the worker, without vLLM: the merge from the base store each time (computed again, bit for bit, for an
undo), the adapters' checks, the store's plan (quantized weights hold none) and what a staged update loads."""

from __future__ import annotations

import pytest
import torch
from lora_base_store import ATTN, SHAPES, attention_checkpoint, captured_store

from verl_vllm_rm.protocol.lora import adapter_name, merge_lora_weight
from verl_vllm_rm.server.weights.lora_bases import LoraBaseStore, PendingLoraBases
from verl_vllm_rm.server.weights.lora_merge import FromStore, LoraMerge, computed, merge_plan


def _adapters(seed: int, modules=(f"{ATTN}.q_proj", f"{ATTN}.o_proj"), r: int = 2, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    staged = []
    for module in modules:
        out, inp = SHAPES[f"{module}.weight"]
        staged += [(adapter_name(module, "A"), torch.randn(r, inp, generator=g).to(dtype)),
                   (adapter_name(module, "B"), (0.05 * torch.randn(out, r, generator=g)).to(dtype))]
    return staged, {m: 2.0 for m in modules}



def test_a_merge_yields_whole_groups_and_the_head():
    store, checkpoint = captured_store()
    staged, scaling = _adapters(1, modules=(f"{ATTN}.q_proj",))
    head = torch.randn(1, 16)
    merged = list(computed(merge_plan(store, [*staged, ("score.weight", head)], scaling)))
    names = [n for n, _ in merged]  # the qkv group's members together (in checkpoint order), then the head
    assert sorted(names[:-1]) + names[-1:] == [f"{ATTN}.k_proj.bias", f"{ATTN}.k_proj.weight", f"{ATTN}.q_proj.bias",
                                      f"{ATTN}.q_proj.weight", f"{ATTN}.v_proj.bias", f"{ATTN}.v_proj.weight",
                                      "score.weight"]
    out = dict(merged)
    a, b = staged[0][1], staged[1][1]
    assert torch.equal(out[f"{ATTN}.q_proj.weight"],
                       merge_lora_weight(checkpoint[f"{ATTN}.q_proj.weight"], a, b, 2.0, torch.float32))
    assert torch.equal(out[f"{ATTN}.k_proj.weight"], checkpoint[f"{ATTN}.k_proj.weight"])
    assert out["score.weight"] is head


def test_two_hundred_merges_end_exactly_at_a_fresh_merge_of_the_last_adapters():
    store, checkpoint = captured_store(torch.bfloat16)
    before = {n: t.clone() for n, t in store.tensors.items()}
    for seed in range(200):
        staged, scaling = _adapters(seed, dtype=torch.bfloat16)
        merged = dict(computed(merge_plan(store, staged, scaling)))
    for module in (f"{ATTN}.q_proj", f"{ATTN}.o_proj"):
        factors = dict(staged)
        fresh = merge_lora_weight(checkpoint[f"{module}.weight"].to(torch.bfloat16),
                                  factors[adapter_name(module, "A")], factors[adapter_name(module, "B")], 2.0,
                                  torch.bfloat16)
        assert torch.equal(merged[f"{module}.weight"], fresh)
    assert all(torch.equal(store.tensors[n], t) for n, t in before.items()), "a merge wrote into the store"


def test_a_merged_weight_is_computed_again_bit_for_bit_from_the_store_and_its_own_copy_of_the_factors():
    store, _ = captured_store(torch.bfloat16)
    staged, scaling = _adapters(3, modules=(f"{ATTN}.q_proj",), dtype=torch.bfloat16)
    plan = dict(merge_plan(store, staged, scaling))
    merged, sibling = plan[f"{ATTN}.q_proj.weight"], plan[f"{ATTN}.k_proj.weight"]
    assert isinstance(merged, FromStore) and isinstance(sibling, FromStore)
    first = merged()
    for _, tensor in staged:  # the next receive reuses the staged buffers
        tensor.zero_()
    assert torch.equal(merged(), first)
    assert merged.nbytes == sum(t.nbytes for _, t in staged) and sibling.nbytes == 0  # the factors, not the weight
    assert torch.equal(sibling(), store.tensors[f"{ATTN}.k_proj.weight"])
    assert sibling().data_ptr() != store.tensors[f"{ATTN}.k_proj.weight"].data_ptr()  # never the store itself


def _planned(quantization: str | None = None, place: str = "host") -> LoraMerge:
    lora = LoraMerge(loaded_at_ns=0)
    specs = [(n, t.shape, torch.float32) for n, t in attention_checkpoint().items()]
    lora.plan(place, torch.device("cpu"), {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}, specs, None,
              "not-a-local-dir", quantization)
    return lora


def test_quantized_weights_hold_no_store_and_the_plan_is_made_once():
    lora = _planned("fp8")
    assert lora.report() == {
        "state": "unavailable", "where": "host", "bytes": 0, "modules": [], "captured": False,
        "reason": "the server's weights are quantized (fp8): adapters cannot be merged into them without "
                  "re-quantizing"}
    assert _planned("fp8", place="off").report()["state"] == "off"
    lora.plan("host", torch.device("cpu"), {}, [], None, "not-a-local-dir", None)  # a later read plans nothing
    assert lora.report()["state"] == "unavailable"


def test_the_store_is_reported_planned_then_captured_once_on_a_thread_of_its_own():
    """The copy runs on its own thread (the engine's loop scores meanwhile): begun, it is under way until the read
    it makes returns; finished, the store is held, and a second begin reads nothing again."""
    import threading

    lora = _planned()
    assert isinstance(lora.bases, PendingLoraBases) and lora.report()["captured"] is False
    checkpoint, release = attention_checkpoint(), threading.Event()

    def slow_read():
        assert release.wait(30)
        return checkpoint.items()

    lora.begin_capture(slow_read)
    assert not lora.capture_done()  # the read waits: the copy is still under way, and begin_capture returned
    release.set()
    assert lora.finish_capture()["captured"] is True and lora.capture_done()
    store = lora.bases
    assert isinstance(store, LoraBaseStore)
    lora.begin_capture(lambda: pytest.fail("read again"))
    assert lora.finish_capture() == store.report().to_json()
    with pytest.raises(RuntimeError, match="reported only after the first inventory read"):
        LoraMerge(0).report()


def test_a_copy_that_fails_unforeseen_is_reported_unavailable_with_its_error():
    lora = _planned()

    def broken_read():
        raise KeyError("model.layers.0.self_attn.q_proj.weight")

    lora.begin_capture(broken_read)
    report = lora.finish_capture()
    assert (report["state"], report["reason"]) == (
        "unavailable", "holding the LoRA bases failed: KeyError: 'model.layers.0.self_attn.q_proj.weight'")


def test_adapters_that_are_not_finite_are_refused_naming_them():
    lora = LoraMerge(0)
    staged, scaling = _adapters(1, modules=(f"{ATTN}.q_proj",))
    staged[1] = (staged[1][0], torch.full_like(staged[1][1], float("nan")))
    lora.check_received(staged)  # no adapters expected: the update is loaded as sent
    lora.scaling = scaling
    with pytest.raises(ValueError, match=r"the update's LoRA adapters are not finite \(NaN or inf\) in "
                                         r"\['model.layers.0.self_attn.q_proj.lora_B.weight'\]; nothing was loaded"):
        lora.check_received(staged)
    lora.check_received(_adapters(2)[0])


def test_a_staged_update_loads_merged_groups_and_uses_its_scalings_up():
    lora, checkpoint = LoraMerge(0), attention_checkpoint()
    lora.bases, _ = captured_store()
    head = [("score.weight", torch.randn(1, 16))]
    assert lora.to_load(head, torch.device("cpu")) == (["score.weight"], head, {})  # no adapters: as sent
    staged, lora.scaling = _adapters(1, modules=(f"{ATTN}.q_proj",))
    names, weights, recipes = lora.to_load([*staged, *head], torch.device("cpu"))
    assert (names, lora.scaling) == ([f"{ATTN}.q_proj.weight", f"{ATTN}.q_proj.weight", "score.weight"], None)
    out = dict(weights)
    assert sorted(out) == sorted([*(n for n in SHAPES if n.split(".")[-2] in ("q_proj", "k_proj", "v_proj")),
                                  "score.weight"])
    assert sorted(recipes) == sorted(set(out) - {"score.weight"})  # what the store computes, kept for an undo
    assert all(torch.equal(recipe(), out[name]) for name, recipe in recipes.items())
    assert torch.equal(out[f"{ATTN}.q_proj.weight"], merge_lora_weight(
        checkpoint[f"{ATTN}.q_proj.weight"], staged[0][1], staged[1][1], 2.0, torch.float32))
    no_store = LoraMerge(0)
    no_store.scaling = {f"{ATTN}.q_proj": 2.0}
    with pytest.raises(RuntimeError, match="an update with LoRA adapters reached a worker without a LoRA base store"):
        no_store.to_load(staged, torch.device("cpu"))
