"""Gateway settings (`SHESHNAG_GATEWAY_*`)."""

from pydantic_settings import SettingsConfigDict

from services.runtime.settings import ServiceSettings


class GatewaySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="SHESHNAG_GATEWAY_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8080
    max_upload_bytes: int = 100 * 1024 * 1024
    min_completion_window_s: int = 24 * 3600
    """The shortest completion_window accepted (OpenAI's 24h); lowered only to test expiry."""
    read_your_writes_s: float = 5.0
    """How long a create waits for the ledger to show what it just published."""
