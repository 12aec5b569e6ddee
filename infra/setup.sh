#!/usr/bin/env bash
# Idempotent installer: Debian packages (Java for the Kafka broker, Maven for its jars), the .venv with fleetprof
# and its test extras, the Kafka jars in infra/kafka/lib, and (optional, non-fatal) bcc with kernel headers for the
# eBPF CPU sampler. Each step runs only when its result is missing or stale, so a second run is a quick no-op.
# Works from any cwd; on a fresh Debian 12 machine run it as root.
#   PYTHON=python3.12 bash infra/setup.sh   picks the interpreter for a new .venv (default: python3)
set -euo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.fleetprof-installed
KAFKA_LIB=infra/kafka/lib
POM=infra/kafka/pom.xml

say() { echo "fleetprof setup: $*"; }
die() { echo "fleetprof setup: error: $*" >&2; exit 1; }

# Run quietly; on failure show the tail of what the command said, then stop.
quiet() {
    local log
    log=$(mktemp)
    if ! "$@" >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        rm -f "$log"
        die "'$*' failed"
    fi
    rm -f "$log"
}

python_ok() {  # $1: interpreter; true when it is Python 3.11+
    "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null
}

java_ok() {  # true when `java` is Java 17+
    local version
    command -v java >/dev/null || return 1
    version=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\)\.\{0,1\}\([0-9]*\).*/\1 \2/p' | head -n 1)
    set -- $version  # word splitting wanted: "major minor"
    [ "${1:-0}" = 1 ] && set -- "${2:-0}"
    [ "${1:-0}" -ge 17 ]
}

# --- Debian packages, only those missing, with one apt-get update ---
packages=()
java_ok || packages+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || packages+=(maven)
command -v curl >/dev/null || packages+=(curl)
command -v c++filt >/dev/null || packages+=(binutils)  # tests check mangled names with c++filt
command -v eu-addr2line >/dev/null || packages+=(elfutils)  # the symbolizer is checked against eu-addr2line
command -v debuginfod >/dev/null || packages+=(debuginfod)
for tool in gzip xz openssl; do  # Debian's own binaries the unwinder is checked on, against perf
    command -v "$tool" >/dev/null || packages+=("$( [ "$tool" = xz ] && echo xz-utils || echo "$tool")")
done  # a real server for the debuginfod symbol source tests
command -v gcc >/dev/null || packages+=(gcc)  # ELF tests build libraries (no build id, 100k functions)
# Debian's own interpreter, the stock CPython the Python frame walker is checked on, and its internal headers (the
# struct offsets of producers/python_offsets.py are checked against them)
[ -x /usr/bin/python3.11 ] || packages+=(python3.11)
[ -e /usr/include/python3.11/internal/pycore_frame.h ] || packages+=(libpython3.11-dev)
command -v strace >/dev/null || packages+=(strace)  # a test kills the sink at one exact rename (its fault injection)
command -v chromium >/dev/null || packages+=(chromium)  # the web UI tests drive it headless (playwright)
# <sys/sdt.h>: the USDT probes of the CUPTI shim and the GPU simulator (native/include/fleetprof_probes.h)
compgen -G "/usr/include/*/sys/sdt.h" >/dev/null || [ -e /usr/include/sys/sdt.h ] || packages+=(systemtap-sdt-dev)
if command -v dpkg >/dev/null; then
    dpkg -s ca-certificates >/dev/null 2>&1 || packages+=(ca-certificates)
fi
if [ ! -x "$VENV/bin/python" ]; then
    command -v "$PYTHON" >/dev/null || packages+=(python3)
    # Debian splits venv/ensurepip out of python3; without it `python3 -m venv` fails.
    if ! command -v "$PYTHON" >/dev/null || ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
        packages+=(python3-venv)
    fi
fi

