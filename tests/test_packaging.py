"""What a deployment installs: the wheel (`pip install .`, as the Dockerfile does) carries the SQL migrations and
named queries, the agent's BPF programs, the schemas and the simulators `fleetprof loadgen` runs, and an installed
copy runs from outside the checkout; the Dockerfile parses (the official BuildKit parser, through the `dockerfile`
package) and copies what exists; the wheel is built from just what it copies."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fleetprof.settings import REPO_ROOT
from fleetprof.store import migration_files, named_queries

PARSE_DOCKERFILE = ("import dockerfile, json, sys; "
                    "print(json.dumps([(c.cmd.upper(), c.value) for c in dockerfile.parse_file(sys.argv[1])]))")


def _dockerfile() -> list[tuple[str, tuple[str, ...]]]:
    # In a child: the parser is Go (a c-shared library), and a Go runtime in the test process dies when any test's
    # stray close() hits its epoll descriptor, long after this test (seen once at the session's exit).
    out = subprocess.run([sys.executable, "-c", PARSE_DOCKERFILE, str(REPO_ROOT / "Dockerfile")], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return [(cmd, tuple(value)) for cmd, value in json.loads(out)]


def _copied() -> list[str]:
    return [src for cmd, value in _dockerfile() if cmd == "COPY" for src in value[:-1]]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from exactly what the Dockerfile copies (so the image build has all it needs), outside the
    checkout (no build/ left in it)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in _copied():
        if (REPO_ROOT / name).is_dir():
            shutil.copytree(REPO_ROOT / name, src / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO_ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(src)], check=True, capture_output=True, timeout=300)
    (found,) = out.glob("fleetprof-*.whl")
    return found


def test_the_wheel_carries_sql_bpf_schemas_and_simulators(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    in_checkout = {f"fleetprof/sql/{p.relative_to(REPO_ROOT / 'sql')}" for p in (REPO_ROOT / "sql").rglob("*")
                   if p.is_file() and p.suffix in (".sql", ".xml", ".md")}
    assert len(in_checkout) > 40 and in_checkout <= names
    assert {"producers/bpf/cpu_sampler.bpf.c", "producers/bpf/gpu_probes.bpf.c"} <= names
    assert {f"schemas/{p.name}" for p in (REPO_ROOT / "schemas").glob("*.avsc")} <= names
    # the compiled Avro codec builds where the wheel is installed
    assert {"schemas/avro_fast.c", "schemas/avro_read.c", "schemas/avro_write.c", "schemas/avro_fast.h"} <= names
    assert {f"simulate/{p.name}" for p in (REPO_ROOT / "simulate").glob("*.py")} <= names


def test_an_installed_copy_migrates_a_store_and_knows_every_query_outside_the_checkout(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    probe = ("import json, fleetprof, producers.cpu_sampler as cs, simulate.loadgen;"
             "from fleetprof.store import migration_files, named_queries; from schemas import avro_fast;"
             "print(json.dumps([fleetprof.__file__, named_queries(), len(migration_files()),"
             " cs.BPF_SOURCE.is_file(), avro_fast.unavailable(), str(avro_fast.BUILD_DIR)]))")
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    where, queries, migrations, bpf, codec_missing, codec_dir = json.loads(done.stdout)
    assert Path(where).is_relative_to(target)  # the installed copy, not the checkout
    assert codec_missing is None and Path(codec_dir).is_relative_to(target)  # the codec builds where it is installed
    assert queries == named_queries() and migrations == len(migration_files()) and bpf
    migrate = subprocess.run([sys.executable, "-m", "fleetprof", "--data-dir", str(tmp_path / "data"), "db", "migrate"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert migrate.returncode == 0, migrate.stderr
    assert migrate.stdout.split() == [name for _, name, _ in migration_files()]


def test_the_dockerfile_parses_and_copies_what_exists():
    by = _dockerfile()
    assert by[0] == ("FROM", ("debian:bookworm-slim",))  # Python 3.11 and python3-bpfcc from one distribution
    copied = _copied()
    assert copied and all((REPO_ROOT / src).exists() for src in copied)
    packages = {"fleetprof", "processors", "producers", "schemas", "simulate", "sql", "pyproject.toml", "README.md"}
    assert set(copied) == packages
    assert ("ENTRYPOINT", ("fleetprof",)) in by
    install = next(v[0] for cmd, v in by if cmd == "RUN" and "pip install" in v[0])
    assert "python3-bpfcc" in next(v[0] for cmd, v in by if cmd == "RUN" and "apt-get install" in v[0])
    assert "/opt/fleetprof/bin/pip install --no-cache-dir /src" in install
    # the compiled codec is built into the install at image build (the processors run as a user who cannot write it)
    assert "avro_fast.unavailable()" in install and "libpython3-dev" in next(
        v[0] for cmd, v in by if cmd == "RUN" and "apt-get install" in v[0])
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".git", ".build"} <= set(ignored)
