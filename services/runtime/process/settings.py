"""Connection settings shared by every service: where the broker, object store and catalogue are; and the base every
settings class reads from (environment, then the optional settings file)."""

from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from services.runtime.nats.tls import tls_options
from services.runtime.process.config_file import ConfigFileSource


class FileBackedSettings(BaseSettings):
    """Settings read from the environment, then the optional settings file (`config_file.py`), then defaults."""

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, dotenv_settings, file_secret_settings, ConfigFileSource(settings_cls)


class ConnectionSettings(FileBackedSettings):
    """Read from `SHESHNAG_*` variables; every service embeds one."""

    model_config = SettingsConfigDict(env_prefix="SHESHNAG_", extra="ignore")

    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    """Each service's event loop: uvloop (libuv's; less CPU per message and request) or Python's own."""
    nats_url: str = "nats://127.0.0.1:4222"
    """Where the broker is; for a broker that authorizes connections, with the core user's credentials in it
    (`nats://core:<password>@host:port`). Executors connect with their own (executor id and worker key). A
    cluster's nodes are listed with commas (`nats://…@host1:4222,nats://…@host2:4222`). A broker on another host
    than this one must be `tls://` (services/runtime/nats/tls.py): nothing is sent to it before TLS."""
    nats_replicas: int = Field(default=1, ge=1, le=5)
    """How many servers hold each stream and KV bucket: 1 on one broker, 3 on a 3-node JetStream cluster. Streams
    and buckets are made with it; one found with fewer replicas is scaled up to it (never down)."""
    nats_tls_ca: Path | None = None
    """The CA (PEM) the broker's TLS certificate is verified against (`sheshnag up --listen` writes its own into the
    data dir; `sheshnag executor --deployment` fetches it); unset: the system's CAs. A broker on another host is
    always reached over TLS, TLS first, and verified; one on 127.0.0.1/localhost/::1 with TLS where it asks."""
    nats_private_hosts: list[str] = []
    """Broker hosts on a private network of the deployment's own (a compose network's `nats`), held to the rule of
    127.0.0.1: `nats://` allowed, TLS only where the server asks. Empty (the default): every other host must be
    `tls://`, verified and TLS first. Never set it where the network to the broker is not yours (a provider host)."""
    nats_callout_seed: str = Field(default="", repr=False)
    """The auth callout issuer's account nkey seed (`SA…`). The process given it (the scheduler) admits
    executors to the broker by worker key; empty: no admissions (a broker without auth callout)."""
    nats_executor_ttl_s: float = 3600.0
    """How long an admitted executor's NATS permissions last before it must be admitted again. A revoked worker
    key's connections are closed within moments of the revoke; this is the backstop should that kick be missed."""
    nats_max_connections_per_provider: int = Field(default=1024, ge=1)
    """Broker connections the executors of one provider (all its worker keys together; a key of no provider: that
    key alone) may hold at once; past it, a new one is refused until one closes. An executor holds one or two. Each
    scheduler answering admissions counts those it admitted, so with several the bound is that many times this."""
    s3_endpoint: str = "127.0.0.1:8333"
    """host:port of the S3 server."""
    s3_access_key: str = ""
    """The object store access key (`sheshnag up` makes one per data dir)."""
    s3_secret_key: str = ""
    """The object store secret key."""
    s3_secure: bool = False
    """Reach the object store over HTTPS."""
    s3_tls_ca: Path | None = None
    """A CA (PEM) trusted for the object store's HTTPS besides the system's: a private CA's (`sheshnag up --listen`'s
    own, which also signs the presigned URLs' endpoint that provider hosts reach). Unset: the system's CAs alone."""
    s3_bucket: str = "sheshnag"
    """The one bucket that holds uploads, results and model objects."""
    storage_paths: dict[str, Path] = {}
    """The volumes whose free space is watched, each by name and a path on it (JSON: `{"broker": "/var/lib/nats",
    "object_store": "/data/minio"}`); `sheshnag up` names its data dir's broker and object store folders. Empty:
    the broker's JetStream account limits are watched instead, where the account has any
    (runtime/storage/volumes.py)."""
    storage_reserve_percent: float = Field(default=5.0, ge=0, le=50)
    """Free space kept in reserve on each watched volume, as a share of its size: below it new uploads and batches
    are refused (507 `insufficient_storage`) while running batches finish; below twice it the volume is at
    `warning`. The reserve is the smaller of this and `SHESHNAG_STORAGE_RESERVE_MAX_BYTES`, but at least the smaller
    of 32 MiB and a quarter of the volume (a tiny disk still keeps room for what runs)."""
    storage_reserve_max_bytes: int = Field(default=1 << 30, ge=0)
    """The most a volume's reserve is, however large the volume (1 GiB)."""
    catalogue_path: Path | None = None
    """A catalogue TOML file; the packaged default when unset."""
    log_level: str = "INFO"
    """The level of the JSON logs (DEBUG, INFO, WARNING, ERROR)."""
    metrics_port: int = 0
    """Serve this process's Prometheus `/metrics` here (0: not served; the gateway serves it on its own port). A
    service's own `SHESHNAG_<SERVICE>_METRICS_PORT` wins: set those where several services share a host."""
    metrics_address: str = "127.0.0.1"
    """The address `/metrics` binds: loopback by default; `0.0.0.0` (or the host's own address) where Prometheus
    scrapes from elsewhere (a Kubernetes pod's metrics port, another host)."""

    def nats_transport(self, url: str | None = None) -> dict[str, Any]:
        """The TLS options of a NATS connection to `url` (default `nats_url`) by the rule of `nats/tls.py` (which
        raises `InsecureBrokerUrl` before anything connects)."""
        return tls_options(self.nats_url if url is None else url, self.nats_tls_ca,
                           private=frozenset(host.lower() for host in self.nats_private_hosts))


class ServiceSettings(FileBackedSettings):
    """Base for each service's own settings; subclasses set their own env prefix."""

    model_config = SettingsConfigDict(extra="ignore")

    connection: ConnectionSettings = Field(default_factory=ConnectionSettings)
    metrics_port: int | None = None
    """This service's own Prometheus `/metrics` port, over the shared `SHESHNAG_METRICS_PORT`: services sharing a
    host each bind their own; 0: not served."""

    def metrics_endpoint(self) -> tuple[str, int]:
        """The address and port this service serves `/metrics` on (port 0: not served)."""
        port = self.connection.metrics_port if self.metrics_port is None else self.metrics_port
        return self.connection.metrics_address, port
