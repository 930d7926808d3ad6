"""A server's TLS: the context a listener serves its certificate with, read again on SIGHUP, so a certificate made
anew (`sheshnag certs rotate`) is served to every new connection without a restart and without dropping one."""

import asyncio
import logging
import signal
import ssl
from pathlib import Path

log = logging.getLogger(__name__)


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """TLS 1.2 or later, the certificate chain in `cert` (leaf first; intermediates after it) and its `key`."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


def reload_on_hangup(context: ssl.SSLContext, cert: Path, key: Path) -> None:
    """On SIGHUP, load `cert` and `key` into `context` again: connections made from then on get the new ones.
    A pair that does not load (half written, a key that does not match) is logged and the old one kept."""

    def reload() -> None:
        try:
            context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as error:
            log.error("kept the previous certificate: %s or %s did not load (%s)", cert, key, error)
            return
        log.info("serving the certificate in %s", cert)

    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)
