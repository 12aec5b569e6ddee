"""debuginfod as a second symbol source: the debuginfo of a stripped binary, fetched by GNU build id from the servers
in DEBUGINFOD_URLS (space separated, as elfutils reads it; unset or empty: off).

DebuginfodClient does the I/O: `GET <url>/buildid/<hex>/debuginfo` with a timeout, a deadline and a size cap, into a
temporary file it creates and deletes, parsed by the same bulk ELF reader as the agent's tables. It never raises for
a server's or a file's fault; it answers with a table or a reason. DebuginfodSource is the symbolize stage's policy:
which build ids are worth asking for, how much time one batch may spend, and what is kept (a better table goes into
SymbolTables, a miss into a negative cache).
"""

from __future__ import annotations

import logging
import os
import re
import struct
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import BinaryIO

import httpx
import numpy as np

from processors import metrics
from processors.symbol_tables import SymbolTable, SymbolTables, table_from_chunks
from producers.elf_symbols import ElfError, _note_build_id, read_elf_symbols, symbol_chunks

log = logging.getLogger("fleetprof.debuginfod")

URLS_ENV = "DEBUGINFOD_URLS"
# A GNU build id as the agent writes it: lowercase hex bytes. It comes from a message and goes into a URL, so nothing
# else passes (no "sha256:" file-hash ids, no "/", no "..").
_BUILD_ID = re.compile(r"(?:[0-9a-f]{2}){1,64}")
PT_LOAD, PT_NOTE, PF_X = 1, 4, 1
HEAD_BYTES = 64 * 1024  # enough for the ELF header, program headers and the build-id note of any usual binary
# The worst outcome decides what a miss over several servers was; the transient ones are asked again sooner.
_OUTCOMES = ("error", "backoff", "mismatch", "not_elf", "too_large", "no_segments", "no_symbols", "not_found")
_TRANSIENT = ("error", "backoff")

Segments = tuple[np.ndarray, np.ndarray, np.ndarray]  # PT_LOAD file offsets, vaddrs, memsz (uint64)


def valid_build_id(build_id: object) -> bool:
    """True for a GNU build id in lowercase hex (2..128 digits, whole bytes): the only ids debuginfod is asked for."""
    return isinstance(build_id, str) and _BUILD_ID.fullmatch(build_id) is not None


def urls_from_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """The http(s) servers named in DEBUGINFOD_URLS, in order, without trailing slashes."""
    env = os.environ if environ is None else environ
    urls = []
    for token in env.get(URLS_ENV, "").split():
        if token.startswith(("http://", "https://")):
            urls.append(token.rstrip("/"))
        else:  # elfutils also takes file:// and ima: tokens; they are not HTTP servers to fetch from here
            log.warning("%s: ignoring %r (only http:// and https:// servers are used)", URLS_ENV, token)
    return urls


def _env_number(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}: not a number: {text!r}") from None
    if value <= 0:
        raise ValueError(f"{name}: must be positive, got {text!r}")
    return value


@dataclass
class Fetched:
    """One look-up's answer: a table, or the outcome (a metric label) and a reason people can read."""

    build_id: str
    table: SymbolTable | None = None
    outcome: str = "not_found"  # ok, or one of _OUTCOMES
    reason: str = ""
    url: str = ""

    @property
    def transient(self) -> bool:
        """A server's trouble rather than an answer about this build id: worth asking again soon."""
        return self.outcome in _TRANSIENT


def elf_load_segments(head: bytes, build_id: str = "") -> list[tuple[int, int, int, int, int]] | None:
    """(file offset, vaddr, filesz, memsz, flags) of each PT_LOAD in the first bytes of an ELF file, or None when
    they are not all there, or when a build-id note there names another build id than `build_id` (if given)."""
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        return None
    wide, e = head[4] == 2, "<" if head[5] == 1 else ">"
    if wide:  # Elf64_Ehdr: e_phoff at 0x20, e_phentsize and e_phnum at 0x36
        (phoff,), (phentsize, phnum) = struct.unpack_from(e + "Q", head, 0x20), struct.unpack_from(e + "HH", head, 0x36)
    else:  # Elf32_Ehdr: e_phoff at 0x1c, e_phentsize and e_phnum at 0x2a
        (phoff,), (phentsize, phnum) = struct.unpack_from(e + "I", head, 0x1C), struct.unpack_from(e + "HH", head, 0x2A)
    if phentsize < (56 if wide else 32) or phoff + phnum * phentsize > len(head):
        return None
    loads = []
    for i in range(phnum):
        at = phoff + i * phentsize
        if wide:
            ptype, flags, off, vaddr, _, filesz, memsz, align = struct.unpack_from(e + "IIQQQQQQ", head, at)
        else:
            ptype, off, vaddr, _, filesz, memsz, flags, align = struct.unpack_from(e + "IIIIIIII", head, at)
        if ptype == PT_LOAD:
            loads.append((off, vaddr, filesz, memsz, flags))
        elif ptype == PT_NOTE and build_id and off + filesz <= len(head):
            found = _note_build_id(head[off:off + filesz], e == "<", 8 if align == 8 else 4)
            if found and found != build_id:
                return None
    return sorted(loads)


