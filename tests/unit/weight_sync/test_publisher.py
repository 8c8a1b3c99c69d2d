"""``weight_sync.publisher`` without a server: a publisher used in ``with`` closes on the way out, and a close that
fails after an error is logged, never masking that error (the publish itself: tests/integration/weight_sync/)."""

from __future__ import annotations

import logging

import pytest
from log_records import messages_of

from verl_vllm_rm.weight_sync.publisher import ClosedOnExit


class Session(ClosedOnExit):
    """A publisher's ``with`` part alone: counts its closes; ``fail`` makes each close raise."""

    def __init__(self, fail: str | None = None) -> None:
        self.closes, self.fail = 0, fail

    def close(self) -> None:
        self.closes += 1
        if self.fail:
            raise ConnectionError(self.fail)


def test_a_publisher_in_with_is_closed_on_the_way_out():
    with Session() as session:
        assert session.closes == 0
    assert session.closes == 1


def test_a_failing_close_on_the_way_out_is_raised_when_nothing_else_was():
    with pytest.raises(ConnectionError, match="^server gone$"):
        with Session(fail="server gone"):
            pass


def test_a_failing_close_after_an_error_is_logged_and_the_error_raised(caplog):
    with caplog.at_level(logging.WARNING, logger="verl_vllm_rm.weight_sync.publisher"):
        with pytest.raises(KeyError, match="the first error"):
            with Session(fail="server gone") as session:
                raise KeyError("the first error")
    assert session.closes == 1
    assert messages_of(caplog, "verl_vllm_rm.weight_sync.publisher") == [
        "closing the weight-sync session(s) after an error failed too: server gone"]
