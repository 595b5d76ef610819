#!/usr/bin/env bash
# The extender's and the scheduler's certificates without cert-manager, with openssl:
# a Linkpack CA, the extender's serving certificate and the scheduler's client certificate,
# stored as the Secrets the manifests mount (linkpack-extender-tls, linkpack-scheduler-client).
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/generate-certs.sh [--namespace NS] [--days N] [--out DIR] [--new-ca] [--apply]

Makes a Linkpack CA, the extender's serving certificate (for linkpack-extender.NS.svc) and the
scheduler's client certificate, and the two Secrets the manifests mount.

  --namespace NS  Linkpack's namespace (default linkpack-system)
  --days N        validity of the two certificates in days (default 365; the CA gets 10x)
  --out DIR       where the files go (default: a new temporary folder). A CA already in DIR
                  (ca.crt and ca.key) signs the new certificates, so rotating keeps the CA
  --new-ca        make a new CA even when DIR has one
  --apply         create or replace the Secrets with kubectl (run it again to rotate);
                  without it the kubectl commands are printed
  -h, --help      this text

The CA key stays in DIR: keep it safe (it signs certificates the extender trusts), or delete it.
EOF
}

fail() {
  echo "generate-certs.sh: $*" >&2
  echo "Try 'scripts/generate-certs.sh --help'." >&2
  exit 2
}

value_of() { # the value after option $1, or a clear error when there is none
  if [[ $# -lt 2 || -z "$2" || "$2" == --* ]]; then
    fail "$1 needs a value"
  fi
  printf '%s' "$2"
}

namespace=linkpack-system
days=365
out=""
apply=false
new_ca=false
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --namespace) namespace="$(value_of "$@")"; shift 2 ;;
    --days) days="$(value_of "$@")"; shift 2 ;;
    --out) out="$(value_of "$@")"; shift 2 ;;
    --apply) apply=true; shift ;;
    --new-ca) new_ca=true; shift ;;
    *) fail "unknown argument: $1" ;;
  esac
done
[[ "$days" =~ ^[1-9][0-9]*$ ]] || fail "--days must be a positive whole number, got '$days'"
[[ "$namespace" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || fail "--namespace '$namespace' is not a namespace name"
command -v openssl >/dev/null || fail "openssl is needed and was not found on PATH"
if $apply; then
  command -v kubectl >/dev/null || fail "--apply needs kubectl on PATH"
fi

out="${out:-$(mktemp -d)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$out"
umask 077
service="linkpack-extender.${namespace}.svc"

if ! $new_ca && [[ -s ca.crt && -s ca.key ]]; then
  echo "Signing with the CA already in $out (--new-ca makes a new one)."
else
  openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout ca.key -out ca.crt \
    -days "$((days * 10))" -subj "/CN=linkpack-ca" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
fi

openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout extender.key -out extender.csr \
  -subj "/CN=linkpack-extender" 2>/dev/null
openssl x509 -req -in extender.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out extender.crt -days "$days" \
  -extfile <(printf 'basicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:%s,DNS:%s.cluster.local\n' "$service" "$service") \
  2>/dev/null

openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout scheduler.key -out scheduler.csr \
  -subj "/CN=linkpack-scheduler" 2>/dev/null
openssl x509 -req -in scheduler.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out scheduler.crt -days "$days" \
  -extfile <(printf 'basicConstraints=critical,CA:FALSE\nextendedKeyUsage=clientAuth\n') 2>/dev/null

# `create --dry-run=client | apply` creates a Secret or replaces the one there (rotation).
secret() { # NAME CERT KEY
  printf 'kubectl -n %s create secret generic %s --from-file=tls.crt=%s --from-file=tls.key=%s --from-file=ca.crt=%s --dry-run=client -o yaml | kubectl -n %s apply -f -' \
    "$namespace" "$1" "$out/$2" "$out/$3" "$out/ca.crt" "$namespace"
}
commands=(
  "$(secret linkpack-extender-tls extender.crt extender.key)"
  "$(secret linkpack-scheduler-client scheduler.crt scheduler.key)"
)
echo "Certificates in $out; the CA key is $out/ca.key: keep it safe, or delete it."
if $apply; then
  for c in "${commands[@]}"; do eval "$c"; done
  echo "Secrets linkpack-extender-tls and linkpack-scheduler-client are in namespace $namespace."
  echo "They are read at start: a rolling restart of the extender and the scheduler loads rotated ones."
else
  echo "Create (or replace) the Secrets with:"
  printf '  %s\n' "${commands[@]}"
fi
