"""The server's ``--model`` path check on a raw command line, before vLLM parses it: the in-process tests (the
server process that says it without importing vLLM: tests/integration/server/test_model_path.py)."""

from __future__ import annotations

import pytest

from verl_vllm_rm.server.model_path import check_model_argument, check_model_path


@pytest.mark.parametrize("spelling", [["--model", "{missing}"], ["--model={missing}"]])
def test_a_missing_path_is_refused_in_either_spelling(tmp_path, spelling):
    missing = tmp_path / "no-such-rm"
    argv = ["--port", "9", *(a.format(missing=missing) for a in spelling), "--enforce-eager"]
    with pytest.raises(SystemExit, match=rf"^verl-vllm-rm: --model {missing} does not exist: give the folder of a "
                                         r"local checkpoint \(with its config.json\), or a hub model id$"):
        check_model_argument(argv)


@pytest.mark.parametrize("model", ["./no-such-rm", "../no-such-rm", "~/no-such-rm-of-this-test"])
def test_relative_and_home_paths_are_paths(tmp_path, monkeypatch, model):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(SystemExit, match=f"--model {model} does not exist"):
        check_model_path(model)


def test_the_last_model_is_the_one_checked_as_vllms_parser_takes_it(tmp_path):
    missing = tmp_path / "no-such-rm"
    check_model_argument(["--model", str(missing), "--model", str(tmp_path)])
    with pytest.raises(SystemExit, match=f"--model {missing} does not exist"):
        check_model_argument([f"--model={tmp_path}", "--model", str(missing)])


def test_an_existing_path_a_hub_id_and_no_model_pass(tmp_path):
    check_model_argument(["--model", str(tmp_path)])
    check_model_argument(["--model", "Skywork/Skywork-Reward-V2-Llama-3.1-8B"])  # a hub id: vLLM resolves it
    check_model_argument(["--port", "9"])  # vLLM's parser says what is missing
    check_model_argument(["--model"])  # the same
