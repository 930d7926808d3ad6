"""Three real nats-servers started from `sheshnag nats-config` files form one TLS cluster with JetStream: the core
user of the env file gets in over TLS and keeps three replicas of a stream; a client without credentials, or one
that does not trust the cluster's CA, does not."""

import asyncio
import contextlib
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
from nats.js.api import StreamConfig

from infra.cli import parse_args
from infra.embedded import free_port, launch, stop_process, venv_binary, wait_for_port
from infra.nats_config import nats_config
from tests.certificates import TlsFiles, write_tls_files

NODES = 3


@contextlib.contextmanager
def generated_cluster(tmp_path: Path, tls: TlsFiles) -> Iterator[list[int]]:
    """Each node's config from the same data dir, started as the operator would: `nats-server -c <file>`."""
    client_ports = [free_port() for _ in range(NODES)]
    route_ports = [free_port(frozenset(client_ports)) for _ in range(NODES)]
    routes = ",".join(f"127.0.0.1:{port}" for port in route_ports)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for index in range(NODES):
            node = tmp_path / f"nats-{index}"
            node.mkdir()
            args = parse_args(["nats-config", "--data-dir", str(tmp_path / "secrets"), "--out", str(node / "nats.conf"),
                               "--server-name", f"nats-{index}", "--listen", f"127.0.0.1:{client_ports[index]}",
                               "--store-dir", str(node / "jetstream"), "--cluster-name", "sheshnag",
                               "--cluster-listen", f"127.0.0.1:{route_ports[index]}", "--routes", routes,
                               "--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--tls-ca", str(tls.ca),
                               "--env-dir", str(tmp_path / "env"),
                               "--url", f"tls://127.0.0.1:{client_ports[0]}"])
            assert nats_config(args) == 0
            processes.append(launch([venv_binary("nats-server"), "-c", str(node / "nats.conf")], node / "nats.log"))
        for port, process in zip(client_ports, processes, strict=True):
            wait_for_port(port, process, 15.0, "nats-server")
        yield client_ports
    finally:
        for process in processes:
            stop_process(process)


def core_url(tmp_path: Path) -> str:
    line = (tmp_path / "env" / "core.env").read_text().splitlines()[-1]
    return line.removeprefix("SHESHNAG_NATS_URL=")


async def test_the_generated_cluster_keeps_three_replicas_for_the_core_user_over_tls(tmp_path: Path) -> None:
    tls = write_tls_files(tmp_path)
    context = ssl.create_default_context(cafile=str(tls.ca))
    with generated_cluster(tmp_path, tls):
        nc = await nats.connect(core_url(tmp_path), tls=context, connect_timeout=5)
        try:
            js = nc.jetstream()
            async with asyncio.timeout(60):
                while True:  # the cluster elects its JetStream meta leader within a few seconds of forming
                    try:
                        await js.add_stream(StreamConfig(name="PROBE", subjects=["probe.>"], num_replicas=NODES))
                        break
                    except (nats.errors.Error, TimeoutError):
                        await asyncio.sleep(0.5)
                while True:  # and then the new stream's own leader: until it has one, nothing answers a publish
                    try:
                        ack = await js.publish("probe.one", b"kept three times", headers={"Nats-Msg-Id": "one"})
                        break
                    except (nats.errors.Error, TimeoutError):
                        await asyncio.sleep(0.5)
            info = await js.stream_info("PROBE")
            assert ack.seq == 1
            assert info.config.num_replicas == NODES
            assert info.cluster is not None and info.cluster.name == "sheshnag"
            assert len(info.cluster.replicas or []) == NODES - 1
        finally:
            await nc.close()


async def gets_in(url: str, context: ssl.SSLContext | None = None) -> bool:
    """Connected and answered: nats-py may return from connect before the server's refusal closes the socket."""
    try:
        client = await nats.connect(url, tls=context, connect_timeout=5, allow_reconnect=False)
    except (nats.errors.Error, OSError, TimeoutError):
        return False
    try:
        await client.flush(5)
        return client.is_connected
    except nats.errors.Error:
        return False
    finally:
        await client.close()


async def test_a_client_without_credentials_is_refused_and_one_that_does_not_trust_the_ca_gets_nowhere(
        tmp_path: Path) -> None:
    tls = write_tls_files(tmp_path)
    context = ssl.create_default_context(cafile=str(tls.ca))
    with generated_cluster(tmp_path, tls) as ports:
        assert await gets_in(core_url(tmp_path), context)
        assert not await gets_in(f"tls://127.0.0.1:{ports[1]}", context)
        assert not await gets_in(core_url(tmp_path))
