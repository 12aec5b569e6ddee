"""Hypothesis strategies for records that decode (they match their Avro schema) but whose values are hostile: edge
integers, addresses at the ends of the 64-bit range, path-like build ids, quotes, control characters, 1 MB strings."""

from __future__ import annotations

from hypothesis import strategies as st

from schemas import single_object

INT_EDGES = [0, 1, -1, 2, 255, 256, 65535, 65536, 2**31 - 1, -(2**31)]
LONG_EDGES = INT_EDGES + [2**32, 2**32 - 1, 2**62, 2**63 - 1, -(2**63), -(2**63) + 1,
                          0xFFFFFFFF81000000 - 2**64, 0x7F0000001234, 10**18, -(10**18)]
HOSTILE_STRINGS = [
    "", "../../etc/passwd", "/etc/shadow", "../../x", "/proc/self/mem", "/dev/zero", "/tmp/perf-1.map",
    "perfmap:../../x", "sha256:" + "0" * 57, "ab" * 20, "AB" * 20, "ab" * 64 + "cd", "' OR 1=1 --", "\"; DROP TABLE x",
    "{name:String}", "%s%n", "\x00", "a\nb", "\udcff".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
    "é" * 3, "[kernel.kallsyms]", " (deleted)", "py::f:x.py", "_Z1fP" + "P" * 20000 + "i", "x" * 70_000,
]
BIG = "A" * (1 << 20)  # a 1 MB string


def ints(bits: int) -> st.SearchStrategy[int]:
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    edges = [v for v in (INT_EDGES if bits == 32 else LONG_EDGES) if lo <= v <= hi]
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi), st.integers(-5, 300))


def strings(big: bool) -> st.SearchStrategy[str]:
    options = [st.sampled_from(HOSTILE_STRINGS), st.text(max_size=12)]
    if big:
        options.append(st.just(BIG))
    return st.one_of(*options)


def for_schema(schema: object, named: dict | None = None, big: bool = False, max_items: int = 4,
               ) -> st.SearchStrategy:
    """Records valid for a parsed (fastavro) schema. `big`: strings may be 1 MB."""
    named = {} if named is None else named
    if isinstance(schema, str):
        prim = {"null": st.none(), "boolean": st.booleans(), "int": ints(32), "long": ints(64),
                "float": st.floats(allow_nan=True, width=32), "double": st.floats(allow_nan=True),
                "string": strings(big), "bytes": st.binary(max_size=64)}
        return prim[schema] if schema in prim else named[schema]
    if isinstance(schema, list):
        return st.one_of(*[for_schema(s, named, big, max_items) for s in schema])
    kind = schema["type"]
    if kind == "record":
        fields = {}
        strat = st.deferred(lambda: st.fixed_dictionaries(fields))
        named[schema["name"]] = strat
        for f in schema["fields"]:
            fields[f["name"]] = for_schema(f["type"], named, big, max_items)
        return strat
    if kind == "enum":
        strat = st.sampled_from(schema["symbols"])
        named[schema["name"]] = strat
        return strat
    if kind == "array":
        return st.lists(for_schema(schema["items"], named, big, max_items), max_size=max_items)
    if kind == "map":
        return st.dictionaries(st.text(max_size=8), for_schema(schema["values"], named, big, max_items),
                               max_size=max_items)
    if kind == "fixed":
        strat = st.binary(min_size=schema["size"], max_size=schema["size"])
        named[schema["name"]] = strat
        return strat
    return for_schema(kind, named, big, max_items)


def record_of(name: str, big: bool = False, max_items: int = 4) -> st.SearchStrategy[dict]:
    """Hostile but decodable records of the newest version of schema `name`."""
    return for_schema(single_object.default_registry().latest(name).parsed, big=big, max_items=max_items)


def mutate(data: bytes, edits: list[tuple[int, int, str]]) -> bytes:
    """`data` with each (position, byte, how) edit applied: a bit flipped, a byte set, inserted or deleted, or the
    rest cut off; positions wrap around the length."""
    out = bytearray(data)
    for pos, byte, how in edits:
        i = pos % (len(out) + 1)
        if how == "flip" and i < len(out):
            out[i] ^= 1 << (byte % 8)
        elif how == "set" and i < len(out):
            out[i] = byte
        elif how == "insert":
            out[i:i] = bytes([byte])
        elif how == "delete":
            del out[i:i + 1 + byte % 4]
        elif how == "truncate":
            del out[i:]
    return bytes(out)


EDITS = st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255),
                           st.sampled_from(["flip", "set", "insert", "delete", "truncate"])), min_size=1, max_size=5)


def _seq_ref(i: int) -> str:
    """Itanium's reference to substitution i + 1 (S0_, S1_, ... in base 36)."""
    digits, out = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ", ""
    while True:
        i, d = divmod(i, 36)
        out = digits[d] + out
        if not i:
            return f"S{out}_"


def demangle_bomb(levels: int) -> str:
    """A function whose parameter types each hold two references to the one before: output doubles per level."""
    return "_Z1fP1a" + "".join(f"PFv{_seq_ref(2 * k)}{_seq_ref(2 * k)}E" for k in range(levels))


DEMANGLER_CRASHERS = {  # each of these killed the process (stack overflow in the C++ demangler) before the guard
    "nested-local-names": "_ZZ" + "ZZ" * 9000 + "1aEv",
    "nested-literals": "_Z1fIL" + "Z" * 17000 + "EEvv",
    "nested-templates": "_Z1aI" + "1aI" * 19000 + "E" * 19000 + "Ev",
    "pointer-chain": "_Z1fP" + "P" * 110_000 + "i",
}
