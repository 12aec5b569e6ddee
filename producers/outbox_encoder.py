"""Collected records as outbox units: the symbol tables they need and no earlier unit carried, then the records,
encoded and split to fit each topic's message limit.

Symbol tables come from the mapped files themselves, read through /proc/PID/root so a container's binary is the
container's file (a deleted one through /proc/PID/map_files), or once the process has exited through the same path
as the agent sees it when that file has the same build id; the kernel's table comes from /proc/kallsyms, one per
boot. A file that cannot be read is skipped quietly and counted once: its frames stay `[unknown] <binary>+0x…`
downstream until a later process that maps it lets it be read (one that is not ELF, never). A perf map's table (id
`perfmap:…`, JIT code and CPython's `-X perf`) comes from the PerfMapCache that read it for the batch, not from a file.

Workload identities are tables too, per node: the WorkloadIdentity record of each id a CPU batch, a launch or an
NVML poll references goes out (topic identities, key the id's 16 hex digits) in a symbols unit before the first
record unit that references it, named `identity:<key>` among its tables, and again if that unit was dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from producers.elf_symbols import ElfError, ElfUnreadable, read_build_id, read_elf_symbols, symbol_chunks
from producers.identity_refs import Identities, identity_record
from producers.kallsyms import KernelSymbols, kernel_symbol_chunks
from producers.outbox_units import Message, Unit
from producers.perf_map import DEFAULT_PERF_MAPS, PerfMapCache, is_perf_map_id
from producers.process_info import DELETED, mapped_file
from schemas import topics
from schemas.cpu_batch_writer import encode_cpu_batch, encode_cpu_batches, split_cpu_batch
from schemas.gpu_launch_writer import LaunchEncoder
from schemas.single_object import encode
from schemas.wire import DEFAULT_MAX_BYTES, identity_key

log = logging.getLogger("fleetprof.agent")

ChunkReader = Callable[[str, int], list[dict]]  # (file path, max bytes) -> SymbolChunk records; ElfError / OSError
Limits = Callable[[str], int]  # topic name -> the largest message value it takes
# An identity's definition goes again this often while records reference it: the store keeps a definition 90 days
# from when it was last written (migration 0015), and an agent runs for longer
IDENTITY_RESEND_S = 6 * 3600.0
# A drain's GPU records, NVML polls and dead letters go in units of about this many bytes: the outbox drops whole
# units, and the newest never while Kafka is away, so a drain after the agent was held up (12 s stopped: 4,825
# launches, 3.7 MB) must not be one unit, or the outbox holds it all beyond its bound.
UNIT_BYTES = 128 << 10


# build ids remembered as not readable through some process, with those processes (forgotten all at once past this)
MAX_UNREAD = 10_000


def _read_file_chunks(path: str, max_bytes: int) -> list[dict]:
    return symbol_chunks(read_elf_symbols(path), max_bytes)


def _files_to_read(pid: int, mapping: dict) -> Iterator[str]:
    """Where a mapped file's table is read: through the process (its root, or map_files for a deleted file); failing
    that (the process exited), the same path as the agent sees it when that file has the mapping's build id, as a
    host binary does."""
    yield mapped_file(pid, mapping["start"], mapping["limit"], mapping["path"])
    path = mapping["path"]
    if not path.startswith("/") or path.endswith(DELETED):
        return
    try:
        same = read_build_id(path) == mapping["build_id"]
    except (ElfError, OSError):
        return
    if same:
        yield path


class OutboxEncoder:
    """Turns records of each kind into Units; remembers which build ids' tables went out, until told they did not."""

    def __init__(self, kernel: KernelSymbols | None = None, max_bytes: Limits = lambda topic: DEFAULT_MAX_BYTES,
                 read_chunks: ChunkReader = _read_file_chunks, perf_maps: PerfMapCache | None = None,
                 identities: Identities | None = None) -> None:
        self.kernel = kernel
        self.max_bytes = max_bytes
        self._read_chunks = read_chunks
        self.perf_maps = perf_maps if perf_maps is not None else DEFAULT_PERF_MAPS  # the process cache's
        self.sent_build_ids: set[str] = set()  # queued, or not ELF: never read again this run
        self._sent_perf_ids: set[str] = set()  # perf maps queued, while some process still refers to them
        self.unreadable = 0  # mapped files (or perf maps) whose symbols could not be read, once per build id
        self._unread: dict[str, set[int]] = {}  # build id -> the processes it could not be read through, so far
        self.new_build_ids = 0
        self._launches = LaunchEncoder()
        self.identities = identities  # the records of the identity ids records carry (None: none are sent)
        self.sent_identities: dict[str, float] = {}  # their table names (identity_table) -> when queued
        self.unknown_identities = 0  # ids a record carried whose definition the resolver did not have

    def forget(self, build_ids: Iterable[str]) -> None:
        """These tables were dropped before they reached Kafka: send them again when next needed."""
        for bid in build_ids:
            self.sent_build_ids.discard(bid)
            self._sent_perf_ids.discard(bid)
            self.sent_identities.pop(bid, None)

    # identity tables

    def identity_units(self, ids: Iterable[int]) -> tuple[list[Unit], frozenset[str]]:
        """The symbols unit with the definitions of `ids` (identity_id longs) no earlier unit carried ([] when none),
        and the table names of every id that has one, for the needs of the records that reference them."""
        now = time.monotonic()
        if len(self.sent_identities) > 100_000:  # months of short jobs: start over (the topic is compacted)
            self.sent_identities.clear()
        names: set[str] = set()  # every id's that has a definition
        new: set[str] = set()  # those sent now
        messages: list[Message] = []
        for ident in set(ids):
            if not ident or self.identities is None:
                continue
            name = identity_table(ident)
            if now - self.sent_identities.get(name, -IDENTITY_RESEND_S) >= IDENTITY_RESEND_S:
                record = identity_record(self.identities, ident)
                if record is None:
                    self.unknown_identities += 1  # the record goes with an id the store cannot name (yet)
                    continue
                self.sent_identities[name] = now
                new.add(name)
                messages.append((topics.IDENTITIES.name, identity_key(ident), encode("WorkloadIdentity", record), 1))
            names.add(name)
        return ([Unit("symbols", messages, tables=frozenset(new))] if messages else []), frozenset(names)

    # symbol tables

    def tables_for(self, processes: list[dict], kernel_build_id: str = "") -> list[Unit]:
        """The symbols unit for what `processes` (dicts with "pid" and "mappings") and the kernel need that no earlier
        unit carried; [] when there is none."""
        limit = self.max_bytes(topics.SYMBOLS.name)
        chunks: list[dict] = []
        ids: set[str] = set()
        kid = kernel_build_id
        if kid and kid not in self.sent_build_ids and self.kernel is not None and self.kernel.build_id == kid:
            self.sent_build_ids.add(kid)
            chunks += kernel_symbol_chunks(self.kernel, limit)
            ids.add(kid)
        # a perf map's id is dropped once no process refers to its map: a JIT's map grows, and each version has an id
        self._sent_perf_ids &= self.perf_maps.ids()
        for proc in processes:
            for m in proc["mappings"]:
                bid = m["build_id"]
                sent = self._sent_perf_ids if is_perf_map_id(bid) else self.sent_build_ids
                if not bid or bid in sent or proc["pid"] in self._unread.get(bid, ()):
                    continue
                try:
                    found = self._tables_of(proc["pid"], m, limit)
                except ElfError as exc:  # the file's content is no usable ELF: so is every copy of that build id
                    log.debug("no symbols for %s: %s", m["path"], exc)
                    found = None
                    sent.add(bid)
                if found is None and is_perf_map_id(bid):  # not held (over PerfMapCache's budget): nor later
                    sent.add(bid)
                if found is None:
                    self._not_read(bid, proc["pid"], sent)
                    continue
                sent.add(bid)
                self._unread.pop(bid, None)
                ids.add(bid)
                for c in found:
                    sent.add(c["build_id"])  # the file may have changed since it was mapped
                    ids.add(c["build_id"])
                chunks += found
        self.new_build_ids += len(ids)
        if not chunks:
            return []
        messages = [(topics.SYMBOLS.name, f"{c['build_id']}/{c['chunk_index']}", encode("SymbolChunk", c), 1)
                    for c in chunks]
        return [Unit("symbols", messages, tables=frozenset(ids))]

    def _not_read(self, bid: str, pid: int, sent: set[str]) -> None:
        """A table that could not be had through `pid` is counted once, and asked again of the next other process
        that maps its build id: the first process to show a file may be gone before its window is encoded (a
        compiler's cc1 lives a fraction of a second), and its table is then read through a later one."""
        if bid in sent:  # a perf map not held, or a file no copy of which is usable ELF
            self.unreadable += 1
            return
        if len(self._unread) >= MAX_UNREAD:
            self._unread.clear()
        tried = self._unread.setdefault(bid, set())
        if not tried:
            self.unreadable += 1
        tried.add(pid)

    def _tables_of(self, pid: int, mapping: dict, limit: int) -> list[dict] | None:
        """The SymbolChunk records for one mapping's build id, or None when they cannot be had through this process
        (ElfError: when the file is not ELF that has them)."""
        if is_perf_map_id(mapping["build_id"]):
            return self.perf_maps.chunks(mapping["build_id"], limit)  # None: not held (over PerfMapCache's budget)
        for path in _files_to_read(pid, mapping):
            try:
                return self._read_chunks(path, limit)
            except (ElfUnreadable, OSError) as exc:
                log.debug("no symbols for %s through %s: %s", mapping["path"], path, exc)
        return None

    # records

    def cpu(self, batch: dict) -> list[Unit]:
        """A CpuStackBatch: the new tables of the files its samples hit (a process maps dozens, its samples land in
        a few), then the batch split to fit cpu.stacks."""
        hit = [{"pid": p["pid"], "mappings": _hit_mappings(p)} for p in batch["processes"]]
        kid = batch.get("kernel_build_id", "") if any(s["kernel_addrs"] for p in batch["processes"]
                                                      for s in p["stacks"]) else ""
        units = self.tables_for(hit, kid)
        if not batch["processes"]:
            return units
        id_units, id_needs = self.identity_units(p.get("identity_id", 0) for p in batch["processes"])
        node, limit = batch["node"], self.max_bytes(topics.CPU_STACKS.name)
        encoded = encode_cpu_batches(batch, limit)
        if len(encoded) == 1:
            messages: list[Message] = [(topics.CPU_STACKS.name, node, encoded[0], _samples(batch))]
        else:  # rare: a window larger than a message; each part's samples are counted on their own
            messages = [(topics.CPU_STACKS.name, node, encode_cpu_batch(part), _samples(part))
                        for part in split_cpu_batch(batch, limit)]
        return [*units, *id_units, Unit("cpu", messages, needs=_build_ids(hit, kid) | id_needs)]

    def gpu_launches(self, launches: list[dict]) -> list[Unit]:
        """GpuLaunch records keyed node/pid, after the tables of new build ids in their mappings."""
        with_maps = [{"pid": r["pid"], "mappings": r["mappings"]} for r in launches if r["mappings"]]
        units = self.tables_for(with_maps)
        if not launches:
            return units
        id_units, id_needs = self.identity_units(r.get("identity_id", 0) for r in launches)
        messages = [(topics.GPU_LAUNCHES.name, f"{r['node']}/{r['pid']}", self._launches.encode(r), 1)
                    for r in launches]
        return [*units, *id_units, *record_units("gpu_launches", messages, _build_ids(with_maps) | id_needs)]

    def gpu_kernels(self, kernels: list[dict]) -> list[Unit]:
        messages = [(topics.GPU_KERNELS.name, f"{r['node']}/{r['pid']}", encode("GpuKernel", r), 1) for r in kernels]
        return record_units("gpu_kernels", messages)

    def gpu_metrics(self, polls: list[dict]) -> list[Unit]:
        if not polls:
            return []
        id_units, id_needs = self.identity_units([d.get("identity_id", 0) for r in polls for d in r["devices"]] +
                                                 [p.get("identity_id", 0) for r in polls for p in r["processes"]])
        messages = [(topics.GPU_METRICS.name, r["node"], encode("GpuMetrics", r), 1) for r in polls]
        return [*id_units, *record_units("gpu_metrics", messages, id_needs)]

    def dead_letters(self, letters: list[dict]) -> list[Unit]:
        """Records the agent would not send as they are (producers/kernel_records.py), with the reason."""
        messages = [(topics.DEADLETTER.name, (r["key"] or b"").decode(errors="replace"), encode("DeadLetter", r), 1)
                    for r in letters]
        return record_units("dead_letters", messages)

    def units(self, kind: str, records: list[dict]) -> list[Unit]:
        """Units for records of `kind` (cpu: one CpuStackBatch per record)."""
        if kind == "cpu":
            return [u for batch in records for u in self.cpu(batch)]
        return {"gpu_launches": self.gpu_launches, "gpu_kernels": self.gpu_kernels,
                "gpu_metrics": self.gpu_metrics, "dead_letters": self.dead_letters}[kind](records)


