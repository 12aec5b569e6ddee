#!/usr/bin/env bash
# Builds a CPython 3.13 that supports `-X perf` (the perf trampoline, which writes /tmp/perf-PID.map) with frame
# pointers, so that the eBPF frame-pointer unwinder sees through the interpreter, and links .venv/bin/python-perf to
# it. Debian 12 has only 3.11, so the source is trixie's python3.13 orig tarball, found through the signed InRelease
# and Sources.xz of the Debian mirror this machine's apt uses, and checked against their sha256s. The build goes to a
# cache outside the
# repository, shared by every clone; with a working build in place this only (re)creates the link.
# Called by infra/setup.sh once the venv exists; installs missing Debian build packages as root.
#   FLEETPROF_PERF_PYTHON_PREFIX=/opt/py313 bash infra/perf_python.sh   where the build goes (default below)
# Progress and a failed step's log tail go to stderr; on failure the reason is the last line of stdout (exit 1).
set -euo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

PREFIX=${FLEETPROF_PERF_PYTHON_PREFIX:-/var/cache/fleetprof/cpython-3.13}
PREFIX=${PREFIX%/}
LINK=$PWD/.venv/bin/python-perf
MIRROR=""  # the machine's own Debian mirror (debian_mirror); plain http is fine: trust comes from InRelease's
           # signature, then sha256s
SUITE=trixie
PACKAGE=python3.13
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
FP_CFLAGS="-fno-omit-frame-pointer -mno-omit-leaf-frame-pointer"
MARKER=.fleetprof-perf-python  # in $PREFIX: what it was built from; only a prefix carrying it is ever replaced
LOG=$PREFIX.build.log          # kept when a build fails

work=""
stage=""
src_version="" src_file="" src_sha=""  # set by fetch_source

say() { echo "fleetprof perf-python: $*" >&2; }
fail() { echo "$*"; exit 1; }  # the reason, for the caller

# Run a step with its output in $LOG; on failure show the log's tail and stop with the step's name.
step() {
    local name=$1
    shift
    if ! "$@" >>"$LOG" 2>&1; then
        tail -n 20 "$LOG" >&2
        fail "$name failed (log: $LOG)"
    fi
}