if [ ${#packages[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || die "not a Debian/Ubuntu system: install ${packages[*]} yourself, then rerun"
    [ "$(id -u)" -eq 0 ] \
        || die "need root to install ${packages[*]}: run as root, or: sudo apt-get install ${packages[*]}"
    say "installing ${packages[*]}"
    export DEBIAN_FRONTEND=noninteractive
    quiet apt-get update -q
    quiet apt-get install -y -q --no-install-recommends "${packages[@]}"
fi
java_ok || die "Java 17+ is still not the default 'java': select it with update-alternatives --config java"

# --- the virtual environment ---
if [ ! -x "$VENV/bin/python" ]; then
    command -v "$PYTHON" >/dev/null || die "$PYTHON not found: fleetprof needs Python 3.11+ (set PYTHON=...)"
    python_ok "$PYTHON" || die "fleetprof needs Python 3.11+, $PYTHON is $("$PYTHON" -V 2>&1)"
    say "creating $VENV with $("$PYTHON" -V 2>&1)"
    quiet "$PYTHON" -m venv "$VENV"
fi
python_ok "$VENV/bin/python" \
    || die "$VENV has $("$VENV/bin/python" -V 2>&1); fleetprof needs 3.11+: remove $VENV and rerun"

if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
    say "installing fleetprof and its test dependencies into $VENV"
    quiet "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]'
    touch "$STAMP"
fi

# --- bcc for the eBPF CPU sampler: optional, so a machine without root/apt still gets a working install ---
BCC_PATH=$VENV/bcc-path  # holds only a `bcc` symlink: the venv sees Debian's bcc without all of dist-packages

bcc_setup() {  # prints the reason and returns 1 when something is missing and cannot be fixed here
    local kernel headers p need=()
    kernel=$(uname -r)
    if command -v dpkg-query >/dev/null; then
        for p in python3-bpfcc bpfcc-tools linux-headers-amd64 linux-perf bpftool; do
            dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
        done
    elif [ ! -d /usr/lib/python3/dist-packages/bcc ]; then
        echo "not a Debian/Ubuntu system and no bcc in /usr/lib/python3/dist-packages"; return 1
    fi
    if [ ${#need[@]} -gt 0 ]; then
        [ "$(id -u)" -eq 0 ] || { echo "need root to install ${need[*]}"; return 1; }
        command -v apt-get >/dev/null || { echo "no apt-get to install ${need[*]}"; return 1; }
        say "installing ${need[*]}" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q >/dev/null 2>&1 || { echo "apt-get update failed"; return 1; }
        apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
            || { echo "apt-get install ${need[*]} failed"; return 1; }
    fi
    # A kernel without its own header package (e.g. a firecracker 6.18 guest): Debian's headers are close enough
    # for perf_event sampling, uprobes and USDT, which only use stable UAPI.
    if [ ! -e "/lib/modules/$kernel/build/include/generated/autoconf.h" ]; then
        headers=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1)
        [ -n "$headers" ] || { echo "no kernel headers for $kernel and none under /usr/src"; return 1; }
        [ "$(id -u)" -eq 0 ] || { echo "need root to link /lib/modules/$kernel/build to $headers"; return 1; }
        if [ -e "/lib/modules/$kernel/build" ] && [ ! -L "/lib/modules/$kernel/build" ]; then
            echo "/lib/modules/$kernel/build exists but lacks include/generated/autoconf.h"; return 1
        fi
        say "linking /lib/modules/$kernel/build -> $headers" >&2
        mkdir -p "/lib/modules/$kernel"
        ln -sfn "$headers" "/lib/modules/$kernel/build"
        ln -sfn "${headers%-amd64}-common" "/lib/modules/$kernel/source"
    fi
    # uprobe detach needs tracefs; debugfs carries the older tracing path
    for p in debugfs:/sys/kernel/debug tracefs:/sys/kernel/tracing; do
        mountpoint -q "${p#*:}" && continue
        [ "$(id -u)" -eq 0 ] || { echo "need root to mount ${p%%:*} on ${p#*:}"; return 1; }
        mount -t "${p%%:*}" "${p%%:*}" "${p#*:}" || { echo "mounting ${p%%:*} on ${p#*:} failed"; return 1; }
    done
    if [ "$(readlink "$BCC_PATH/bcc" 2>/dev/null)" != /usr/lib/python3/dist-packages/bcc ]; then
        mkdir -p "$BCC_PATH"
        ln -sfn /usr/lib/python3/dist-packages/bcc "$BCC_PATH/bcc"
    fi
}

if ! bcc_reason=$(bcc_setup); then
    say "BPF will be unavailable (the CPU sampler needs it): ${bcc_reason##*$'\n'}"
fi

# --- CPython 3.13 with -X perf and frame pointers for the perf-map test: optional, built once into a cache ---
# Its progress reaches the user on stderr; stdout carries only the reason when it fails.
if ! perf_python_reason=$(bash infra/perf_python.sh); then
    say "CPython with -X perf unavailable (its test will skip): ${perf_python_reason##*$'\n'}"
fi

# --- validators of the deployment files (kubeconform, kustomize, Kubernetes schemas, systemd-analyze), and pprof ---
if ! tools_reason=$(bash infra/tools.sh); then
    say "deployment validators unavailable (their tests will skip): ${tools_reason##*$'\n'}"
fi

# --- the Kafka jars: fetched again whenever the pom changed (the stamp holds the pom's hash) ---
pom_hash=$(sha256sum "$POM" | cut -d' ' -f1)
if ! compgen -G "$KAFKA_LIB/kafka_2.13-*.jar" >/dev/null \
        || [ "$(cat "$KAFKA_LIB/.pom.sha256" 2>/dev/null)" != "$pom_hash" ]; then
    say "fetching the Kafka jars into $KAFKA_LIB (Maven)"
    # One implementation of the fetch (staging dir, swap, stamp): the one the broker itself uses.
    "$VENV/bin/python" -c 'from fleetprof.broker_runtime import BrokerError, ensure_jars
try:
    ensure_jars()
except BrokerError as exc:
    raise SystemExit(f"fleetprof setup: error: {exc}")'
fi

say "ready: $VENV/bin/fleetprof kafka up  |  $VENV/bin/pytest"
