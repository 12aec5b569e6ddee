"""Write the seed corpora under tests/fuzz/corpus/<target>/: small valid inputs of every fuzz target, plus a few
mutated ones (truncated, wrong fingerprint, bogus lengths). The files are checked in; run this again after a schema
changes:  .venv/bin/python tests/fuzz/make_corpus.py   (needs gcc for the ELF and unwind seeds)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from schemas import single_object  # noqa: E402
from schemas.cpu_batch_writer import long_bytes  # noqa: E402
from schemas.wire import python_frame  # noqa: E402
from tests.fuzz.targets import CORPUS, STAGE_SEPARATOR  # noqa: E402

MAPPING = {"start": 0x7F0000000000, "limit": 0x7F0000100000, "file_offset": 4096, "path": "/usr/lib/libc.so.6",
           "build_id": "ab" * 20}
RECORDS = {
    "CpuStackBatch": {"node": "n1", "window_start_ns": 10**18, "window_ns": 10**10, "frequency_hz": 19,
                      "kernel_build_id": "kernel-6.1-0123456789abcdef", "simulated": False,
                      "processes": [{"pid": 42, "comm": "train", "exe": "/usr/bin/python3", "cgroup": "/a",
                                     "container_id": "c1", "mappings": [MAPPING],
                                     "code_objects": [{"qualname": "Model.forward", "file": "/srv/model.py",
                                                       "first_line": 10}],
                                     "stacks": [{"tid": 42, "user_addrs": [0x7F0000000010, python_frame(0, 12) - 2**64,
                                                                           0x7F0000000020],
                                                 "kernel_addrs": [0xFFFFFFFF81000010 - 2**64], "count": 3}]}]},
    "GpuLaunch": {"node": "n1", "pid": 42, "tid": 43, "process_start_ns": 5, "time_ns": 10**18, "correlation_id": 7,
                  "callback_id": 211, "api_name": "cudaLaunchKernel", "weight": 1,
                  "user_addrs": [0x7F0000000010, python_frame(0, 12) - 2**64], "mappings": [MAPPING],
                  "code_objects": [{"qualname": "Model.forward", "file": "/srv/model.py", "first_line": 10}],
                  "simulated": False},
    "GpuKernel": {"node": "n1", "pid": 42, "process_start_ns": 5, "correlation_id": 7, "start_ns": 10**18 + 100,
                  "end_ns": 10**18 + 900, "device_id": 0, "stream_id": 7, "kernel_name": "_Z6kernelPf",
                  "simulated": False},
    "GpuMetrics": {"node": "n1", "time_ns": 10**18, "simulated": False, "processes": [
        {"device_index": 0, "pid": 42, "comm": "train", "container_id": "", "sm_util_pct": 5, "mem_util_pct": None,
         "used_memory_bytes": 1 << 30}],
        "devices": [{"index": 0, "uuid": "GPU-1", "name": "H100", "parent_uuid": "", "gpu_util_pct": 90,
                     "mem_util_pct": 10, "mem_used_bytes": 1 << 30, "mem_total_bytes": 1 << 34, "sm_clock_mhz": 1500,
                     "mem_clock_mhz": 2000, "power_mw": 300_000, "power_limit_mw": 700_000, "temperature_c": 50,
                     "pcie_tx_kbps": 10, "pcie_rx_kbps": 20, "clock_event_reasons": 0, "xid_errors": []}]},
    "SymbolChunk": {"build_id": "ab" * 20, "binary": "libc.so.6", "kind": "ELF", "chunk_index": 0, "chunk_count": 1,
                    "load_segments": [{"file_offset": 0, "vaddr": 0, "memsz": 4096}], "addrs": [16, 32],
                    "sizes": [16, 0], "names": ["main", "_ZN3foo3barEv"]},
}
PERF_MAPS = {
    "cpython.map": b"7f0000001000 40 py::main:/app/train.py\n7f0000001040 40 py::step:/app/train.py\n",
    "jit.map": b"0x1000 0x10 jit stub with spaces\n2000 8 [anon] \r\n\nnot a line\n3000 ffffffffffffffff big\n",
    "junk.map": bytes(range(256)) + b"\n1 1 x\n",
}
KALLSYMS = {
    "kallsyms.txt": b"ffffffff81000000 T _stext\nffffffff81000000 T _text\nffffffff81000100 t do_one [mod]\n"
                    b"0000000000000000 T hidden\nffffffff81000200 D data\nzzzz T bad\n",
}
ELF_SOURCE = """int helper(int x) { return x * 3 + 1; }
static int local_fn(int x) { return helper(x) ^ 5; }
int other(int x) __attribute__((weak));
int other(int x) { return local_fn(x); }
void _start(void) { for (;;) other(1); }
"""

# the unwind seeds: C whose CFI gcc writes (frame pointer, DRAP realignment), and assembly for the rules gcc writes
# only elsewhere (glibc's _start and signal trampoline, ld's PLT stubs) or never (register rules, personality, LSDA)
UNWIND_C = """long leaf(long x) { return x * 7 + 1; }
__attribute__((noinline)) long framed(long *v, int n) { long s = 0; for (int i = 0; i < n; i++) s += v[i] * leaf(i);
    return s; }
