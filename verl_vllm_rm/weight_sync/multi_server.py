"""One reward model published into several servers: every server a scoring client routes over."""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

from verl_vllm_rm.protocol.names import RewardModelTrainingMode
from verl_vllm_rm.weight_sync.publisher import PublishResult, RewardModelPublisher
from verl_vllm_rm.weight_sync.selection import StateDictLike


class MultiServerPublisher:
    """One :class:`RewardModelPublisher` per server URL, kept between publishes.

    ``MultiServerPublisher(client.urls, api_key=client.options.api_key)`` keeps the
    servers of a :class:`~verl_vllm_rm.scoring.client.VLLMRewardClient` on the same
    weights; any other keyword goes to every publisher. Blocking, like the
    publisher: from an event loop, ``await asyncio.to_thread(fleet.publish, ...)``.
    """

    def __init__(self, server_urls: Sequence[str], **publisher_kwargs: Any) -> None:
        if not server_urls:
            raise ValueError("MultiServerPublisher needs at least one server URL")
        self._stack = contextlib.ExitStack()
        self.publishers = [self._stack.enter_context(RewardModelPublisher(url, **publisher_kwargs))
                           for url in dict.fromkeys(server_urls)]  # a URL listed twice is one server

    def publish(
        self,
        state_dict: StateDictLike,
        version: int,
        training_mode: RewardModelTrainingMode | str = RewardModelTrainingMode.FULL,
        **publish_kwargs: Any,
    ) -> list[PublishResult]:
        """Publish to each server in order; one result per server.

        The first refusal or failure stops it and is raised: the servers before
        it serve ``version``, the others keep their weights.
        """
        return [pub.publish(state_dict, version, training_mode, **publish_kwargs) for pub in self.publishers]

    def close(self) -> None:
        """Close every publisher's session (each one, even when another fails)."""
        self._stack.close()

    def __enter__(self) -> "MultiServerPublisher":
        return self

    def __exit__(self, *exc: Any) -> bool:
        return self._stack.__exit__(*exc)
