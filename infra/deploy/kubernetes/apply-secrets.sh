#!/usr/bin/env bash
# Creates (or updates) the Secrets the manifests read, in namespace sheshnag, from the files
# `../make-secrets.sh kubernetes` wrote into ./secrets. Run it again after changing one (a worker key, say).
#   sheshnag-nats-config  nats.conf          sheshnag-core  core.env       sheshnag-callout  callout.env
#   sheshnag-s3           s3.env             sheshnag-minio minio.env      sheshnag-executor executor.env
#   sheshnag-ledger-db    ledger.env         sheshnag-postgres postgres.env
set -euo pipefail
cd "$(dirname "$0")"
NAMESPACE=sheshnag
apply() { kubectl -n "$NAMESPACE" create secret generic "$1" "$2" --dry-run=client -o yaml | kubectl apply -f - >/dev/null; }
kubectl get namespace "$NAMESPACE" >/dev/null 2>&1 || kubectl create namespace "$NAMESPACE" >/dev/null
apply sheshnag-nats-config --from-file=nats.conf=secrets/nats.conf
apply sheshnag-nats-tls --from-file=server.pem=secrets/tls/server.pem \
  --from-file=server-key.pem=secrets/tls/server-key.pem --from-file=ca.pem=secrets/tls/ca.pem
apply sheshnag-ca --from-file=ca.pem=secrets/tls/ca.pem
for pair in core:core callout:callout s3:s3 minio:minio ledger-db:ledger postgres:postgres executor:executor; do
  apply "sheshnag-${pair%%:*}" --from-env-file="secrets/${pair#*:}.env"
done
echo "secrets applied to namespace $NAMESPACE"
