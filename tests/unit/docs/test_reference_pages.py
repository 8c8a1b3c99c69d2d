"""docs/reference/ is generated (``verl-vllm-rm reference-docs``) and checked in: it must be what the generator
writes from the code now, every option field carries its meaning in the code, and ``--check`` names a stale page: the in-process tests (no server; those on the real server: tests/integration/docs/test_reference_pages.py)."""

from __future__ import annotations
import dataclasses
from dataclasses import dataclass
import pytest
from verl_vllm_rm.dev.reference_docs.pages import (ENTRY_SECTIONS, errors_page, section_homes)
from verl_vllm_rm.dev.reference_docs.raises import LiteralRaise
from verl_vllm_rm.dev.reference_docs.sections import field_meanings, options
from verl_vllm_rm.dev.reference_docs.server_flags import read_server_flags
from verl_vllm_rm.online.config import OnlineRMConfig
from verl_vllm_rm.replicas.launcher import SERVER_PYTHON_ENV
from verl_vllm_rm.scoring.options import ManagerOptions


#: every option section the configuration reference prints (and the classes of ``reward_models``' entries)
SECTIONS = [*section_homes(ManagerOptions, "reward_kwargs"), *section_homes(OnlineRMConfig, "online_rm"),
            *ENTRY_SECTIONS.values()]


def test_every_field_of_every_option_section_has_its_meaning():
    missing = [f"{cls.__name__}.{f.name}" for cls in SECTIONS for f in dataclasses.fields(cls)
               if f.init and not field_meanings(cls).get(f.name)]  # an inline section's field too: its docstring
    assert not missing, f"give each a docstring line right after the field (its meaning in the reference): {missing}"
    assert len(SECTIONS) >= 12, [c.__name__ for c in SECTIONS]  # the walk reached the nested sections


@dataclass
class _Documented:
    kept: int = 1
    """A meaning."""
    commented: int = 2  # a comment is not a meaning
    bare: str = "x"


def test_a_comment_or_nothing_is_no_meaning():
    assert field_meanings(_Documented) == {"kept": "A meaning."}


def test_allowed_values_come_from_literals_and_range_checks():
    by_key = {o.path: o for o in options(ManagerOptions)}
    assert by_key["input_format"].allowed == ("token_ids", "chat_template")
    assert by_key["alpha"].allowed == ("in [0, 1]",)  # ManagerOptions' own check_ranges
    assert by_key["connect_timeout_s"].allowed == ("> 0",)  # inherited from ClientOptions
    assert by_key["reference_source"].allowed == ()
    assert by_key["judge"].default == "null" and by_key["routes"].type == "list[section]"


def test_the_errors_page_lists_user_errors_by_room_and_leaves_internal_ones_out():
    def raised(path: str, where: str, template: str, internal: bool = False) -> LiteralRaise:
        return LiteralRaise(path, 1, (template,), internal, "ValueError", where, template)

    page = errors_page([raised("verl_vllm_rm/judge/options.py", "JudgeOptions.__post_init__",
                               "judge max_tokens must be > 0, got {max_tokens}"),
                        raised("verl_vllm_rm/judge/client.py", "f", "x vanished between the check and the use", True)])
    assert "## `judge` {#judge}" in page
    assert "- `ValueError` in `judge.options.JudgeOptions.__post_init__`\n  judge max\\_tokens must be > 0" in page
    assert "vanished" not in page


def test_reading_the_server_flags_fails_naming_the_interpreter(monkeypatch):
    monkeypatch.setenv(SERVER_PYTHON_ENV, "/bin/false")
    with pytest.raises(RuntimeError, match="reading the reward server's flags failed in /bin/false"):
        read_server_flags()