__attribute__((noinline)) long realigned(int n, long a, long b, long c, long d, long e, long g, long h) {
    _Alignas(64) long buf[16];
    long *p = __builtin_alloca(n * sizeof(long));
    for (int i = 0; i < 16; i++) buf[i] = n + i;
    p[0] = g + h + a + b + c + d + e;
    return framed(buf, n) + framed(p, 1);
}
long entry(int n) { return realigned(n, 1, 2, 3, 4, 5, 6, 7); }
"""
UNWIND_ASM = """  .text
  .globl _start
_start:
  .cfi_startproc
  .cfi_undefined rip
  xor %ebp, %ebp
  call entry
  call rich
  hlt
  .cfi_endproc
rich:
  .cfi_startproc
  .cfi_personality 0x3, rich
  .cfi_lsda 0x3, lsda
  push %rbp
  .cfi_def_cfa_offset 16
  .cfi_offset rbp, -16
  mov %rsp, %rbp
  .cfi_def_cfa_register rbp
  push %rbx
  .cfi_offset rbx, -24
  test %rdi, %rdi
  je 1f
  .cfi_remember_state
  pop %rbx
  .cfi_restore rbx
  pop %rbp
  .cfi_def_cfa rsp, 8
  .cfi_restore rbp
  ret
1:
  .cfi_restore_state
  .cfi_escape 0x2e, 0x10
  .cfi_register rbp, r11
  nop
  .cfi_val_offset rbx, -32
  nop
  .cfi_escape 0x0f, 0x03, 0x76, 0x70, 0x06
  nop
  .cfi_escape 0x0f, 0x0b, 0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22
  nop
  .cfi_def_cfa r10, 0
  nop
  .cfi_escape 0x0f, 0x03, 0x77, 0x20, 0x06
  nop
  .cfi_def_cfa rsp, 8
  .cfi_same_value rbp
  .cfi_offset rip, -16
  nop
  .cfi_offset rip, -8
  ret
  .cfi_endproc
  nop
restore_rt:
  .cfi_startproc simple
  .cfi_signal_frame
  .cfi_def_cfa rsp, 160
  mov $15, %rax
  syscall
  .cfi_endproc
  .section .rodata
lsda:
  .long 0
