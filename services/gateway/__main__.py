"""`python -m services.gateway`."""

from aiohttp import web

from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from services.runtime.process import configure_observability


def main() -> None:
    settings = GatewaySettings()
    configure_observability("gateway", settings.connection.log_level)
    web.run_app(create_app(settings), host=settings.host, port=settings.port, print=None)


if __name__ == "__main__":
    main()
