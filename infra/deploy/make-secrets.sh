#!/usr/bin/env bash
# Writes the secrets of a deployment into <compose|kubernetes>/secrets/, every file 0600 (that folder is never
# committed). Run it once; a second run keeps every secret and rewrites the files from them. Nothing is printed.
#   nats.conf     all three brokers' config: one file, each node's name from its SERVER_NAME (sheshnag nats-config)
#   core.env      SHESHNAG_NATS_URL with the core user: every service but the executor
#   callout.env   SHESHNAG_NATS_CALLOUT_SEED: the schedulers' alone (they admit executors by worker key)
#   s3.env        the services' S3 keys; minio.env the same pair as MinIO's root user
#   ledger.env    the ledger's PostgreSQL password; postgres.env the same for PostgreSQL
#   executor.env  SHESHNAG_EXECUTOR_WORKER_KEY, empty until you paste a worker key into it
#   nats-auth/    the NATS secrets the files above are made from: keep it, back it up
#   tls/          the deployment's CA and the NATS nodes' certificate (sheshnag certs issue); ca-key.pem stays
# CLI says how to run sheshnag; by default the image infra/deploy/Dockerfile builds, tagged sheshnag:local.
set -euo pipefail
target=${1:-}
cd "$(dirname "$0")"
case "$target" in
  compose)
    # Every hop TLS: the nodes' certificate names the services' host (nats) and each route host.
    routes=nats-1:6222,nats-2:6222,nats-3:6222 url=tls://nats:4222 names=(nats nats-1 nats-2 nats-3)
    extra=(--tls-cert /etc/nats/tls/server.pem --tls-key /etc/nats/tls/server-key.pem --tls-ca /etc/nats/tls/ca.pem) ;;
  kubernetes)
    routes=sheshnag-nats-0.sheshnag-nats-cluster:6222,sheshnag-nats-1.sheshnag-nats-cluster:6222
    routes=$routes,sheshnag-nats-2.sheshnag-nats-cluster:6222 url=tls://sheshnag-nats:4222
    # The clients' Service name (short and in-namespace) and each pod's route host.
    names=(sheshnag-nats sheshnag-nats.sheshnag.svc sheshnag-nats-0.sheshnag-nats-cluster
           sheshnag-nats-1.sheshnag-nats-cluster sheshnag-nats-2.sheshnag-nats-cluster)
    extra=(--pid-file /var/run/nats/nats.pid --tls-cert /etc/nats-tls/server.pem
           --tls-key /etc/nats-tls/server-key.pem --tls-ca /etc/nats-tls/ca.pem) ;;
  *) echo "usage: $0 compose|kubernetes" >&2; exit 2 ;;
esac
umask 077
SECRETS="$PWD/$target/secrets"
mkdir -p "$SECRETS"
CLI=${CLI:-"docker run --rm --user $(id -u):$(id -g) -v $SECRETS:$SECRETS sheshnag:local"}

if [ ${#names[@]} -gt 0 ]; then
  # tls/: the deployment's CA (its key stays here) and the nodes' certificate; the CA is public, the services mount it.
  $CLI certs issue --data-dir "$SECRETS" --names "${names[@]}" >/dev/null
  chmod 644 "$SECRETS/tls/ca.pem"
fi
$CLI nats-config --data-dir "$SECRETS/nats-auth" --out "$SECRETS/nats.conf" --server-name '$SERVER_NAME' \
  --cluster-name sheshnag --routes "$routes" --store-dir /data/jetstream --monitor 0.0.0.0:8222 \
  ${extra[@]+"${extra[@]}"} --env-dir "$SECRETS" --url "$url" >/dev/null

random() { od -An -N24 -tx1 /dev/urandom | tr -d ' \n'; }
if [ ! -f "$SECRETS/s3.env" ]; then
  access="AK$(random | cut -c1-16)" secret="$(random)"
  printf 'SHESHNAG_S3_ACCESS_KEY=%s\nSHESHNAG_S3_SECRET_KEY=%s\n' "$access" "$secret" > "$SECRETS/s3.env"
  printf 'MINIO_ROOT_USER=%s\nMINIO_ROOT_PASSWORD=%s\n' "$access" "$secret" > "$SECRETS/minio.env"
fi
if [ ! -f "$SECRETS/ledger.env" ]; then
  password="$(random)"
  printf 'SHESHNAG_LEDGER_POSTGRES_PASSWORD=%s\n' "$password" > "$SECRETS/ledger.env"
  printf 'POSTGRES_PASSWORD=%s\n' "$password" > "$SECRETS/postgres.env"
fi
[ -f "$SECRETS/executor.env" ] || printf 'SHESHNAG_EXECUTOR_WORKER_KEY=\n' > "$SECRETS/executor.env"
echo "secrets written to $SECRETS"
