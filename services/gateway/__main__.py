"""`python -m services.gateway`."""

import asyncio
import ssl

from services.gateway.app import create_app
from services.gateway.http.server import serve
from services.gateway.settings import GatewaySettings
from services.runtime.process.heap_diff import install_heap_diff
from services.runtime.process.runner import configure_observability, run_until_signalled
from services.runtime.process.tls_server import reload_on_hangup, server_context


def main() -> None:
    settings = GatewaySettings()
    configure_observability("gateway", settings.connection.log_level, settings.metrics_endpoint())
    run_until_signalled(lambda stop: run(settings, stop))


async def run(settings: GatewaySettings, stop: asyncio.Event) -> None:
    install_heap_diff()
    context: ssl.SSLContext | None = None
    if settings.tls_cert is not None and settings.tls_key is not None:
        context = server_context(settings.tls_cert, settings.tls_key)
        reload_on_hangup(context, settings.tls_cert, settings.tls_key)
    await serve(create_app(settings), settings.host, settings.port, stop, context)


if __name__ == "__main__":
    main()
