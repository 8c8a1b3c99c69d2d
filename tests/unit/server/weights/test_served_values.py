"""What a worker serves in checkpoint format (the values a failed reload is undone from), without vLLM: the weight
files for what no update replaced, the kept copies of what one did, the cap, and why an undo cannot be had."""

from __future__ import annotations

import os
import time

import torch

from verl_vllm_rm.server.weights.served_values import ServedValues

FILES = {"a.weight": torch.arange(4.0), "b.weight": torch.arange(8.0), "score.weight": torch.ones(2)}


def _served(max_bytes: int | None = None, model_dir: str = "not-a-local-dir", reads: list | None = None):
    def read():
        if reads is not None:
            reads.append(1)
        return iter(FILES.items())

    return ServedValues(read, model_dir, time.time_ns(), max_bytes)


def _reload(served: ServedValues, update: dict[str, torch.Tensor], succeed: bool = True) -> None:
    assert [n for n, _ in served.keeping(update.items())] == list(update)
    served.adopt() if succeed else served.drop()


def test_what_no_update_replaced_is_read_from_the_files_only_when_an_undo_needs_it():
    reads: list = []
    served = _served(reads=reads)
    assert served.why_not(FILES) is None and reads == []
    assert dict(served.values(["a.weight", "score.weight"])) == {"a.weight": FILES["a.weight"],
                                                               "score.weight": FILES["score.weight"]}
    assert reads == [1]


def test_a_successful_reload_keeps_host_copies_of_what_it_loaded_and_a_failed_one_keeps_nothing():
    served = _served()
    new = torch.full((2,), 7.0)
    _reload(served, {"score.weight": new}, succeed=False)
    assert served.kept == {} and torch.equal(dict(served.values(["score.weight"]))["score.weight"], torch.ones(2))
    _reload(served, {"score.weight": new})
    kept = dict(served.values(["score.weight", "a.weight"]))
    assert torch.equal(kept["score.weight"], new) and kept["score.weight"] is not new  # a copy
    new.zero_()  # the staging buffer is reused by the next receive: the kept value does not change
    assert torch.equal(served.kept["score.weight"], torch.full((2,), 7.0))


def test_a_reload_reports_the_copies_it_held_the_replaced_ones_until_it_succeeds():
    served = _served()
    _reload(served, {"score.weight": torch.zeros(2), "a.weight": torch.zeros(4)})
    assert served.reload_nbytes == served.nbytes == 2 * 4 + 4 * 4  # a first update: its own copies only
    _reload(served, {"a.weight": torch.ones(4), "b.weight": torch.ones(8)})
    # the old a.weight stays kept until the reload succeeds (its undo needs it): both copies of it were held
    assert served.reload_nbytes == 24 + (4 + 8) * 4 and served.nbytes == (2 + 4 + 8) * 4
    _reload(served, {"a.weight": torch.zeros(4)}, succeed=False)
    assert served.reload_nbytes == 56 + 4 * 4 and served.nbytes == 56  # a failed one held its copy until dropped


def test_past_the_cap_a_replaced_weight_is_unknown_and_its_undo_cannot_be_had():
    served = _served(max_bytes=2 * 4 + 4 * 4)  # the head and a.weight fit, b.weight does not
    _reload(served, {"score.weight": torch.zeros(2), "a.weight": torch.zeros(4), "b.weight": torch.zeros(8)})
    assert set(served.kept) == {"score.weight", "a.weight"} and served.unknown == {"b.weight"}
    assert served.why_not(["score.weight", "a.weight"]) is None
    assert served.why_not(["a.weight", "b.weight"]) == (
        "the served values of 1 of them (e.g. b.weight) were not kept, over --weight-update-rollback-max-bytes 24")
    # a kept value being replaced frees its room: the same sizes fit again, and b.weight is known once it fits
    _reload(served, {"b.weight": torch.ones(8)})
    assert served.why_not(["b.weight"]) is not None  # 24 bytes held, 32 more do not fit
    served.max_bytes = None
    _reload(served, {"b.weight": torch.ones(8)})
    assert served.why_not(["a.weight", "b.weight"]) is None and served.unknown == set()


def test_a_weight_whose_undo_failed_is_unknown_until_a_reload_loads_it_again():
    served = _served()
    _reload(served, {"a.weight": torch.zeros(4)})
    served.forget(["a.weight", "b.weight"])
    assert served.kept == {} and served.unknown == {"a.weight", "b.weight"}
    _reload(served, {"a.weight": torch.ones(4), "b.weight": torch.ones(8)})
    assert served.unknown == set()


def test_weight_files_rewritten_after_the_load_cannot_give_the_served_values(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x")
    served = ServedValues(lambda: iter(FILES.items()), str(tmp_path), time.time_ns(), None)
    assert served.why_not(["a.weight"]) is None
    later = time.time_ns() + 10**9
    os.utime(tmp_path / "model.safetensors", ns=(later, later))
    assert served.why_not(["a.weight"]) == (
        f"the weight files ['model.safetensors'] in {tmp_path} changed after the server loaded them, so the values "
        "it serves are not on disk any more")
    _reload(served, {"a.weight": torch.zeros(4)})
    assert served.why_not(["a.weight"]) is None  # kept: the files are not needed


class _Merge:
    """A recipe: a tensor computed again at each call (as lora_merge.FromStore), holding ``nbytes``."""

    def __init__(self, value: float, nbytes: int) -> None:
        self.value, self.nbytes, self.calls = value, nbytes, 0

    def __call__(self) -> torch.Tensor:
        self.calls += 1
        return torch.full((8,), self.value)


def test_a_weight_with_a_recipe_keeps_the_recipe_not_a_copy_and_is_computed_again_for_an_undo():
    served = _served(max_bytes=8)
    merge = _Merge(3.0, nbytes=8)  # the factors: 8 bytes, where a copy of the merged weight would take 32
    assert [n for n, _ in served.keeping([("b.weight", torch.full((8,), 3.0))], {"b.weight": merge})] == ["b.weight"]
    served.adopt()
    assert served.kept == {"b.weight": merge} and served.nbytes == 8 and merge.calls == 0
    assert torch.equal(dict(served.values(["b.weight"]))["b.weight"], torch.full((8,), 3.0)) and merge.calls == 1
