"""Where `sheshnag up` serves its metrics from one base port: the services' one each, then the embedded servers'."""

from infra.embedded import ServerMetrics
from infra.service_names import SERVICES
from infra.supervisor import metrics_env, server_metrics
from services.runtime.process.settings import ConnectionSettings


def test_the_servers_ports_follow_the_services_s3s_on_the_metrics_address_the_brokers_on_loopback() -> None:
    metrics = server_metrics(ConnectionSettings(metrics_port=9464, metrics_address="10.0.0.5"))
    assert metrics == ServerMetrics("10.0.0.5", 9464 + len(SERVICES), 9464 + len(SERVICES) + 1)
    assert metrics.broker_config() == f'http: "127.0.0.1:{9464 + len(SERVICES) + 1}"\n'


def test_without_a_base_port_nothing_is_served() -> None:
    assert server_metrics(ConnectionSettings(metrics_port=0)) == ServerMetrics()
    assert ServerMetrics().broker_config() == ""
    assert metrics_env({"A": "1"}, 0, 3) == {"A": "1"}


def test_each_service_takes_the_base_plus_its_index_whatever_the_base_came_from() -> None:
    ports = [metrics_env({}, 9464, index)["SHESHNAG_METRICS_PORT"] for index, _ in enumerate(SERVICES)]
    assert ports == [str(9464 + index) for index in range(len(SERVICES))]
    assert max(map(int, ports)) < server_metrics(ConnectionSettings(metrics_port=9464)).s3_port
