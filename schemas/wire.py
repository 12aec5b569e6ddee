"""Facts of the wire that every stage shares, said once: 64-bit values in Avro's signed longs and ints, how large a
message may be, and the names of the pseudo-binaries frames are attributed to."""

from __future__ import annotations

# --- 64-bit values in Avro longs -----------------------------------------------------------------------------------

U64 = 1 << 64
U64_MAX = U64 - 1
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1


def u64_to_long(value: int) -> int:
    """An unsigned 64-bit value (an address: kernel ones are above 2**63) as the Avro long with the same bits."""
    return value - U64 if value > LONG_MAX else value


def u64_to_longs(values: list[int]) -> list[int]:
    return [v - U64 if v > LONG_MAX else v for v in values]


def long_to_u64(value: int) -> int:
    """The unsigned 64-bit value an Avro long carries."""
    return value + U64 if value < 0 else value


def longs_to_u64(values: list[int]) -> list[int]:
    return [v + U64 if v < 0 else v for v in values]


def u32_to_int(value: int) -> int:
    """An unsigned 32-bit value (a device or stream id from the probes) as the Avro int with the same bits."""
    return value - (1 << 32) if value >= 1 << 31 else value


def identity_key(identity_id: int) -> str:
    """A workload identity id (either sign: the long on the wire or the unsigned id) as the store and the identities
    topic's key write it: 16 lower-case hex digits ('' for 0, no identity)."""
    return f"{identity_id & U64_MAX:016x}" if identity_id else ""


def hex_u64(value: int) -> str:
    """An address as people read it: unsigned hex, whatever the sign of the long that carried it."""
    return f"0x{value & U64_MAX:x}"


# --- message sizes -------------------------------------------------------------------------------------------------

MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's default message.max.bytes (brokers take 1 MiB by default)
DEFAULT_MAX_BYTES = 900 * 1024  # what a producer puts in one message: under the limit with room for the framing
STAGE_OUTPUT_MAX_BYTES = 600 * 1024  # a processor's output before encoding (symbolized names make it grow)

# --- pseudo-binaries -----------------------------------------------------------------------------------------------

KERNEL_BINARY = "[kernel.kallsyms]"  # kernel frames, named as perf names them
JIT_BINARY = "[jit]"  # code a perf map names (JIT compilers, CPython's -X perf)
UNKNOWN_BINARY = "[unknown]"  # a frame in no known mapping
GPU_BINARY = "[gpu]"  # the leaf of a GPU stack: the kernel (or a copy's or set's label) the launch ran
GPU_KERNEL_KIND = "GPU_KERNEL"  # its frame kind (GpuFrameKind has no other GPU kind)
# The labels the agent gives copies and sets, their kernel_name (plan of issue 16): '[memcpy HtoD]', '[memset]'
COPY_LABEL_PREFIXES = ("[memcpy ", "[memset")
# The last "address" of a user stack the agent could not walk to its root (a frame limit, an unreadable frame, a rule
# its unwinder cannot follow): no user mapping ever holds it (user space ends below 2**57 on every architecture).
TRUNCATED_FRAME = (1 << 64) - 2
TRUNCATED_BINARY = "[truncated]"
# The one "address" of a user stack whose sample lost its stack, or the leaf of one that lost its kernel part: the
# agent's stack map was full (a hash collision at get_stackid). Named so that whoever reads the profile knows the
# cause and the setting that cures it, instead of an empty stack.
LOST_STACK_FRAME = (1 << 64) - 4
LOST_STACK_BINARY = "[lost]"
LOST_STACK_NAME = "[stack lost: map full, raise agent --stack-entries]"

# --- interpreter frames --------------------------------------------------------------------------------------------

# A Python frame among a user stack's addresses (CpuStackBatch v2 on): the tag in the top byte, then the index of its
# code object in the process's `code_objects` (24 bits) and its line (32 bits). No user address has a top byte of
# 0xFD (user space ends below 2**57), and TRUNCATED_FRAME's and LOST_STACK_FRAME's are 0xFF.
PYTHON_FRAME_TAG = 0xFD
PYTHON_MAX_CODE_OBJECTS = 1 << 24  # per process and batch


def python_frame(index: int, line: int) -> int:
    """The unsigned 64-bit word for code object `index`'s frame on `line`."""
    return (PYTHON_FRAME_TAG << 56) | ((index & 0xFFFFFF) << 32) | (max(line, 0) & 0xFFFFFFFF)


def is_python_frame(word: int) -> bool:
    """Whether an unsigned 64-bit user-stack word is a Python frame."""
    return word >> 56 == PYTHON_FRAME_TAG


def python_frame_parts(word: int) -> tuple[int, int]:
    """(code object index, line) of a Python frame word."""
    return (word >> 32) & 0xFFFFFF, word & 0xFFFFFFFF
