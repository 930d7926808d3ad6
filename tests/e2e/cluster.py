"""The stack against a 3-node JetStream cluster on loopback (infra/nats_cluster.py), every stream and bucket R3,
and what its tests ask of the cluster: who leads a stream, how many replicas each has, when a new leader is up."""

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass

import nats
import pytest

from infra.embedded import free_port
from infra.nats_cluster import NatsCluster
from services.runtime.nats.client import server_list
from tests.e2e.conftest import RunningStack, start_stack, stop_stack

REPLICAS = 3


@dataclass
class ClusteredStack:
    cluster: NatsCluster
    stack: RunningStack

    def stream_replicas(self, streams: tuple[str, ...]) -> dict[str, int]:
        return asyncio.run(self._stream_replicas(streams))

    def leader(self, stream: str) -> str | None:
        """The server leading `stream` now (None while it elects one), as a live node answers."""
        return asyncio.run(self._leader(stream))

    def new_leader(self, stream: str, not_this: str, within_s: float = 60) -> str:
        """Once a node other than `not_this` leads `stream`."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            leader = self.leader(stream)
            if leader not in (None, not_this):
                return leader
            time.sleep(0.1)
        raise TimeoutError(f"{stream} elected no leader within {within_s}s")

    def current_peers(self, stream: str) -> set[str]:
        """The servers holding `stream` that are caught up with it (its leader among them)."""
        return asyncio.run(self._current_peers(stream))

    async def _current_peers(self, stream: str) -> set[str]:
        nc = await nats.connect(server_list(self.cluster.core_urls()), allow_reconnect=False)
        try:
            cluster = (await nc.jetstream().stream_info(stream)).cluster
        finally:
            await nc.close()
        if cluster is None:
            return set()
        followers = {peer.name for peer in cluster.replicas or [] if peer.current and peer.name}
        return followers | ({cluster.leader} if cluster.leader else set())

    async def _stream_replicas(self, streams: tuple[str, ...]) -> dict[str, int]:
        nc = await nats.connect(server_list(self.cluster.core_urls()), allow_reconnect=False)
        try:
            js = nc.jetstream()
            return {stream: (await js.stream_info(stream)).config.num_replicas or 1 for stream in streams}
        finally:
            await nc.close()

    async def _leader(self, stream: str) -> str | None:
        try:
            nc = await nats.connect(server_list(self.cluster.core_urls()), allow_reconnect=False, connect_timeout=2)
        except (nats.errors.Error, OSError):
            return None
        try:
            cluster = (await nc.jetstream(timeout=2).stream_info(stream)).cluster
            return cluster.leader if cluster else None
        except (nats.errors.Error, nats.js.errors.Error):
            return None  # no leader to answer yet
        finally:
            await nc.close()


@pytest.fixture(scope="module")
def clustered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusteredStack]:
    data_dir = tmp_path_factory.mktemp("cluster") / "data"
    cluster = NatsCluster.plan(data_dir)
    cluster.start()
    try:
        stack = start_stack(data_dir, free_port(), {"SHESHNAG_NATS_REPLICAS": str(REPLICAS)},
                            ["--nats-url", cluster.urls()])
        try:
            yield ClusteredStack(cluster, stack)
        finally:
            stop_stack(stack)
    finally:
        cluster.stop()
