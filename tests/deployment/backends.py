"""The storage engines a deployment runs on, for the deployment tests: MinIO and PostgreSQL in containers
(testcontainers, the design card's choice) where a Docker engine answers, and the same tests on this machine's own
engines — SeaweedFS's S3 server and the local PostgreSQL — everywhere."""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache

MINIO_IMAGE = os.environ.get("MINIO_TEST_IMAGE", "minio/minio:RELEASE.2025-04-22T22-12-26Z")
POSTGRES_IMAGE = os.environ.get("POSTGRES_TEST_IMAGE", "postgres:16-alpine")


@dataclass(frozen=True)
class S3Backend:
    """An S3 server the services reach with an access key pair, as a deployment configures them."""

    name: str
    endpoint: str
    access_key: str
    secret_key: str


@dataclass(frozen=True)
class PostgresBackend:
    """A PostgreSQL server, as psycopg and the ledger's settings take it."""

    name: str
    host: str
    port: int
    dbname: str
    user: str
    password: str

    def params(self) -> dict[str, str | int]:
        return {"host": self.host, "port": self.port, "dbname": self.dbname, "user": self.user,
                "password": self.password}


@cache
def docker_unavailable() -> str | None:
    """Why containers cannot run here (no Docker engine answering), or None when they can."""
    try:
        import docker
        import docker.errors
    except ImportError as error:
        return f"the docker client library is not installed: {error}"
    try:
        client = docker.from_env(timeout=5)
        client.ping()
        client.close()
    except docker.errors.DockerException as error:
        return f"no Docker engine answers here ({error}); the same tests run on SeaweedFS and the local PostgreSQL"
    return None


@contextmanager
def minio_container() -> Iterator[S3Backend]:
    from testcontainers.community.minio import MinioContainer

    with MinioContainer(image=MINIO_IMAGE) as container:
        config = container.get_config()
        yield S3Backend("minio", config["endpoint"], config["access_key"], config["secret_key"])


@contextmanager
def postgres_container() -> Iterator[PostgresBackend]:
    from testcontainers.community.postgres import PostgresContainer

    with PostgresContainer(image=POSTGRES_IMAGE, driver=None) as container:
        yield PostgresBackend("postgres-container", container.get_container_host_ip(),
                              int(container.get_exposed_port(container.port)), container.dbname,
                              container.username, container.password)


def local_postgres() -> PostgresBackend:
    """The machine's PostgreSQL (trust auth on 127.0.0.1:5432 here; POSTGRES_* override it)."""
    return PostgresBackend("local-postgres", os.environ.get("POSTGRES_HOST", "127.0.0.1"),
                           int(os.environ.get("POSTGRES_PORT", "5432")), os.environ.get("POSTGRES_DBNAME", "test"),
                           os.environ.get("POSTGRES_USER", "postgres"), os.environ.get("POSTGRES_PASSWORD", ""))
