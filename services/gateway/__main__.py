"""`python -m services.gateway`."""

from services.gateway.app import create_app
from services.gateway.server import serve
from services.gateway.settings import GatewaySettings
from services.runtime.process import configure_observability, run_until_signalled


def main() -> None:
    settings = GatewaySettings()
    configure_observability("gateway", settings.connection.log_level, settings.metrics_endpoint())
    run_until_signalled(lambda stop: serve(create_app(settings), settings.host, settings.port, stop))


if __name__ == "__main__":
    main()
