"""The reward servers a run lists answer before verl builds its workers.

Without this, a wrong ``server_url`` (a typo, a server not started, a port of another job) shows only when the
first rollout is scored, after verl has placed its workers, loaded the policy and generated a batch: minutes on a
GPU cluster. The trainer modes ``vllm_rm*`` read each listed server's ``/health`` first, with the RM's own client
options (``max_retries``, ``backoff_*``, ``deadline_s``, ``api_key``), so a server has exactly the time to come up
that a scoring request would give it. An RM with none of its servers answering stops the run; a server that does
not answer among others that do is named in a warning (requests fail over from it, as they would at any step).

Managed replicas are not listed servers: the fleet starts them after verl's set-up and gates on their
``/health`` itself. The judge is not checked: its server may be any OpenAI-compatible API, which has no
``/health``.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from verl_vllm_rm.client.options import ClientOptions
from verl_vllm_rm.client.reward_client import RewardServerError, VLLMRewardClient
from verl_vllm_rm.scoring.options import ManagerOptions

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ListedRM:
    """One reward model served by servers the run lists: its name, the option that lists them, its client."""

    name: str
    key: str
    client: ClientOptions


def listed_rms(options: ManagerOptions) -> list[ListedRM]:
    """The run's reward models on listed servers (``server_url``), not on managed replicas (``replicas``)."""
    keys = {entry["name"]: f"reward_kwargs.reward_models[{i}].server_url"  # an entry's own servers; else inherited
            for i, entry in enumerate(options.reward_models) if "server_url" in entry}
    return [ListedRM(rm.name, keys.get(rm.name, "reward_kwargs.server_url"), rm.client)
            for rm in options.rm_options if rm.replicas is None]


async def health_error(client: ClientOptions) -> str | None:
    """Why the one server of ``client`` gave no ok ``/health`` within its retries and deadline; None if it did."""
    try:
        async with VLLMRewardClient(options=client) as rm_client:
            await rm_client.health()
    except RewardServerError as e:
        return str(e)
    return None


async def server_errors(rms: list[ListedRM]) -> dict[tuple[str, str], str | None]:
    """``(rm name, url)`` -> :func:`health_error` of that server, every listed server asked at once."""
    asked = [(rm.name, url, replace(rm.client, server_url=[url])) for rm in rms for url in rm.client.server_url]
    answers = await asyncio.gather(*(health_error(client) for _, _, client in asked))
    return {(name, url): error for (name, url, _), error in zip(asked, answers)}


def check_listed_servers(options: ManagerOptions) -> None:
    """Raise :class:`RewardServerError` naming every reward model none of whose listed servers answers
    ``/health``, with each server's error and the fix; warn of each other server that does not answer."""
    rms = listed_rms(options)
    if not rms:
        return
    with ThreadPoolExecutor(1) as pool:  # a loop of its own, whatever runs in the caller's thread
        errors = pool.submit(asyncio.run, server_errors(rms)).result()
    unreachable = []
    for rm in rms:
        failed = {url: errors[rm.name, url] for url in rm.client.server_url if errors[rm.name, url] is not None}
        if len(failed) == len(rm.client.server_url):
            unreachable.append(f"reward model {rm.name!r} ({rm.key}={rm.client.server_url}): "
                               + "; ".join(failed.values()))
            continue
        for url, error in failed.items():
            logger.warning("reward model %r: its server %s does not answer /health (requests fail over to the "
                           "others until it does): %s", rm.name, url, error)
    if unreachable:
        raise RewardServerError(
            "no reward server answers /health, checked before verl builds its workers: " + " | ".join(unreachable)
            + ". Start each server first (python -m verl_vllm_rm.server --model ...) and wait for its /health, or "
            "fix the server_url; a server that needs longer to come up: raise that RM's max_retries or deadline_s")
