"""Each process of the embedded stack is given only the secrets its own job needs."""

from infra.process_env import SERVICE_NEEDS, StackSecrets, server_env, service_env

SECRETS = StackSecrets(core_nats_url="nats://core:corepass@127.0.0.1:4333",
                       executor_nats_url="nats://127.0.0.1:4333", s3_access_key="AKSTACK", s3_secret_key="s3-secret",
                       callout_seed="SASEED", worker_key="wk-worker")
OPERATOR = {"PATH": "/usr/bin", "HOME": "/home/op", "SHESHNAG_ADMIN_KEY": "gk-admin-raw",
            "SHESHNAG_GATEWAY_MAX_UPLOAD_BYTES": "1000", "SHESHNAG_LEDGER_POSTGRES_PASSWORD": "pg-secret",
            "SHESHNAG_S3_SECRET_KEY": "operators-own", "SHESHNAG_NATS_CALLOUT_SEED": "SAOTHER"}
SETTINGS = {"SHESHNAG_S3_ENDPOINT": "127.0.0.1:8333", "SHESHNAG_GATEWAY_PORT": "8080"}
SECRET_VALUES = ("corepass", "s3-secret", "SASEED", "wk-worker", "gk-admin-raw", "pg-secret", "operators-own",
                 "SAOTHER")


def secrets_in(env: dict[str, str]) -> set[str]:
    return {secret for secret in SECRET_VALUES if any(secret in value for value in env.values())}


def env_of(service: str) -> dict[str, str]:
    return service_env(service, OPERATOR, SECRETS, SETTINGS)


def test_the_executor_gets_its_worker_key_and_no_other_secret() -> None:
    env = env_of("executor")
    assert secrets_in(env) == {"wk-worker"}
    assert env["SHESHNAG_NATS_URL"] == "nats://127.0.0.1:4333"
    assert "SHESHNAG_S3_ENDPOINT" not in env and "SHESHNAG_S3_ACCESS_KEY" not in env


def test_no_service_is_given_the_admin_key_the_operator_passed_to_up() -> None:
    for service in SERVICE_NEEDS:
        assert "SHESHNAG_ADMIN_KEY" not in env_of(service)
        assert "gk-admin-raw" not in secrets_in(env_of(service))


def test_only_the_scheduler_holds_the_callout_seed() -> None:
    holders = {service for service in SERVICE_NEEDS if "SASEED" in secrets_in(env_of(service))}
    assert holders == {"scheduler"}


def test_the_s3_secret_goes_to_the_services_that_touch_objects_and_not_to_the_ledger() -> None:
    holders = {service for service in SERVICE_NEEDS if "s3-secret" in secrets_in(env_of(service))}
    assert holders == {"gateway", "validator", "scheduler"}


def test_the_core_broker_password_goes_to_the_four_core_services_not_the_executor() -> None:
    holders = {service for service in SERVICE_NEEDS if "corepass" in secrets_in(env_of(service))}
    assert holders == {"ledger", "validator", "scheduler", "gateway"}


def test_a_services_own_settings_reach_it_alone() -> None:
    assert env_of("ledger")["SHESHNAG_LEDGER_POSTGRES_PASSWORD"] == "pg-secret"
    assert env_of("gateway")["SHESHNAG_GATEWAY_MAX_UPLOAD_BYTES"] == "1000"
    for service in SERVICE_NEEDS.keys() - {"ledger"}:
        assert "pg-secret" not in secrets_in(env_of(service))


def test_secrets_the_operator_set_are_replaced_by_the_stacks_own_and_never_passed_on() -> None:
    assert env_of("gateway")["SHESHNAG_S3_SECRET_KEY"] == "s3-secret"
    assert env_of("scheduler")["SHESHNAG_NATS_CALLOUT_SEED"] == "SASEED"


def test_the_broker_and_object_store_get_the_operators_environment_without_any_secret() -> None:
    env = server_env(OPERATOR)
    assert secrets_in(env) == set()
    assert env["PATH"] == "/usr/bin"
    assert not {"SHESHNAG_ADMIN_KEY", "SHESHNAG_S3_SECRET_KEY", "SHESHNAG_NATS_CALLOUT_SEED"} & env.keys()


def test_the_go_servers_get_a_soft_memory_limit_unless_the_operator_sets_one() -> None:
    assert server_env(OPERATOR)["GOMEMLIMIT"] == "768MiB"
    assert server_env({**OPERATOR, "GOMEMLIMIT": "4GiB"})["GOMEMLIMIT"] == "4GiB"


def test_the_rest_of_the_operators_environment_passes_through() -> None:
    for service in SERVICE_NEEDS:
        assert env_of(service)["PATH"] == "/usr/bin" and env_of(service)["HOME"] == "/home/op"