def record_units(kind: str, messages: list[Message], needs: frozenset[str] = frozenset(),
                 unit_bytes: int = UNIT_BYTES) -> list[Unit]:
    """`messages` in order, in units of at most `unit_bytes` (a larger message alone), each needing `needs`."""
    units, start, size = [], 0, 0
    for i, message in enumerate(messages):
        if size and size + len(message[2]) > unit_bytes:
            units.append(Unit(kind, messages[start:i], needs=needs))
            start, size = i, 0
        size += len(message[2])
    if start < len(messages):
        units.append(Unit(kind, messages[start:], needs=needs))
    return units


def identity_table(identity_id: int) -> str:
    """The name an identity's definition has among a symbols unit's tables and a record unit's needs."""
    return f"identity:{identity_key(identity_id)}"


def _samples(batch: dict) -> int:
    return sum(s["count"] for p in batch["processes"] for s in p["stacks"])


def _build_ids(processes: list[dict], kernel_build_id: str | None = None) -> frozenset[str]:
    ids = {m["build_id"] for p in processes for m in p["mappings"] if m["build_id"]}
    return frozenset(ids | {kernel_build_id} if kernel_build_id else ids)


def _hit_mappings(proc: dict) -> list[dict]:
    """The mappings of a CpuStackBatch process that hold at least one of its sampled user addresses (a return
    address may sit just past its mapping's last byte: limits count as inside)."""
    mappings = proc["mappings"]
    addrs = [a for s in proc["stacks"] for a in s["user_addrs"]]
    if not mappings or not addrs:
        return []
    values = np.unique(np.array(addrs, dtype=np.int64).view(np.uint64))
    starts = np.array([m["start"] for m in mappings], dtype=np.int64).view(np.uint64)
    limits = np.array([m["limit"] for m in mappings], dtype=np.int64).view(np.uint64)
    lo, hi = np.searchsorted(values, starts, "left"), np.searchsorted(values, limits, "right")
    return [m for m, a, b in zip(mappings, lo.tolist(), hi.tolist(), strict=True) if b > a]
