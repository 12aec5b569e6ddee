"""producers.process_info on this very process (plain /proc reads), the parsers on fixed text, and the CPU batch
record built from sampler-shaped tuples (no BPF needed)."""

from __future__ import annotations

import os
import subprocess
import sys

from producers.cpu import build_cpu_batch
from producers.elf_symbols import read_build_id
from producers.process_info import (
    BuildIdCache,
    ProcessCache,
    ProcessFilter,
    ProcessInfo,
    container_id,
    parse_cgroup,
    parse_maps,
    process_info,
)
from schemas.cpu_batch_writer import encode_cpu_batch
from schemas.single_object import decode
from schemas.wire import u64_to_long

DOCKER_ID = "3f2b" + "a" * 60


def test_current_process() -> None:
    info = process_info(os.getpid())
    assert info is not None
    with open("/proc/self/comm") as f:
        assert info.comm == f.read().strip()
    assert info.exe == os.path.realpath(sys.executable)
    exe_maps = [m for m in info.mappings if m.path == info.exe]
    assert exe_maps, "the interpreter's own text mapping is listed"
    assert exe_maps[0].build_id == read_build_id(info.exe)
    assert all(m.limit > m.start for m in info.mappings)
    assert all(m.build_id == "" for m in info.mappings if not m.path.startswith("/"))


def test_vanished_process_is_none() -> None:
    child = subprocess.Popen(["true"])
    pid = child.pid
    child.wait()  # reaped: the pid no longer exists
    assert process_info(pid) is None


def test_parse_maps_keeps_executable_mappings_only() -> None:
    text = (
        "55d0aa000000-55d0aa001000 r--p 00000000 08:01 123 /usr/bin/app\n"
        "55d0aa001000-55d0aa002000 r-xp 00001000 08:01 123 /usr/bin/app\n"
        "7f0000000000-7f0000001000 r-xp 00000000 00:00 0 \n"
        "7f0000002000-7f0000003000 r-xp 00002000 08:01 99 /tmp/gone (deleted)\n"
        "7fff00000000-7fff00001000 r-xp 00000000 00:00 0 [vdso]\n"
    )
    assert parse_maps(text) == [
        (0x55d0aa001000, 0x55d0aa002000, 0x1000, "/usr/bin/app"),
        (0x7f0000000000, 0x7f0000001000, 0, ""),
        (0x7f0000002000, 0x7f0000003000, 0x2000, "/tmp/gone (deleted)"),
        (0x7fff00000000, 0x7fff00001000, 0, "[vdso]"),
    ]


def test_cgroup_and_container_id() -> None:
    v2 = f"0::/system.slice/docker-{DOCKER_ID}.scope\n"
    assert parse_cgroup(v2) == f"/system.slice/docker-{DOCKER_ID}.scope"
    assert container_id(parse_cgroup(v2)) == DOCKER_ID
    v1 = f"12:cpu,cpuacct:/kubepods/pod1/{DOCKER_ID}\n11:memory:/kubepods/pod1/{DOCKER_ID}\n"
    assert container_id(parse_cgroup(v1)) == DOCKER_ID
    assert container_id("/user.slice/session-1.scope") == ""
    assert container_id("/x/" + "a" * 65) == ""  # not an id: too long


def test_build_id_cache_reads_once_and_tolerates_junk(tmp_path) -> None:
    cache = BuildIdCache()
    assert cache.get(sys.executable) == read_build_id(sys.executable)
    assert cache.get(sys.executable) == read_build_id(sys.executable)
    junk = tmp_path / "junk"
    junk.write_bytes(b"not an elf")
    assert cache.get(str(junk)) == ""
    assert cache.get(str(tmp_path / "missing")) == ""


def test_cpu_batch_matches_the_schema() -> None:
    kernel_addr = 0xFFFFFFFF81000130
    samples = [(42, 43, [0x401000, 0x401100], [kernel_addr], 7), (42, 42, [0x401000], [], 1),
               (99, 99, [], [kernel_addr], 2)]
    infos = {42: ProcessInfo(42, "app", "/usr/bin/app", "/", "", [])}
    batch = build_cpu_batch(samples, ProcessCache(infos.get), "n1", 1_000, 2_000, 99)
    assert [p["pid"] for p in batch["processes"]] == [42, 99]
    assert batch["processes"][1]["comm"] == ""  # already gone: a placeholder, its samples kept
    _, decoded = decode(encode_cpu_batch(batch), expect="CpuStackBatch")
    stacks = decoded["processes"][0]["stacks"]
    assert stacks[0]["kernel_addrs"] == [u64_to_long(kernel_addr)]
    assert sum(s["count"] for p in decoded["processes"] for s in p["stacks"]) == 10


def test_filters_keep_processes_by_comm_and_cgroup_prefix() -> None:
    infos = {1: ProcessInfo(1, "python3", "/usr/bin/python3", "/kubepods.slice/pod-a/ctr", "c" * 64, []),
             2: ProcessInfo(2, "python3", "/usr/bin/python3", "/system.slice/sshd.service", "", []),
             3: ProcessInfo(3, "nginx", "/usr/sbin/nginx", "/kubepods.slice/pod-b/ctr", "d" * 64, [])}
    samples = [(1, 1, [0x10], [], 5), (2, 2, [0x10], [], 3), (3, 3, [0x10], [], 2)]

    def pids(keep: ProcessFilter) -> list[int]:
        batch = build_cpu_batch(samples, ProcessCache(infos.get), "n", 0, 1, 19, keep=keep)
        return [p["pid"] for p in batch["processes"]]

    assert pids(ProcessFilter()) == [1, 2, 3]
    assert pids(ProcessFilter(comm="python3")) == [1, 2]
    assert pids(ProcessFilter(cgroup="/kubepods.slice")) == [1, 3]
    assert pids(ProcessFilter(comm="python3", cgroup="/kubepods.slice")) == [1]


def test_process_cache_forgets_pids_idle_for_too_long() -> None:
    reads: list[int] = []

    def lookup(pid: int) -> ProcessInfo:
        reads.append(pid)
        return ProcessInfo(pid, f"p{pid}", "", "/", "", [])

    cache = ProcessCache(lookup, idle_windows=2)
    cache.get(1)
    cache.get(2)
    for _ in range(2):  # pid 1 stays busy, pid 2 goes quiet
        cache.end_window()
        cache.get(1)
    assert len(cache) == 2
    cache.end_window()
    assert len(cache) == 1  # pid 2 idle for 3 windows > 2: forgotten
    cache.get(2)
    assert reads == [1, 2, 2]  # read again when it shows up: a reused pid gets fresh metadata