def _as_segments(loads: list[tuple[int, int, int, int, int]]) -> Segments:
    arr = np.array([(o, v, m) for o, v, _, m, _ in loads], dtype=np.uint64).reshape(-1, 3)
    return arr[:, 0], arr[:, 1], arr[:, 2]


class DebuginfodClient:
    """Fetches debuginfo by build id from each server in turn; a server that fails is left alone for backoff_s."""

    def __init__(self, urls: list[str], timeout_s: float = 5.0, max_bytes: int = 512 << 20,
                 max_time_s: float = 30.0, backoff_s: float = 30.0, tmp_dir: str | None = None,
                 transport: httpx.BaseTransport | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if not urls:
            raise ValueError("DebuginfodClient needs at least one server URL")
        self.urls = list(urls)
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.max_time_s = max_time_s
        self.backoff_s = backoff_s
        self.tmp_dir = tmp_dir
        self.clock = clock
        self.requests = 0  # HTTP requests made, for tests and logs
        self._down_until: dict[str, float] = {}
        self._http = httpx.Client(transport=transport, follow_redirects=True,
                                  headers={"User-Agent": "fleetprof-symbolizer"})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **kwargs: object) -> DebuginfodClient | None:
        """A client for DEBUGINFOD_URLS, or None when it names no server. elfutils' DEBUGINFOD_TIMEOUT (seconds per
        request), DEBUGINFOD_MAXTIME (seconds per download) and DEBUGINFOD_MAXSIZE (bytes) apply when set;
        ValueError names a setting that is not a positive number."""
        env = os.environ if environ is None else environ
        urls = urls_from_env(env)
        if not urls:
            return None
        kwargs.setdefault("timeout_s", _env_number(env, "DEBUGINFOD_TIMEOUT", 5.0))
        kwargs.setdefault("max_time_s", _env_number(env, "DEBUGINFOD_MAXTIME", 30.0))
        kwargs.setdefault("max_bytes", int(_env_number(env, "DEBUGINFOD_MAXSIZE", 512 << 20)))
        return cls(urls, **kwargs)  # type: ignore[arg-type]

    def close(self) -> None:
        self._http.close()

    def table(self, build_id: str, binary: str = "", segments: Segments | None = None) -> SymbolTable | None:
        """The function table of build_id's debuginfo, or None (fetch tells why)."""
        return self.fetch(build_id, binary, segments).table

    def fetch(self, build_id: str, binary: str = "", segments: Segments | None = None,
              deadline: float | None = None) -> Fetched:
        """Ask each server in turn for build_id's debuginfo until one gives a table of that same build id.

        segments: the binary's PT_LOAD segments when known (a debuginfo file's own program headers have no file
        offsets); otherwise they are read from the head of the server's /executable. deadline: a `clock()` time the
        whole look-up must end by (at most max_time_s from now anyway)."""
        if not valid_build_id(build_id):
            return Fetched(str(build_id), outcome="invalid", reason=f"not a GNU build id: {build_id!r}")
        end = self.clock() + self.max_time_s
        end = min(end, deadline) if deadline is not None else end
        misses = []
        for url in self.urls:
            now = self.clock()
            if self._down_until.get(url, 0.0) > now:
                misses.append(Fetched(build_id, outcome="backoff", reason=f"{url}: skipped after a recent error"))
                continue
            if now >= end:
                misses.append(Fetched(build_id, outcome="error", reason=f"{url}: no time left"))
                break
            got = self._fetch_from(url, build_id, binary or build_id, segments, end)
            if got.table is not None:
                return got
            if got.outcome == "error":
                self._down_until[url] = self.clock() + self.backoff_s
            misses.append(got)
        worst = min(misses, key=lambda f: _OUTCOMES.index(f.outcome)) if misses else Fetched(build_id)
        return Fetched(build_id, outcome=worst.outcome, reason="; ".join(m.reason for m in misses))

    def _fetch_from(self, url: str, build_id: str, binary: str, segments: Segments | None, end: float) -> Fetched:
        fd, path = tempfile.mkstemp(prefix="fleetprof-debuginfo-", dir=self.tmp_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                miss = self._download(f"{url}/buildid/{build_id}/debuginfo", f, end)
            if miss is not None:
                return Fetched(build_id, outcome=miss[0], reason=f"{url}: {miss[1]}")
            try:
                syms = read_elf_symbols(path)
            except ElfError as exc:
                return Fetched(build_id, outcome="not_elf", reason=f"{url}: {str(exc).split(': ', 1)[-1]}")
            if syms.build_id != build_id:  # a wrong file would name every frame wrongly: refuse it
                return Fetched(build_id, outcome="mismatch",
                               reason=f"{url}: served a debuginfo of build id {syms.build_id}")
            if len(syms) == 0:
                return Fetched(build_id, outcome="no_symbols", reason=f"{url}: the debuginfo has no function symbols")
            if segments is None:
                segments = self._segments(url, build_id, path, end)
                if segments is None:
                    return Fetched(build_id, outcome="no_segments",
                                   reason=f"{url}: no /executable to learn the load segments from")
            syms.path = binary
            syms.seg_offsets, syms.seg_vaddrs, syms.seg_memsz = segments
            table = table_from_chunks(symbol_chunks(syms, max_bytes=None))
            return Fetched(build_id, table=table, outcome="ok", url=url)
        finally:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def _timeout(self, end: float) -> httpx.Timeout:
        return httpx.Timeout(max(0.05, min(self.timeout_s, end - self.clock())))

    def _download(self, target: str, out: BinaryIO, end: float) -> tuple[str, str] | None:
        """Stream target into out; None when done, else (outcome, reason)."""
        self.requests += 1
        try:
            with self._http.stream("GET", target, timeout=self._timeout(end)) as resp:
                if resp.status_code == 404:
                    return "not_found", "not found"
                if resp.status_code != 200:
                    return ("error" if resp.status_code >= 500 else "not_found"), f"HTTP {resp.status_code}"
                length = resp.headers.get("content-length", "")
                if length.isdigit() and int(length) > self.max_bytes:
                    return "too_large", f"{int(length)} bytes, over the {self.max_bytes}-byte cap"
                size = 0
                for chunk in resp.iter_bytes(256 * 1024):
                    size += len(chunk)
                    if size > self.max_bytes:
                        return "too_large", f"over the {self.max_bytes}-byte cap"
                    if self.clock() > end:  # a slow server that keeps sending stays within the batch's budget
                        return "error", "download took too long"
                    out.write(chunk)
        except httpx.TimeoutException:
            return "error", "timed out"
        except (httpx.HTTPError, httpx.InvalidURL) as exc:  # InvalidURL: a DEBUGINFOD_URLS token httpx cannot use
            return "error", " ".join(str(exc).split()) or type(exc).__name__
        except OSError as exc:  # the temporary file: disk full
            return "error", f"cannot write a temporary file: {exc.strerror or exc}"
        return None

    def _segments(self, url: str, build_id: str, debuginfo: str, end: float) -> Segments | None:
        """Load segments of the binary itself: from the head of its /executable, else from the debuginfo when that
        is a whole unstripped binary (its code segment has file bytes; a separate debug file's do not)."""
        head = bytearray()
        self.requests += 1
        try:
            with self._http.stream("GET", f"{url}/buildid/{build_id}/executable", timeout=self._timeout(end)) as r:
                if r.status_code == 200:
                    for chunk in r.iter_bytes(HEAD_BYTES):
                        head += chunk
                        if len(head) >= HEAD_BYTES or self.clock() > end:
                            break
        except (httpx.HTTPError, httpx.InvalidURL):
            head.clear()
        loads = elf_load_segments(bytes(head[:HEAD_BYTES]), build_id) if head else None
        if loads:
            return _as_segments(loads)
        with open(debuginfo, "rb") as f:
            loads = elf_load_segments(f.read(HEAD_BYTES), build_id)
        if loads and all(filesz > 0 for _, _, filesz, _, flags in loads if flags & PF_X):
            return _as_segments(loads)
        return None


def _segments_of(table: SymbolTable | None) -> Segments | None:
    if table is None or len(table.seg_offsets) == 0:
        return None
    return table.seg_offsets, table.seg_vaddrs, table.seg_sizes


class DebuginfodSource:
    """When the symbolize stage asks debuginfod, and what it keeps of the answers.

    A build id is asked for when frames in it stayed unknown, its table is missing or came from the agent (kind
    ELF), it is a GNU build id, no miss of it is remembered (negative_ttl_s; transient_ttl_s after a server error),
    and debuginfod has not already given a table at least as large as the one held. A batch asks for at most
    max_fetches_per_batch build ids within batch_budget_s; the rest wait for a later batch."""

    def __init__(self, client: DebuginfodClient, stage: str = "symbolize", negative_ttl_s: float = 600.0,
                 transient_ttl_s: float = 60.0, batch_budget_s: float = 10.0, max_fetches_per_batch: int = 4,
                 max_remembered: int = 100_000) -> None:
        self.client = client
        self.stage = stage
        self.negative_ttl_s = negative_ttl_s
        self.transient_ttl_s = transient_ttl_s
        self.batch_budget_s = batch_budget_s
        self.max_fetches_per_batch = max_fetches_per_batch
        self.max_remembered = max_remembered
        self.clock = client.clock
        self.fetches = 0  # look-ups made (each may ask several servers)
        self._misses: OrderedDict[str, float] = OrderedDict()  # build id -> clock() before which not to ask again
        self._best: OrderedDict[str, int] = OrderedDict()  # build id -> symbols in what debuginfod gave
        self._logged: OrderedDict[str, None] = OrderedDict()  # build ids whose failure was logged
        self.new_batch()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **kwargs: object) -> DebuginfodSource | None:
        """A source on DEBUGINFOD_URLS, or None when it names no server."""
        client = DebuginfodClient.from_env(environ)
        if client is None:
            return None
        log.info("debuginfod: asking %s for build ids whose frames stay unknown", " ".join(client.urls))
        return cls(client, **kwargs)  # type: ignore[arg-type]

    def close(self) -> None:
        self.client.close()

    def new_batch(self) -> None:
        """Start a batch's budget of look-ups."""
        self._batch_spent = 0.0  # seconds spent asking, not symbolizing: a slow batch still gets its look-ups
        self._batch_fetches = 0

    def wanted(self, build_id: str, current: SymbolTable | None) -> bool:
        """Whether asking debuginfod about build_id could give a better table than `current` now."""
        if not valid_build_id(build_id) or (current is not None and current.kind != "ELF"):
            return False
        until = self._misses.get(build_id)
        if until is not None:
            if until > self.clock():
                return False
            del self._misses[build_id]
        best = self._best.get(build_id)
        return best is None or current is None or len(current) < best

    def improve(self, build_ids: Iterable[str], tables: SymbolTables) -> set[str]:
        """Ask debuginfod about the wanted ones among build_ids (within the batch's budget); a table with more
        symbols than the one held replaces it in `tables`. Returns the build ids whose table was replaced."""
        replaced: set[str] = set()
        for build_id in sorted(set(build_ids)):
            current = tables.get(build_id)
            if not self.wanted(build_id, current):
                continue
            left = self.batch_budget_s - self._batch_spent
            if self._batch_fetches >= self.max_fetches_per_batch or left <= 0:
                metrics.DEBUGINFOD_FETCHES.labels(self.stage, "deferred").inc()
                continue
            self._batch_fetches += 1
            self.fetches += 1
            started = self.clock()
            got = self.client.fetch(build_id, current.binary if current is not None else "", _segments_of(current),
                                    deadline=started + left)
            self._batch_spent += self.clock() - started
            if got.table is None:
                ttl = self.transient_ttl_s if got.transient else self.negative_ttl_s
                self._remember(self._misses, build_id, self.clock() + ttl)
                self._log_miss(got)
                metrics.DEBUGINFOD_FETCHES.labels(self.stage, got.outcome).inc()
                continue
            self._remember(self._best, build_id, len(got.table))
            if current is None or len(got.table) > len(current):
                tables.put(got.table)
                replaced.add(build_id)
                log.info("debuginfod: %d functions for build id %s from %s (had %s)", len(got.table), build_id,
                         got.url, "none" if current is None else len(current))
            metrics.DEBUGINFOD_FETCHES.labels(self.stage, "improved" if build_id in replaced else "no_better").inc()
        return replaced

    def forget_replaced(self, tables: SymbolTables) -> bool:
        """After the symbols feed read new chunks: True when it replaced a table debuginfod had given (so symbol
        indexes remembered for it are stale); such a build id may be asked for again."""
        gone = [b for b, n in self._best.items() if b in tables and len(tables.get(b)) < n]
        for build_id in gone:
            del self._best[build_id]
        return bool(gone)

    def _remember(self, store: OrderedDict, build_id: str, value: object) -> None:
        store[build_id] = value
        store.move_to_end(build_id)
        while len(store) > self.max_remembered:
            store.popitem(last=False)

    def _log_miss(self, got: Fetched) -> None:
        if got.build_id in self._logged:
            return
        self._remember(self._logged, got.build_id, None)
        if got.outcome == "not_found":  # the usual answer for binaries nobody published debuginfo for
            log.debug("debuginfod: no debuginfo for build id %s (%s)", got.build_id, got.reason)
        else:
            log.warning("debuginfod: build id %s: %s", got.build_id, got.reason)
