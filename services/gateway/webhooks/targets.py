"""Where webhooks may go: the address policy (public addresses only, plus the CIDRs the operator allows) and the
resolver that enforces it where the connection is made, so a delivery can only ever connect to an allowed address
(no check-then-connect gap: the addresses checked are the addresses connected to). Names are resolved by c-ares
(`aiodns`), which holds no thread: a tenant's host whose name server never answers costs a pending query, cancelled at
its timeout, never one of the threads every other blocking call of the gateway shares."""

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import AsyncResolver

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")
"""RFC 8215's NAT64 prefix for local use: a deployment's own translator, whose IPv4 side is its private network
(where the IPv4 address sits in it depends on the prefix length the operator chose): never a public address."""
CARRYING_IPV4 = (NAT64, ipaddress.IPv6Network("::/96"), ipaddress.IPv6Network("::ffff:0:0:0/96"))
"""Prefixes whose last 32 bits are an IPv4 address connecting may reach: NAT64's well-known one, IPv4-compatible
(`::a.b.c.d`, deprecated) and IPv4-translated (`::ffff:0:a.b.c.d`, SIIT) addresses."""
UNSPECIFIED_AND_LOOPBACK = ipaddress.IPv6Network("::/127")
"""`::` and `::1`: in the IPv4-compatible prefix, and no IPv4 address (judged as themselves)."""
REFUSED = "refused: address not allowed"
"""What a delivery attempt to a refused address records: nothing of the address, its answer or its error."""


class RefusedAddress(OSError):
    """Every address the host names is one webhooks may not reach."""


def parse_networks(cidrs: list[str]) -> tuple[Network, ...]:
    """The operator's allowed CIDRs (`127.0.0.0/8`, `::1/128`, a bare address); ValueError names a bad one."""
    return tuple(ipaddress.ip_network(cidr.strip(), strict=False) for cidr in cidrs if cidr.strip())


def _written_address(host: str) -> Address | None:
    """The address `host` is, written as addresses are (`8.8.8.8`, `::1`, IPv6 with a zone); None for anything else."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None


def numeric_address(host: str) -> Address | None:
    """The address `host` spells, in any form the C library reads as one (also `0x7f000001`, `127.1`, octal), or
    None for a name."""
    written = _written_address(host)
    if written is not None or not host[:1].isdigit():
        return written
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def standard_address(host: str) -> bool:
    """Whether `host` is an address written as addresses are, which a connection takes as it is: not a spelling only
    the C library reads (`0x08080808`, `8.8.2056`), which would be looked up as a name."""
    return _written_address(host) is not None


def _embedded(address: Address) -> list[Address]:
    """What connecting to `address` reaches: an IPv4-mapped one is its IPv4 address; a 6to4, NAT64, IPv4-compatible
    or IPv4-translated one is itself and the IPv4 address it carries (each must be allowed)."""
    if isinstance(address, ipaddress.IPv4Address):
        return [address]
    if address.ipv4_mapped is not None:
        return [address.ipv4_mapped]
    carried = [address.sixtofour]
    if any(address in prefix for prefix in CARRYING_IPV4) and address not in UNSPECIFIED_AND_LOOPBACK:
        carried.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return [address, *(inner for inner in carried if inner is not None)]


@dataclass(frozen=True)
class AddressPolicy:
    """Public unicast addresses only (no loopback, private, link-local, unique-local, multicast, unspecified,
    reserved, shared or documentation ranges, so no metadata service either), unless in `allowed`."""

    allowed: tuple[Network, ...] = ()

    def allows(self, host: str) -> bool:
        """Whether `host`, an IP address as text, may be connected to; False for anything that is not one."""
        address = numeric_address(host)
        return address is not None and all(self._allows(inner) for inner in _embedded(address))

    def _allows(self, address: Address) -> bool:
        if any(address in network for network in self.allowed):
            return True
        if address in LOCAL_NAT64:
            return False
        return address.is_global and not address.is_multicast and not getattr(address, "is_site_local", False)


def literal_address(host: str) -> bool:
    """Whether a URL's host is an IP address itself (checked as it is: no resolver sees it)."""
    return numeric_address(host) is not None


class PolicyResolver(AbstractResolver):
    """A resolver less the answers the policy refuses (none left: `RefusedAddress`): the deliveries' only way from a
    host name to an address. By default c-ares, asking `nameservers` (none: the system's, from resolv.conf)."""

    def __init__(self, policy: AddressPolicy, inner: AbstractResolver | None = None,
                 nameservers: Sequence[str] = ()) -> None:
        self.policy = policy
        self.inner = inner or (AsyncResolver(nameservers=list(nameservers)) if nameservers else AsyncResolver())

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        answers = await self.inner.resolve(host, port, family)
        allowed = [answer for answer in answers if self.policy.allows(answer["host"])]
        if not allowed:
            raise RefusedAddress(f"{host} resolves only to addresses webhooks may not reach")
        return allowed

    async def close(self) -> None:
        await self.inner.close()


async def refusal(host: str, port: int, policy: AddressPolicy, timeout_s: float,
                  nameservers: Sequence[str] = ()) -> str | None:
    """Why a webhook may not be registered for `host` (None: it may): a refused literal address, a `localhost` name,
    or a name resolving only to refused addresses. One that does not resolve in time may: each attempt resolves it."""
    if literal_address(host):
        return None if policy.allows(host) else f"{host} is not an address webhooks may be sent to"
    name = host.rstrip(".").lower()  # `localhost` and its subdomains are loopback whatever DNS says (RFC 6761)
    if (name == "localhost" or name.endswith(".localhost")) and not policy.allows("127.0.0.1"):
        return f"{host} names this host's loopback"
    resolver = PolicyResolver(policy, nameservers=nameservers)
    try:
        await asyncio.wait_for(resolver.resolve(host, port, socket.AF_UNSPEC), timeout_s)
    except RefusedAddress:
        return f"{host} resolves only to addresses webhooks may not be sent to"
    except ValueError:  # no lookup can be made (the IDNA codec's UnicodeError: an empty or over-long label)
        return f"{host} is not a host name that can be resolved"
    except (OSError, TimeoutError):
        return None
    finally:
        await resolver.close()
    return None
