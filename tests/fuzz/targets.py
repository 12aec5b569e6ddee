"""Fuzz targets: each takes bytes and checks the contract its subject has with hostile input, raising AssertionError
(or whatever the subject raised against its contract) on a violation. The hypothesis tests (tests/test_fuzz_*.py),
the corpus replay and the atheris campaigns (tests/fuzz/run_atheris.py) call the same functions.

Contracts: a decoder returns a record or raises DecodeError with a one-line reason; decode_message returns a Message
or a dead letter, never raises; a parser returns its result or its one error type; a stage, run through the
runner's isolation, returns outputs the runner can send (encodable, under the message limit unless they carry
their source for a dead letter), within a time limit, and opens no file named by a message.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from processors.messages import Message, Produced, decode_message
from schemas import single_object, topics
from schemas.cpu_batch_layout import LAYOUT
from schemas.cpu_batch_reader import decode_cpu_batch_columnar
from schemas.packed_stacks import PackedStacks

CORPUS = Path(__file__).parent / "corpus"
STEP_LIMIT_S = 20.0  # far above any normal call: reaching it means a hang or a blow-up
# Where a stage's outputs go: MAX_OUTPUT_BYTES of processors/runner.py, imported lazily (it loads confluent_kafka).


class Raw:
    """The part of confluent_kafka.Message that the runners read."""

    def __init__(self, value: bytes | None, topic: str, key: bytes | None = b"k", partition: int = 0,
                 offset: int = 0) -> None:
        self._v, self._t, self._k, self._p, self._o = value, topic, key, partition, offset

    def value(self) -> bytes | None:
        return self._v

    def key(self) -> bytes | None:
        return self._k

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def error(self) -> None:
        return None


@contextlib.contextmanager
def time_limit(seconds: float = STEP_LIMIT_S) -> Iterator[None]:
    """Fail (TimeoutError) when the block runs longer than `seconds`: a hang, not a slow call. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(*_: object) -> None:
        raise TimeoutError(f"still running after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    started = time.monotonic()
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)  # an outer timer (pytest-timeout's) is put back after
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 0.001))


def one_line(reason: str) -> None:
    assert reason and "\n" not in reason, f"not a one-line reason: {reason!r}"


# ---- decoders -------------------------------------------------------------------------------------------------

def check_decode(data: bytes) -> tuple[str, dict] | None:
    """single_object.decode: a record that encodes again and decodes to itself, or DecodeError."""
    try:
        name, record = single_object.decode(data)
    except single_object.DecodeError as exc:
        one_line(str(exc))
        return None
    again = single_object.encode(name, record)
    # bytes, not records: a NaN is not equal to itself
    assert single_object.encode(*single_object.decode(again)) == again
    return name, record


def check_columnar(data: bytes) -> None:
    """The columnar CpuStackBatch decoder agrees with single_object.decode or refuses with DecodeError."""
    try:
        rec = decode_cpu_batch_columnar(data)
    except single_object.DecodeError as exc:
        one_line(str(exc))
        return
    rec = {**rec, "processes": [{**p, "stacks": p["stacks"].records()} for p in rec["processes"]]}
    assert rec == single_object.decode(data)[1], "the columnar decoder read what fastavro reads otherwise"


def check_decode_message(data: bytes, topic: str = "cpu.stacks", columnar: bool = True) -> Message | Produced:
    """decode_message: a Message, or a dead letter that keeps the bytes and says why in one line; never raises."""
    expect = {t.name: t.schema for t in topics.ALL}
    item = decode_message("fuzz", Raw(data, topic), expect, 16 << 20, columnar=columnar)
    if isinstance(item, Produced):
        assert item.topic == "deadletter"
        one_line(item.record["reason"])
        assert item.record["value"] == data
        single_object.encode(item.schema, item.record)
    else:
        assert item.topic == topic and item.name == f"fleetprof.{expect[topic]}"
        newest = single_object.default_registry().latest(expect[topic]).fingerprint == data[2:10]
        if columnar and item.name == "fleetprof.CpuStackBatch" and newest:  # older versions: through fastavro
            assert all(isinstance(p["stacks"], PackedStacks) for p in item.record["processes"])
    return item


