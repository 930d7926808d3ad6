"""The embedded broker's authorization: a `core` user for the five services, auth callout for everyone else, and a
system account user (derived from the callout's seed, `services/authz/keyring.py`) for the callout's responder.

Both secrets (the core password and the callout issuer's nkey seed) are generated once per data dir and kept
there (0600), so a restarted broker, and services restarted against it, agree. The config file is rewritten
from them at each start; nothing here is ever printed.
"""

import hashlib
import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from infra.private import write_private
from services.authz.keyring import SYSTEM_ACCOUNT, SYSTEM_USER, CalloutKeys
from services.authz.nkey_jwt import new_account_seed

CORE_USER = "core"
SECRETS_FILE = "nats-auth.json"
CONFIG_FILE = "nats-server.conf"


@dataclass(frozen=True)
class NatsAuth:
    core_password: str = field(repr=False)
    issuer_seed: str = field(repr=False)

    @classmethod
    def load_or_create(cls, data_dir: Path) -> "NatsAuth":
        path = data_dir / SECRETS_FILE
        if path.exists():
            data = json.loads(path.read_text())
            return cls(data["core_password"], data["issuer_seed"])
        auth = cls(secrets.token_hex(24), new_account_seed())
        secrets_json = json.dumps({"core_password": auth.core_password, "issuer_seed": auth.issuer_seed})
        write_private(path, secrets_json.encode())
        return auth

    def core_url(self, port: int) -> str:
        """The services' URL: the core user's credentials ride in it (hex, so nothing needs escaping)."""
        return f"nats://{CORE_USER}:{self.core_password}@127.0.0.1:{port}"

    @property
    def route_password(self) -> str:
        """What a clustered broker's route connections present to each other (derived from the issuer seed, like
        the system user's password: a cluster's brokers and the scheduler hold that seed already)."""
        return hashlib.sha256(b"sheshnag cluster routes\0" + self.issuer_seed.encode()).hexdigest()

    def authorization(self) -> str:
        """The accounts and authorization the services expect of every broker, embedded or operator-run: the core
        user, auth callout for everyone else, and the system account the callout's responder kicks with."""
        keys = CalloutKeys(self.issuer_seed)
        return f"""accounts {{
  # Only the callout's responder is in it: it disconnects executors whose worker key was revoked.
  {SYSTEM_ACCOUNT} {{ users: [ {{ user: "{SYSTEM_USER}", password: "{keys.system_password}" }} ] }}
}}
system_account: {SYSTEM_ACCOUNT}
authorization {{
  users: [ {{ user: "{CORE_USER}", password: "{self.core_password}" }} ]
  auth_callout {{
    # Executors connect as <executor id> / <worker key>; the scheduler answers with their permissions.
    issuer: "{keys.issuer}"
    auth_users: [ "{CORE_USER}", "{SYSTEM_USER}" ]
    # Each request (it carries the worker key) is sealed to the responder's curve key, each answer to the server's.
    xkey: "{keys.curve.public_key}"
  }}
}}
"""

    def write_server_config(self, data_dir: Path, tls: str = "") -> Path:
        """The config file `nats-server -c` reads; flags on its command line (port, store) add to it. `tls`: the
        client port's `tls` block (`nats_config.client_tls`), for a broker that requires TLS."""
        path = data_dir / CONFIG_FILE
        write_private(path, (f"# Written by sheshnag at each start from {SECRETS_FILE}; edits are lost.\n"
                             + tls + self.authorization()).encode())
        return path
