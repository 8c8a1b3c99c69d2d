"""The ``rubric`` component under a rubric template (principles around prompt and response): the in-process tests (no server; those on the real server: tests/integration/scoring/test_manager_rubric.py)."""

from __future__ import annotations

import pytest
from verl_vllm_rm.scoring.options import ConfigError


@pytest.mark.parametrize(
    "template,needle",
    [("'{prompt} only'", "exactly one {response}"), ("'{prompt} {response} {style}'", "found fields"),
     ("'{response}'", "must use {prompt}")],
)
def test_bad_rubric_templates_are_config_errors(load_manager, verl_config, tokenizer, template, needle):
    with pytest.raises(ConfigError, match="rubric_template") as err:
        load_manager(verl_config("http://127.0.0.1:1", rubric_template=template), tokenizer)
    assert needle in str(err.value)
