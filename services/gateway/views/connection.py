"""`GET /v1/provider/connection`: where a provider host's executor finds the broker, and the CA to verify it by. Public:
neither is a secret, and the broker admits an executor by its worker key, which the gateway never accepts."""

import asyncio
import hashlib
import ssl
from urllib.parse import urlsplit, urlunsplit

from aiohttp import web

from contracts.api.provider import ProviderConnection
from services.gateway.context import deps
from services.gateway.http.bodies import answer


def without_credentials(urls: str) -> list[str]:
    """Each of the comma-separated URLs with any `user:password@` taken out."""
    parts = [urlsplit(url.strip()) for url in urls.split(",") if url.strip()]
    return [urlunsplit(part._replace(netloc=part.netloc.rpartition("@")[2])) for part in parts]


async def provider_connection(request: web.Request) -> web.Response:
    settings = deps(request).settings
    urls = without_credentials(settings.provider_nats_url or settings.connection.nats_url)
    ca = settings.connection.nats_tls_ca
    pem = await asyncio.to_thread(ca.read_text) if ca is not None else None
    digest = hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest() if pem else None
    return answer(ProviderConnection(nats_urls=urls, tls_ca_pem=pem, tls_ca_sha256=digest))
