"""Where webhooks may go: public unicast addresses only, however an address is spelt (IPv4 carried in IPv6
included), unless the operator allows a CIDR; `sheshnag up --webhooks-to-loopback` allows loopback and nothing
else, and without it `up` allows nothing private."""

from pathlib import Path

import pytest

from infra.supervisor import Stack
from services.gateway.settings import GatewaySettings
from services.gateway.webhooks.targets import AddressPolicy, parse_networks, refusal

REFUSED = ["127.0.0.1", "127.1.2.3", "0.0.0.0", "::1", "::", "10.1.2.3", "172.16.0.1", "192.168.1.1",
           "169.254.169.254", "100.100.100.200", "fd00::1", "fe80::1%eth0", "224.0.0.1", "ff02::1",
           "::ffff:127.0.0.1", "64:ff9b::a00:1", "2002:7f00:1::1", "192.0.2.1", "not an address",
           # IPv4 carried where the policy once did not look: IPv4-compatible, IPv4-translated (SIIT), and RFC 8215's
           # local-use NAT64 prefix (a deployment's own translator into its private network)
           "::7f00:1", "::a9fe:a9fe", "::ffff:0:7f00:1", "::ffff:0:a9fe:a9fe", "64:ff9b:1::a9fe:a9fe",
           "64:ff9b:1:fffe::808:808"]


@pytest.mark.parametrize("address", REFUSED)
def test_no_private_local_multicast_or_metadata_address_is_allowed_by_default(address: str) -> None:
    assert not AddressPolicy().allows(address)


@pytest.mark.parametrize("address", ["1.1.1.1", "8.8.8.8", "2606:4700::1111", "2002:808:808::1", "64:ff9b::808:808"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert AddressPolicy().allows(address)


async def test_a_name_no_resolver_can_look_up_is_refused_without_an_error() -> None:
    # Every resolver's IDNA encoding refuses it before any lookup (the threaded one also "a..b", aiodns not).
    why = await refusal("b\udcff.example", 443, AddressPolicy(), 5.0)
    assert why is not None and "not a host name" in why


def test_an_allowed_cidr_opens_only_itself() -> None:
    policy = AddressPolicy(parse_networks(["127.0.0.0/8", " ::1 "]))
    assert policy.allows("127.1.2.3") and policy.allows("::1") and policy.allows("::ffff:127.0.0.1")
    assert not policy.allows("10.0.0.1") and not policy.allows("169.254.169.254")


def test_the_allowed_cidrs_are_a_comma_list_and_a_bad_one_stops_the_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHESHNAG_GATEWAY_WEBHOOK_ALLOWED_CIDRS", "127.0.0.0/8, ::1/128")
    assert GatewaySettings().webhook_allowed_cidrs == ["127.0.0.0/8", "::1/128"]
    monkeypatch.setenv("SHESHNAG_GATEWAY_WEBHOOK_ALLOWED_CIDRS", "127.0.0.0/33")
    with pytest.raises(ValueError, match=r"127\.0\.0\.0/33"):
        GatewaySettings()


def test_a_webhook_poll_interval_of_zero_stops_the_gateway_instead_of_never_delivering(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHESHNAG_GATEWAY_WEBHOOK_POLL_INTERVAL_S", "0")
    with pytest.raises(ValueError, match="webhook_poll_interval_s"):
        GatewaySettings()
    monkeypatch.setenv("SHESHNAG_GATEWAY_WEBHOOK_POLL_INTERVAL_S", "0.1")
    assert GatewaySettings().webhook_poll_interval_s == 0.1


def test_up_allows_loopback_to_webhooks_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHESHNAG_GATEWAY_WEBHOOK_ALLOWED_CIDRS", raising=False)
    name = "SHESHNAG_GATEWAY_WEBHOOK_ALLOWED_CIDRS"
    assert name not in Stack(Path("/nowhere"), 8080, 4222, 9000).settings_env()
    assert Stack(Path("/nowhere"), 8080, 4222, 9000, webhooks_to_loopback=True).settings_env()[name] == \
        "127.0.0.0/8,::1/128"
    monkeypatch.setenv(name, "10.20.0.0/16")  # the operator's own CIDRs are kept
    assert Stack(Path("/nowhere"), 8080, 4222, 9000, webhooks_to_loopback=True).settings_env()[name] == \
        "10.20.0.0/16,127.0.0.0/8,::1/128"
