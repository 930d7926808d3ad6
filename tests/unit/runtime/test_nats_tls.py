"""The connection rule (services/runtime/nats/tls.py): a broker on this host is reached as nats-py does; any other
must be tls://, is verified and is reached TLS first; a private host the operator declared is held to the loopback
rule; a refusal names the setting, never the URL's password."""

import pytest

from services.runtime.nats.tls import InsecureBrokerUrl, is_local, tls_options


@pytest.mark.parametrize("url", ["nats://127.0.0.1:4222", "nats://core:pw@localhost:4222", "nats://[::1]:4222",
                                 "127.0.0.1:4222", "nats://127.0.0.1:1,nats://localhost:2"])
def test_a_broker_on_this_host_is_reached_as_nats_py_does(url: str) -> None:
    assert is_local(url) and tls_options(url, None) == {}


@pytest.mark.parametrize("url", ["nats://core:hunter2@10.0.0.5:4222", "nats://127.0.0.2:4222", "10.0.0.5:4222",
                                 "tls://127.0.0.1:4222,nats://core:hunter2@nats.example.net:4222"])
def test_a_plain_url_to_another_host_is_refused_naming_the_setting_not_the_password(url: str) -> None:
    with pytest.raises(InsecureBrokerUrl, match="SHESHNAG_NATS_URL") as refused:
        tls_options(url, None)
    assert "hunter2" not in str(refused.value) and "not tls://" in str(refused.value)


def test_a_tls_broker_on_another_host_is_verified_and_reached_tls_first() -> None:
    options = tls_options("tls://core:pw@nats-1.example.net:4222,tls://nats-2.example.net:4222", None)
    assert options["tls_handshake_first"] is True
    assert options["tls"].check_hostname and options["tls"].verify_mode.name == "CERT_REQUIRED"


def test_a_declared_private_host_is_held_to_the_loopback_rule() -> None:
    assert tls_options("nats://core:pw@nats:4222", None, private=frozenset({"nats"})) == {}
    with pytest.raises(InsecureBrokerUrl):
        tls_options("nats://core:pw@nats:4222,nats://elsewhere:4222", None, private=frozenset({"nats"}))
