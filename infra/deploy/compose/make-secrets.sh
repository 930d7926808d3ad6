#!/usr/bin/env bash
# Writes secrets/ for compose.yaml, every file 0600. Run it once; a second run keeps every secret and rewrites
# the files from them (after editing the routes, say). Nothing it writes is printed.
#   nats.conf     the three brokers' config: one file, each node's name from its SERVER_NAME (sheshnag nats-config)
#   core.env      SHESHNAG_NATS_URL with the core user: every service but the executor
#   callout.env   SHESHNAG_NATS_CALLOUT_SEED: the schedulers' alone (they admit executors by worker key)
#   s3.env        the services' S3 keys; minio.env the same pair as MinIO's root user
#   ledger.env    the ledger's PostgreSQL password; postgres.env the same for the postgres container
#   executor.env  SHESHNAG_EXECUTOR_WORKER_KEY, empty until you paste a worker key into it
#   nats-auth/    the NATS secrets the config and env files are made from (keep it; back it up)
# CLI says how to run sheshnag; by default the image compose.yaml builds (`docker compose build` first).
set -euo pipefail
cd "$(dirname "$0")"
umask 077
mkdir -p secrets
SECRETS="$PWD/secrets"
CLI=${CLI:-"docker run --rm --user $(id -u):$(id -g) -v $SECRETS:$SECRETS sheshnag:local"}

$CLI nats-config --data-dir "$SECRETS/nats-auth" --out "$SECRETS/nats.conf" --server-name '$SERVER_NAME' \
  --cluster-name sheshnag --routes nats-1:6222,nats-2:6222,nats-3:6222 --store-dir /data/jetstream \
  --monitor 0.0.0.0:8222 --env-dir "$SECRETS" --url nats://nats:4222 >/dev/null

random() { od -An -N24 -tx1 /dev/urandom | tr -d ' \n'; }

if [ ! -f secrets/s3.env ]; then
  access="AK$(random | cut -c1-16)" secret="$(random)"
  printf 'SHESHNAG_S3_ACCESS_KEY=%s\nSHESHNAG_S3_SECRET_KEY=%s\n' "$access" "$secret" > secrets/s3.env
  printf 'MINIO_ROOT_USER=%s\nMINIO_ROOT_PASSWORD=%s\n' "$access" "$secret" > secrets/minio.env
fi
if [ ! -f secrets/ledger.env ]; then
  password="$(random)"
  printf 'SHESHNAG_LEDGER_POSTGRES_PASSWORD=%s\n' "$password" > secrets/ledger.env
  printf 'POSTGRES_PASSWORD=%s\n' "$password" > secrets/postgres.env
fi
[ -f secrets/executor.env ] || printf 'SHESHNAG_EXECUTOR_WORKER_KEY=\n' > secrets/executor.env
echo "secrets written to $SECRETS"
