"""What the agent sends per window: symbol tables first (each build id once per run, durably), then the batch.

Symbol tables come from the mapped files themselves, read through /proc/PID/root so a container's binary is the
container's file (a deleted one through /proc/PID/map_files); the kernel's table comes from /proc/kallsyms, one per
boot. A file that cannot be read (process gone, permission, not ELF) is skipped quietly and counted: its frames stay
`[unknown] <binary>+0x…` downstream. A perf map's table (id `perfmap:…`, JIT code and CPython's `-X perf`) comes
from the PerfMapCache that read it for the batch, not from a file.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from producers.elf_symbols import ElfError, read_elf_symbols, symbol_chunks
from producers.kallsyms import KernelSymbols, kernel_symbol_chunks
from producers.outage_buffer import HeldWindow
from producers.perf_map import DEFAULT_PERF_MAPS, PerfMapCache, is_perf_map_id
from producers.process_info import mapped_file
from producers.publisher import Publisher, PublishError
from schemas import topics
from schemas.cpu_batch_writer import DEFAULT_MAX_BYTES, encode_cpu_batches
from schemas.single_object import encode

log = logging.getLogger("fleetprof.agent")

ChunkReader = Callable[[str], list[dict]]  # a file path -> its SymbolChunk records (raises ElfError / OSError)


@dataclass
class WindowSent:
    samples: int
    processes: int
    batches: int  # cpu.stacks messages
    symbol_chunks: int
    new_build_ids: int
    bytes: int  # values of every message of this window


class AgentSender:
    """Sends CpuStackBatch records and, before each, the symbol tables it references that were not sent yet."""

    def __init__(self, publisher: Publisher, kernel: KernelSymbols | None = None,
                 max_message_bytes: int = DEFAULT_MAX_BYTES, flush_timeout: float = 60.0,
                 read_chunks: ChunkReader = lambda path: symbol_chunks(read_elf_symbols(path)),
                 perf_maps: PerfMapCache | None = None) -> None:
        self.publisher = publisher
        self.kernel = kernel
        self.max_message_bytes = max_message_bytes
        self.flush_timeout = flush_timeout
        self._read_chunks = read_chunks
        self.perf_maps = perf_maps if perf_maps is not None else DEFAULT_PERF_MAPS  # the process cache's
        self.sent_build_ids: set[str] = set()  # published, or tried and unreadable: never retried this run
        self._sent_perf_ids: set[str] = set()  # perf maps published, while some process still refers to them
        self.unreadable = 0  # mapped files (or perf maps) whose symbols could not be read
        self.symbol_chunks = 0
        self.batches = 0
        self.samples = 0

    def _send(self, topic: topics.Topic, key: str, value: bytes) -> int:
        self.publisher.publish(topic.name, key, value)
        return len(value)

    def _symbols(self, batch: dict) -> tuple[int, int, int]:
        """Queue the tables `batch` needs and has not had yet: (chunks, build ids, bytes)."""
        chunks, new_ids = self._new_tables(batch)
        size = sum(self._send(topic, key, value) for topic, key, value in _symbol_messages(chunks))
        return len(chunks), new_ids, size

    def _new_tables(self, batch: dict) -> tuple[list[dict], int]:
        """The SymbolChunk records `batch` needs and has not had yet (marked had from now on), and how many ids."""
        chunks: list[dict] = []
        new_ids = 0
        kid = batch.get("kernel_build_id", "")
        if kid and kid not in self.sent_build_ids and self.kernel is not None and self.kernel.build_id == kid:
            self.sent_build_ids.add(kid)
            chunks += kernel_symbol_chunks(self.kernel)
            new_ids += 1
        # a perf map's id is dropped once no process refers to its map: a JIT's map grows, and each version has an id
        self._sent_perf_ids &= self.perf_maps.ids()
        for proc in batch["processes"]:
            for m in proc["mappings"]:
                bid = m["build_id"]
                sent = self._sent_perf_ids if is_perf_map_id(bid) else self.sent_build_ids
                if not bid or bid in sent:
                    continue
                sent.add(bid)
                found = self._tables_of(proc["pid"], m)
                if found is None:
                    self.unreadable += 1
                    continue
                for c in found:
                    sent.add(c["build_id"])  # the file may have changed since it was mapped
                chunks += found
                new_ids += 1
        return chunks, new_ids

    def _tables_of(self, pid: int, mapping: dict) -> list[dict] | None:
        """The SymbolChunk records for one mapping's build id, or None when they cannot be had."""
        if is_perf_map_id(mapping["build_id"]):
            return self.perf_maps.chunks(mapping["build_id"])  # None: not held (over PerfMapCache's budget)
        path = mapping["path"]
        try:
            return self._read_chunks(mapped_file(pid, mapping["start"], mapping["limit"], path))
        except (ElfError, OSError) as exc:
            log.debug("no symbols for %s: %s", path, exc)
            return None

    def send_symbols(self, batch: dict) -> tuple[int, int, int]:
        """Publish the tables `batch` (anything with "processes" carrying "pid" and "mappings") needs and has not
        had yet, flushed: durable before any record refers to them. (chunks, new build ids, bytes)."""
        n_chunks, new_ids, size = self._symbols(batch)
        if n_chunks and self.publisher.flush(self.flush_timeout):
            raise PublishError(f"symbol tables not delivered within {self.flush_timeout:.0f} s")
        self.symbol_chunks += n_chunks
        return n_chunks, new_ids, size

    def send_window(self, batch: dict) -> WindowSent:
        """Symbol tables (flushed: durable before any batch refers to them), then the batch, split to fit; flushed.
        Raises PublishError when anything is not delivered."""
        n_chunks, new_ids, size = self.send_symbols(batch)
        messages = encode_cpu_batches(batch, self.max_message_bytes) if batch["processes"] else []
        for message in messages:
            size += self._send(topics.CPU_STACKS, batch["node"], message)
        if messages and self.publisher.flush(self.flush_timeout):
            raise PublishError(f"CPU stack batches not delivered within {self.flush_timeout:.0f} s")
        samples = sum(s["count"] for p in batch["processes"] for s in p["stacks"])
        self.batches += len(messages)
        self.samples += samples
        return WindowSent(samples, len(batch["processes"]), len(messages), n_chunks, new_ids, size)

    def window_messages(self, batch: dict) -> HeldWindow:
        """The window as messages, not sent: the symbol tables it needs that no earlier window carried, then the
        batch split to fit. The tables count as had from now on: whoever ships the window must keep them ahead of
        any later batch (OutageBuffer carries a dropped window's tables on to the next window)."""
        chunks, new_ids = self._new_tables(batch)
        symbols = [(topics.SYMBOLS.name, key, value) for _, key, value in _symbol_messages(chunks)]
        encoded = encode_cpu_batches(batch, self.max_message_bytes) if batch["processes"] else []
        samples = sum(s["count"] for p in batch["processes"] for s in p["stacks"])
        self.symbol_chunks += len(chunks)
        self.batches += len(encoded)
        self.samples += samples
        return HeldWindow(symbols, [(topics.CPU_STACKS.name, batch["node"], m) for m in encoded], samples,
                          len(batch["processes"]), new_ids)


def _symbol_messages(chunks: list[dict]) -> list[tuple[topics.Topic, str, bytes]]:
    return [(topics.SYMBOLS, f"{c['build_id']}/{c['chunk_index']}", encode("SymbolChunk", c)) for c in chunks]
