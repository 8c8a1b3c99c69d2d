"""The server's ``--model`` path check, made before vLLM is imported.

A path that is not there is said at once: the server's full argument handling needs vLLM's parser, and importing
vLLM costs ~10 s of CPU before anything could be refused (a managed replica with a mistyped path otherwise holds
a run's set-up that long, per replica)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from verl_vllm_rm.protocol.command_line import flag_value


def check_model_path(model: str) -> None:
    """A ``--model`` written as a path must exist: vLLM would otherwise take it for a hub id and fail with
    transformers' "Repo id must be in the form ..." (the cause nowhere in it)."""
    if model.startswith(("/", "./", "../", "~")) and not os.path.exists(os.path.expanduser(model)):
        raise SystemExit(f"verl-vllm-rm: --model {model} does not exist: give the folder of a local checkpoint (with "
                         "its config.json), or a hub model id")


def check_model_argument(argv: Sequence[str]) -> None:
    """:func:`check_model_path` on the ``--model`` of a raw command line (``--model X`` or ``--model=X``; the last,
    as vLLM's parser takes it), before vLLM parses it; a model from a ``--config`` file is checked once parsed."""
    model = flag_value(argv, ("--model",))
    if model is not None:
        check_model_path(model)