"""
UNWIND_FLAGS = ["-O2", "-nostdlib", "-static", "-fcf-protection=none", "-fno-omit-frame-pointer",
                "-fno-tree-loop-distribute-patterns", "-Wl,-N", "-Wl,--build-id=none"]


def _write(target: str, name: str, data: bytes) -> None:
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


def avro_seeds() -> None:
    reg = single_object.default_registry()
    names = reg.names()
    for schema, rec in RECORDS.items():
        full = single_object.encode(schema, rec)
        body = full[single_object.HEADER_LEN:]
        index = bytes([names.index(f"fleetprof.{schema}")])
        _write("avro", f"{schema}.bin", index + body)
        _write("avro", f"{schema}-truncated.bin", index + body[: len(body) // 2])
        _write("decode_message", f"{schema}.bin", full)
        _write("decode_message", f"{schema}-wrong-fingerprint.bin", full[:2] + bytes(8) + full[10:])
        _write("decode_message", f"{schema}-trailing.bin", full + b"\x00")
    _write("decode_message", "huge-string-length.bin", single_object.encode("GpuKernel", RECORDS["GpuKernel"])[:10]
           + long_bytes(2**62) + b"n1")
    batch = single_object.encode("CpuStackBatch", RECORDS["CpuStackBatch"])[single_object.HEADER_LEN:]
    _write("columnar", "batch.bin", batch)
    _write("columnar", "negative-count.bin", b"\x02n1" + long_bytes(1) + long_bytes(2) + long_bytes(3) + b"\x00\x00"
           + long_bytes(-1) + long_bytes(2**40))
    _write("columnar", "deep.bin", batch[:-3] + long_bytes(1) + long_bytes(2000) + b"\x02" * 2000 + b"\x00\x00\x00")


def stage_seeds() -> None:
    def body(schema: str, rec: dict, topic_index: int) -> bytes:
        return bytes([topic_index]) + single_object.encode(schema, rec)[single_object.HEADER_LEN:]

    launch, kernel = RECORDS["GpuLaunch"], RECORDS["GpuKernel"]
    low = {**RECORDS["GpuMetrics"], "time_ns": 10**18 + 10**9,
           "devices": [{**RECORDS["GpuMetrics"]["devices"][0], "gpu_util_pct": 3}]}
    _write("stage_symbolize", "batch.bin", body("CpuStackBatch", RECORDS["CpuStackBatch"], 0))
    _write("stage_correlate", "pair.bin", STAGE_SEPARATOR.join([body("GpuLaunch", launch, 0),
                                                                body("GpuKernel", kernel, 1)]))
    _write("stage_correlate", "late.bin", STAGE_SEPARATOR.join([
        body("GpuKernel", kernel, 1), body("GpuLaunch", {**launch, "time_ns": -(2**63) + 1, "correlation_id": 8}, 0),
        body("GpuKernel", {**kernel, "start_ns": 2**62, "end_ns": 2**62 + 1}, 1)]))
    _write("stage_alerts", "drop.bin", STAGE_SEPARATOR.join([body("GpuMetrics", RECORDS["GpuMetrics"], 0),
                                                             body("GpuMetrics", low, 0)]))


def text_seeds() -> None:
    for name, data in PERF_MAPS.items():
        _write("perf_map", name, data)
    for name, data in KALLSYMS.items():
        _write("kallsyms", name, data)
    for name, data in {"cxx.txt": b"_ZN2at6native3addERKNS_6TensorES3_RKN3c106ScalarE", "rust.txt":
                       b"_RNvCs15kBYyAo9fc_7mycrate4main", "bomb.txt": b"1fP1aPFvS0_S0_EPFvS2_S2_EPFvS4_S4_E"}.items():
        _write("demangle", name, data)


def elf_seeds() -> None:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise SystemExit("gcc is needed for the ELF seeds")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "t.c"
        src.write_text(ELF_SOURCE)
        common = ["-O1", "-nostdlib", "-fno-asynchronous-unwind-tables"]
        builds = {"static.elf": common + ["-static", "-Wl,-N", "-Wl,--build-id"],
                  "static32.elf": common + ["-m32", "-static", "-Wl,-N", "-Wl,--build-id"],
                  "shared.so": common + ["-shared", "-fPIC", "-Wl,-z,noseparate-code", "-Wl,-z,norelro",
                                         "-Wl,--build-id=none"]}
        for name, flags in builds.items():
            out = Path(tmp) / name
            subprocess.run([gcc, *flags, "-o", str(out), str(src)], check=True, capture_output=True)
            _write("elf", name, out.read_bytes())
        stripped = Path(tmp) / "stripped.elf"
        subprocess.run(["strip", "-o", str(stripped), str(Path(tmp) / "static.elf")], check=True)
        _write("elf", "stripped.elf", stripped.read_bytes())
    data = (CORPUS / "elf" / "static.elf").read_bytes()
    _write("elf", "truncated.elf", data[:200])
    _write("elf", "bad-shoff.elf", data[:0x28] + b"\xff" * 8 + data[0x30:])


def unwind_seeds() -> None:
    """Small static x86_64 programs with rich call-frame information: one with .eh_frame alone, one whose C parts
    have theirs in .debug_frame (the other debug sections removed)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise SystemExit("gcc is needed for the unwind seeds")
    with tempfile.TemporaryDirectory() as tmp:
        c, asm = Path(tmp) / "u.c", Path(tmp) / "u.s"
        c.write_text(UNWIND_C)
        asm.write_text(UNWIND_ASM)
        for name, extra in {"eh_frame.elf": [], "debug_frame.elf": ["-g", "-fno-asynchronous-unwind-tables"]}.items():
            out = Path(tmp) / name
            subprocess.run([gcc, *UNWIND_FLAGS, *extra, "-o", str(out), str(c), str(asm)], check=True,
                           capture_output=True)
            if extra:
                subprocess.run(["objcopy", "--strip-debug", "--keep-section=.debug_frame", str(out)], check=True)
            _write("unwind", name, out.read_bytes())


if __name__ == "__main__":
    avro_seeds()
    stage_seeds()
    text_seeds()
    elf_seeds()
    unwind_seeds()
    print(f"wrote {sum(1 for _ in CORPUS.rglob('*') if _.is_file())} seed files under {CORPUS}")
