"""Each deployment test runs once per storage engine a deployment may use: in containers (MinIO, PostgreSQL) where
a Docker engine answers, skipped with that reason where none does, and on this machine's SeaweedFS and PostgreSQL."""

import secrets
from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import RunningS3
from tests.deployment.backends import (
    PostgresBackend,
    S3Backend,
    docker_unavailable,
    local_postgres,
    minio_container,
    postgres_container,
)


def _needs_docker() -> None:
    reason = docker_unavailable()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def minio() -> Iterator[S3Backend]:
    _needs_docker()
    with minio_container() as backend:
        yield backend


@pytest.fixture(scope="session")
def postgres_in_container() -> Iterator[PostgresBackend]:
    _needs_docker()
    with postgres_container() as backend:
        yield backend


@pytest.fixture(params=["seaweedfs", "minio"])
def s3_backend(request: pytest.FixtureRequest) -> S3Backend:
    if request.param == "minio":
        return request.getfixturevalue("minio")
    running: RunningS3 = request.getfixturevalue("s3_server")
    return S3Backend("seaweedfs", running.endpoint, running.credentials.access_key, running.credentials.secret_key)


@pytest.fixture(params=["local", "container"])
def postgres_backend(request: pytest.FixtureRequest) -> PostgresBackend:
    if request.param == "container":
        return request.getfixturevalue("postgres_in_container")
    return local_postgres()


@pytest.fixture
def postgres_schema(postgres_backend: PostgresBackend) -> Iterator[str]:
    """A schema of the test's own in that PostgreSQL server, dropped afterwards."""
    name = f"ledger_{secrets.token_hex(4)}"
    try:
        connection = psycopg.connect(**postgres_backend.params(), autocommit=True,  # type: ignore[arg-type]
                                     connect_timeout=3)
    except psycopg.OperationalError as error:
        pytest.skip(f"PostgreSQL is not reachable at {postgres_backend.host}:{postgres_backend.port}: {error}")
    with connection:
        connection.execute(f"CREATE SCHEMA {name}")
        yield name
        connection.execute(f"DROP SCHEMA {name} CASCADE")
