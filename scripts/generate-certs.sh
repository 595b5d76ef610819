#!/usr/bin/env bash
# The extender's and the scheduler's certificates without cert-manager, with openssl:
# a Linkpack CA, the extender's serving certificate and the scheduler's client certificate,
# stored as the Secrets the manifests mount (linkpack-extender-tls, linkpack-scheduler-client).
#
#   scripts/generate-certs.sh [--namespace linkpack-system] [--days 365] [--out DIR] [--apply]
#
# Without --apply the files are left in DIR (default: a new temporary folder) and the kubectl
# commands are printed. The CA key stays in DIR: keep it safe, or delete it and re-run to rotate.
set -euo pipefail
namespace=linkpack-system
days=365
out=""
apply=false
while [[ $# -gt 0 ]]; do
  case "$1" in
    --namespace) namespace="$2"; shift 2 ;;
    --days) days="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --apply) apply=true; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
out="${out:-$(mktemp -d)}"
mkdir -p "$out"
cd "$out"
umask 077
service="linkpack-extender.${namespace}.svc"

openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout ca.key -out ca.crt \
  -days "$((days * 10))" -subj "/CN=linkpack-ca" \
  -addext "basicConstraints=critical,CA:TRUE,pathlen:0" -addext "keyUsage=critical,keyCertSign,cRLSign"

openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout extender.key -out extender.csr \
  -subj "/CN=linkpack-extender"
openssl x509 -req -in extender.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out extender.crt -days "$days" \
  -extfile <(printf 'basicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:%s,DNS:%s.cluster.local\n' "$service" "$service")

openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout scheduler.key -out scheduler.csr \
  -subj "/CN=linkpack-scheduler"
openssl x509 -req -in scheduler.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out scheduler.crt -days "$days" \
  -extfile <(printf 'basicConstraints=critical,CA:FALSE\nextendedKeyUsage=clientAuth\n')

commands=(
  "kubectl -n $namespace create secret generic linkpack-extender-tls --from-file=tls.crt=$out/extender.crt --from-file=tls.key=$out/extender.key --from-file=ca.crt=$out/ca.crt"
  "kubectl -n $namespace create secret generic linkpack-scheduler-client --from-file=tls.crt=$out/scheduler.crt --from-file=tls.key=$out/scheduler.key --from-file=ca.crt=$out/ca.crt"
)
if $apply; then
  for c in "${commands[@]}"; do eval "$c"; done
else
  echo "Certificates in $out. Create the Secrets with:"
  printf '  %s\n' "${commands[@]}"
fi