interpreter_ok() {  # $1: interpreter; true when it is 3.12+ with the perf trampoline on, built with frame pointers
    local pid
    pid=$("$1" -X perf -c '
import os, sys, sysconfig
assert sys.version_info >= (3, 12)
assert sys.is_stack_trampoline_active()
assert "-fno-omit-frame-pointer" in (sysconfig.get_config_var("CONFIGURE_CFLAGS") or "")
print(os.getpid())' 2>/dev/null) || return 1
    rm -f "/tmp/perf-$pid.map"  # this check's own perf map
}

link_venv() {
    [ "$(readlink "$LINK" 2>/dev/null)" = "$PREFIX/bin/python3.13" ] || ln -sfn "$PREFIX/bin/python3.13" "$LINK" \
        || fail "cannot link $LINK to $PREFIX/bin/python3.13"
    # Run through the link, the interpreter reads .venv/pyvenv.cfg and looks for its stdlib next to the venv's
    # 'home' first: make sure it still finds its own.
    "$LINK" -c 'import os, sys; assert os.__file__.startswith(sys.argv[1] + "/")' "$PREFIX" 2>/dev/null \
        || fail "$LINK does not load its stdlib from $PREFIX (another python3.13 next to .venv/pyvenv.cfg's home?)"
}

install_missing() {  # the Debian packages the download and a core-only build need (no ssl, sqlite, tk)
    local p need=()
    if ! command -v dpkg-query >/dev/null; then
        for p in gcc make curl xz gpgv; do
            command -v "$p" >/dev/null || fail "not a Debian/Ubuntu system and no $p: install it, then rerun"
        done
        [ -f "$KEYRING" ] || fail "no Debian archive keyring at $KEYRING to check trixie's InRelease"
        return 0
    fi
    for p in gcc make libc6-dev curl xz-utils gpgv debian-archive-keyring zlib1g-dev libffi-dev; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
    done
    [ ${#need[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || fail "need root to install ${need[*]}: sudo apt-get install ${need[*]}"
    say "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    step "apt-get update" apt-get update -q
    step "apt-get install ${need[*]}" apt-get install -y -q --no-install-recommends "${need[@]}"
}

# The Debian archive this machine's apt is configured with (a mirror, a proxy or a snapshot: whatever it uses), from
# the repository whose Release file says Origin/Label Debian; failing that (no `apt-get update` yet), the first URI
# of a deb source serving main in /etc/apt/sources.list, sources.list.d/*.list or *.sources (not -security).
debian_mirror() {
    local uri
    uri=$(apt-get indextargets --format '$(REPO_URI)' 'Origin: Debian' 'Label: Debian' 2>/dev/null | head -n 1)
    if [ -z "$uri" ]; then
        uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk '
            $1 == "deb" && / main/ && !/-security/ {
                for (i = 2; i <= NF; i++) if ($i ~ /^[a-z+]+:\/\//) { print $i; exit }
            }')
    fi
    if [ -z "$uri" ]; then
        uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk 'BEGIN { RS = ""; FS = "\n" }
            /(^|\n)Types:[^\n]*deb/ && /(^|\n)Components:[^\n]*main/ && !/(^|\n)Suites:[^\n]*-security/ {
                for (i = 1; i <= NF; i++) if ($i ~ /^URIs:/) { split($i, f, " "); print f[2]; exit }
            }')
    fi
    [ -n "$uri" ] || fail "no Debian mirror in this machine's apt configuration (/etc/apt/sources.list*)"
    echo "${uri%/}"
}

# Prints "VERSION DIRECTORY FILE SHA256" of the newest $PACKAGE orig tarball in a Sources file on stdin.
parse_sources() {
    awk -v pkg="$PACKAGE" 'BEGIN { RS = ""; FS = "\n" }
    {
        name = version = dir = file = sum = ""; in_sha = 0
        for (i = 1; i <= NF; i++) {
            if ($i ~ /^ / && in_sha) {
                split($i, f, " ")
                if (f[3] ~ /\.orig\.tar\.xz$/) { sum = f[1]; file = f[3] }
                continue
            }
            in_sha = 0
            if ($i ~ /^Package: /) name = substr($i, 10)
            else if ($i ~ /^Version: /) version = substr($i, 10)
            else if ($i ~ /^Directory: /) dir = substr($i, 12)
            else if ($i ~ /^Checksums-Sha256:/) in_sha = 1
        }
        if (name == pkg && version != "" && dir != "" && file != "") print version, dir, file, sum
    }' | sort -V | tail -n 1
}

# Downloads the newest orig tarball of $PACKAGE in $SUITE to $1, verified; sets src_version, src_file, src_sha.
fetch_source() {
    local dest=$1 sources_sha found version dir file sha
    MIRROR=$(debian_mirror) || fail "$MIRROR"
    say "Debian mirror from apt: $MIRROR"
    step "downloading $SUITE's InRelease" curl -fsS --retry 3 -o "$work/InRelease" "$MIRROR/dists/$SUITE/InRelease"
    step "checking the signature of $SUITE's InRelease" \
        gpgv --keyring "$KEYRING" --output "$work/Release" "$work/InRelease"
    sources_sha=$(awk '/^SHA256:/ { s = 1; next } /^[^ ]/ { s = 0 }
        s && $3 == "main/source/Sources.xz" { print $1 }' "$work/Release")
    [ -n "$sources_sha" ] || fail "no main/source/Sources.xz in $SUITE's InRelease"
    step "downloading $SUITE's Sources.xz" \
        curl -fsS --retry 3 -o "$work/Sources.xz" "$MIRROR/dists/$SUITE/main/source/Sources.xz"
    echo "$sources_sha  $work/Sources.xz" | sha256sum -c --status \
        || fail "$SUITE's Sources.xz does not match its InRelease (mirror mid-update? rerun later)"
    found=$(xz -dc "$work/Sources.xz" | parse_sources) || fail "cannot read $SUITE's Sources.xz"
    read -r version dir file sha <<<"$found" || true
    [[ ${file:-} =~ ^[A-Za-z0-9._+~-]+\.orig\.tar\.xz$ && ${dir:-} =~ ^pool/[A-Za-z0-9._+/-]+$ && ${dir:-} != *..* \
        && ${sha:-} =~ ^[0-9a-f]{64}$ ]] || fail "no usable $PACKAGE orig tarball in $SUITE's Sources.xz"
    step "downloading $file" curl -fsS --retry 3 -o "$dest" "$MIRROR/$dir/$file"
    echo "$sha  $dest" | sha256sum -c --status || fail "$file does not match its sha256 in $SUITE's Sources.xz"
    src_version=$version src_file=$file src_sha=$sha
}

cleanup() { rm -rf "$work" "$stage"; }

build() {
    local staged
    fetch_source "$work/orig.tar.xz"
    mkdir "$work/src" "$work/build"
    step "unpacking $src_file" tar -xJf "$work/orig.tar.xz" -C "$work/src" --strip-components=1
    cd "$work/build"
    step configure "$work/src/configure" --prefix="$PREFIX" --without-ensurepip --disable-test-modules \
        CFLAGS="$FP_CFLAGS"
    grep -q '^checking perf trampoline\.\.\. yes$' "$LOG" || fail "configure: no perf trampoline on this platform"
    step make make -j"$(nproc)"
    # Staged next to $PREFIX (same filesystem), so the final move is one rename.
    stage=$(mktemp -d "$PREFIX.stage.XXXXXX")
    step "make install" make install DESTDIR="$stage"
    staged=$stage$PREFIX
    interpreter_ok "$staged/bin/python3.13" || fail "the new interpreter does not run with -X perf (log: $LOG)"
    printf 'source: %s %s (%s) sha256 %s\nCFLAGS: %s\n' "$SUITE" "$src_file" "$src_version" "$src_sha" \
        "$FP_CFLAGS" >"$staged/$MARKER"
    cd /
    [ ! -e "$PREFIX" ] || mv "$PREFIX" "$stage/old"
    mv "$staged" "$PREFIX"
}

main() {
    [[ $PREFIX == /* ]] || fail "FLEETPROF_PERF_PYTHON_PREFIX must be an absolute path, not '$PREFIX'"
    [ -d "$(dirname "$LINK")" ] || fail "no $(dirname "$LINK"): run infra/setup.sh first (it creates the venv)"
    if interpreter_ok "$PREFIX/bin/python3.13"; then
        link_venv
        return 0
    fi
    umask 022  # a cache shared by every user and clone
    if ! mkdir -p "$(dirname "$PREFIX")" 2>/dev/null || [ ! -w "$(dirname "$PREFIX")" ]; then
        fail "cannot write $(dirname "$PREFIX"): run as root or set FLEETPROF_PERF_PYTHON_PREFIX"
    fi
    exec 9>"$PREFIX.lock"
    if ! flock -n 9; then
        say "waiting for another build of $PREFIX"
        flock 9
    fi
    if ! interpreter_ok "$PREFIX/bin/python3.13"; then  # the other build may have just made it
        [ ! -e "$PREFIX" ] || [ -f "$PREFIX/$MARKER" ] \
            || fail "$PREFIX exists but was not built by this script: remove it or set FLEETPROF_PERF_PYTHON_PREFIX"
        rm -rf "$PREFIX".stage.*  # left by an interrupted build; the lock keeps others' away
        : >"$LOG"
        install_missing
        say "building CPython 3.13 with -X perf and frame pointers into $PREFIX (once; takes a few minutes)"
        work=$(mktemp -d)
        trap cleanup EXIT
        trap 'exit 130' INT TERM
        build
        rm -f "$LOG"
    fi
    link_venv
}

main "$@"