def with_header(schema: str, body: bytes) -> bytes:
    """A message body behind the single-object header of the newest version of `schema`."""
    return single_object.MARKER + single_object.default_registry().latest(schema).fingerprint + body


def check_avro_body(data: bytes) -> None:
    """The first byte picks a schema; the rest is its body: the mutations land in the body, past the header."""
    if not data:
        return
    names = single_object.default_registry().names()
    name = names[data[0] % len(names)]
    message = with_header(name, data[1:])
    check_decode(message)
    check_decode_message(message, topic=next((t.name for t in topics.ALL if f"fleetprof.{t.schema}" == name),
                                             "cpu.stacks"))
    if single_object.default_registry().latest(name) is LAYOUT.schema:
        check_columnar(message)


# ---- parsers --------------------------------------------------------------------------------------------------

def check_elf(data: bytes, directory: str | None = None) -> None:
    """read_elf_symbols and read_build_id on a file holding `data`: ElfSymbols (whose chunks make a table) or ElfError
    with a one-line reason."""
    from processors.symbol_tables import table_from_chunks
    from producers.elf_symbols import ElfError, read_build_id, read_elf_symbols, symbol_chunks

    fd, path = tempfile.mkstemp(prefix="fuzz-", suffix=".elf", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            syms = read_elf_symbols(path)
        except ElfError as exc:
            one_line(str(exc))
            syms = None
        if syms is not None:
            assert len(syms.addrs) == len(syms.sizes) == len(syms.names)
            assert all(syms.addrs[1:] > syms.addrs[:-1]), "addresses sorted and unique"
            chunks = symbol_chunks(syms)
            for c in chunks:
                single_object.encode("SymbolChunk", c)
            assert len(table_from_chunks(chunks)) == len(syms)
        try:
            build_id = read_build_id(path)
        except ElfError as exc:
            one_line(str(exc))
        else:
            assert syms is None or build_id == syms.build_id
    finally:
        os.unlink(path)


def check_unwind(data: bytes) -> None:
    """compile_unwind_table_bytes: rows the BPF walker can binary-search (pcs strictly increasing, no two neighbours
    alike, known kinds, 32-bit pcs) or UnwindTableError with a one-line reason."""
    from producers.unwind_tables import CFA_UNSUPPORTED, RBP_AT_RBP, UnwindTableError, compile_unwind_table_bytes

    try:
        table = compile_unwind_table_bytes(data)
    except UnwindTableError as exc:
        one_line(str(exc))
        return
    rows = table.array()
    assert len(table.rows) == 12 * len(rows) == 12 * table.count
    assert (rows["pc"][1:] > rows["pc"][:-1]).all(), "pcs strictly increasing"
    rules = rows[["cfa_offset", "rbp_offset", "cfa_kind", "rbp_kind"]]
    assert (rules[1:] != rules[:-1]).all(), "no two neighbours with one rule"
    assert (rows["cfa_kind"] <= CFA_UNSUPPORTED).all() and (rows["rbp_kind"] <= RBP_AT_RBP).all()
    assert all(isinstance(v, int) and v >= 0 for v in table.stats.values())
    assert not len(rows) or rows["cfa_kind"][-1] == 0, "the last row ends the last FDE"


def check_perf_map(data: bytes) -> None:
    """parse_perf_map: sorted unique 64-bit starts, one-line names, chunks the codec can encode."""
    from producers.perf_map import is_perf_map_id, parse_perf_map, perf_map_chunks

    found = parse_perf_map(data, max_entries=10_000)
    assert found.addrs == sorted(set(found.addrs)) and all(0 <= a < 1 << 64 for a in found.addrs)
    assert all(0 <= s < 1 << 64 for s in found.sizes) and len(found.sizes) == len(found.names) == len(found)
    assert all("\n" not in n and n == n.strip(" \t\r") and n for n in found.names)
    assert is_perf_map_id(found.build_id) and found.build_id == parse_perf_map(data, max_entries=10_000).build_id
    for c in perf_map_chunks(found):
        single_object.encode("SymbolChunk", c)


def check_kallsyms(data: bytes) -> None:
    """parse_kallsyms on any text: sorted unique addresses that the codec can encode as a table."""
    from producers.kallsyms import KernelSymbols, kernel_symbol_chunks, parse_kallsyms

    addrs, names, hidden = parse_kallsyms(data.decode("utf-8", "replace"))
    assert addrs == sorted(set(addrs)) and len(addrs) == len(names) and hidden >= 0
    for c in kernel_symbol_chunks(KernelSymbols("kernel-fuzz", addrs, names, hidden)):
        single_object.encode("SymbolChunk", c)


def check_demangle(data: bytes) -> None:
    """demangle: a string for any name, bounded in size; never crashes the process (see processors/demangle.py)."""
    from processors.demangle import MAX_DEMANGLED, demangle

    name = data.decode("utf-8", "replace")
    for prefix in ("", "_Z", "_R", "$s"):
        out = demangle(prefix + name)
        assert isinstance(out, str) and (len(out) <= MAX_DEMANGLED or out == prefix + name)


class BufferMemory:
    """Process memory that is a bytes buffer at address `base` (reads outside it fail as reads of an unmapped page
    do): what producers/python_code.py reads code objects from, under fuzzing."""

    def __init__(self, data: bytes, base: int = 0x10000) -> None:
        self.pid, self.data, self.base = 0, data, base

    def read(self, addr: int, size: int) -> bytes:
        from producers.python_code import ReadFailed

        at = addr - self.base
        if at < 0 or size < 0 or at + size > len(self.data):
            raise ReadFailed(f"pid 0: {size} bytes at {addr:#x}: outside the buffer")
        return self.data[at:at + size]

    def word(self, addr: int) -> int:
        return int.from_bytes(self.read(addr, 8), "little")


def check_line_table(data: bytes) -> None:
    """line_at on any bytes: an int for every offset (a table cut short or garbage gives the last line reached)."""
    from producers.python_code import line_at

    for units in (0, 1, 7, 64, 1 << 15):
        assert isinstance(line_at(data, 100, units), int)


def check_code_object(data: bytes) -> None:
    """read_code over any memory: a CodeObject with bounded strings, or ReadFailed; never another exception."""
    from producers.python_code import MAX_LINETABLE_BYTES, MAX_STRING_CHARS, ReadFailed, read_code
    from producers.python_offsets import TABLE

    mem = BufferMemory(data)
    for offsets in TABLE.values():
        for addr in (mem.base, mem.base + 8, mem.base + len(data) // 2):
            try:
                code = read_code(mem, offsets, addr)  # type: ignore[arg-type]
            except ReadFailed as exc:
                one_line(str(exc))
                continue
            assert len(code.qualname) <= MAX_STRING_CHARS + 1 and len(code.filename) <= MAX_STRING_CHARS + 1
            assert len(code.linetable) <= MAX_LINETABLE_BYTES and isinstance(code.line_at(3), int)


# ---- stages ---------------------------------------------------------------------------------------------------

_MODULE_FILES = (".py", ".pyc", ".so")


class Opens:
    """Every file path opened while active (an audit hook: `open` and `os.open`, whatever module opens it)."""

    _active: list[Opens] = []
    _installed = False

    def __init__(self) -> None:
        self.paths: list[str] = []

    def data_paths(self) -> list[str]:
        """The paths opened other than Python's own module files (a lazy import)."""
        return [p for p in self.paths if not (p.endswith(_MODULE_FILES) and "/../" not in p)]

    @classmethod
    def _hook(cls, event: str, args: tuple) -> None:
        if cls._active and event in ("open", "os.open") and args and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            for watcher in cls._active:
                watcher.paths.append(path)

    def __enter__(self) -> Opens:
        if not Opens._installed:
            sys.addaudithook(Opens._hook)
            Opens._installed = True
        Opens._active.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        Opens._active.remove(self)


def strings_in(value: object) -> Iterator[str]:
    """Every string inside a decoded record."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings_in(v)


class StageHarness:
    """A stage behind a real TopicRunner's isolation (`_process`: the whole batch, else one message at a time with a
    dead letter for each that fails). Each run gets a fresh stage, so a run depends on its input alone. The
    runner's Kafka clients point at a closed port and are never used."""

    def __init__(self, make_stage: Callable[[], object]) -> None:
        from processors.runner import TopicRunner

        self.make_stage = make_stage
        self.runner = TopicRunner(make_stage(), {"bootstrap.servers": "127.0.0.1:9", "log_level": 0})

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.runner.stage.inputs

    def run(self, messages: list[Message]) -> list[Produced]:
        """The runner's outputs for `messages`, checked against the stage contract (see the module doc)."""
        from processors.runner import MAX_OUTPUT_BYTES, encode_produced

        self.runner.stage = self.make_stage()
        with time_limit(), Opens() as opened:
            out = self.runner._process(messages)
            sizes = [len(encode_produced(p)[1]) for p in out]  # what the runner's commit encodes
        for p, size in zip(out, sizes, strict=True):
            assert size <= MAX_OUTPUT_BYTES or p.source is not None, \
                f"a {size}-byte output to {p.topic} that the runner can neither send nor dead-letter"
            if p.topic == "deadletter":
                one_line(p.record["reason"])
        named = {v for m in messages for v in strings_in(m.record) if len(v) > 1}
        assert not opened.data_paths(), f"{type(self.runner.stage).__name__} opened {opened.data_paths()}"
        assert not named & set(opened.paths), f"opened a path named by a message: {named & set(opened.paths)}"
        return out

    def run_bytes(self, data: bytes) -> list[Produced] | None:
        """Messages cut from `data` at STAGE_SEPARATOR, each a byte choosing one of the stage's input topics, then an
        Avro body of that topic's schema; those that decode go through `run`."""
        messages = []
        for i, chunk in enumerate(data.split(STAGE_SEPARATOR)[:8]):
            if not chunk:
                continue
            topic = self.inputs[chunk[0] % len(self.inputs)]
            item = check_decode_message(with_header(topics.BY_NAME[topic].schema, chunk[1:]), topic,
                                        columnar=self.runner.stage.columnar_input)
            if isinstance(item, Message):
                item.offset = i
                messages.append(item)
        return self.run(messages) if messages else None

    def close(self) -> None:
        self.runner.consumer.close()


STAGE_SEPARATOR = b"\xfe\xfd\xfc"


def stage_factories() -> dict[str, Callable[[], object]]:
    """Each topic-to-topic stage as `fleetprof process` builds it, less the side inputs read from Kafka (symbols
    feed, state changelogs, evidence): those are I/O, and a stage runs without them in its pure tests."""
    from processors.alerts import AlertConfig
    from processors.alerts_stage import AlertsStage
    from processors.correlate_stage import CorrelateStage
    from processors.symbol_tables import SymbolTables
    from processors.symbolize_stage import SymbolizeStage

    # alerts fire at once (no hold), so a few polls reach every phase
    return {"symbolize": lambda: SymbolizeStage(SymbolTables()),
            "correlate": lambda: CorrelateStage(SymbolTables(), None),
            "alerts": lambda: AlertsStage(AlertConfig(hold_ns=0, recover_ns=0), None, None)}


def as_messages(topic: str, records: list[dict], columnar: bool = False) -> list[Message]:
    """Records as the runner hands them to a stage: encoded, then decoded by decode_message, at offsets 0, 1, ..."""
    schema = topics.BY_NAME[topic].schema
    out = []
    for i, rec in enumerate(records):
        item = decode_message("fuzz", Raw(single_object.encode(schema, rec), topic, offset=i), {topic: schema}, 1 << 30,
                              columnar=columnar)
        assert isinstance(item, Message), item.record["reason"]
        out.append(item)
    return out


_harnesses: dict[str, StageHarness] = {}


def check_stage(name: str, data: bytes) -> None:
    """The stage target for atheris: one harness per stage and process."""
    if name not in _harnesses:
        _harnesses[name] = StageHarness(stage_factories()[name])
    _harnesses[name].run_bytes(data)


TARGETS: dict[str, Callable[[bytes], object]] = {
    "stage_symbolize": lambda data: check_stage("symbolize", data),
    "stage_correlate": lambda data: check_stage("correlate", data),
    "stage_alerts": lambda data: check_stage("alerts", data),
    "avro": check_avro_body,
    "decode_message": check_decode_message,
    "columnar": lambda data: check_columnar(with_header("CpuStackBatch", data)),
    "elf": check_elf,
    "unwind": check_unwind,
    "perf_map": check_perf_map,
    "kallsyms": check_kallsyms,
    "demangle": check_demangle,
}
