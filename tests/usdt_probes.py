"""USDT probes in built libraries (the ELF notes that carry them, the ABI of native/include/fleetprof_probes.h) and
counting them through bcc, for the tests of the CUPTI shim and of the GPU simulator, which fire the same probes."""

from __future__ import annotations

import ctypes
import functools
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elftools.elf.elffile import ELFFile

from producers.cpu_sampler import BpfUnavailable, check_bpf
from producers.native_build import NativeBuildError
from tests.elf_helpers import unavailable

# The ABI of native/include/fleetprof_probes.h as sdt argument sizes (negative: signed).
PROBE_ARGS = {"kernel_launch": [4, -4, 8], "kernel_executed": [8, 8, 4, 4, 4, 8], "launch_weight": [4, 4],
              "launch_range": [4, 8], "graph_kernel_executed": [8, 8, 4, 4, 4, 8, 4, 8],
              "memory_executed": [8, 8, 4, 4, 4, 8, 4, 4, 8]}
CORE_PROBES = ("kernel_launch", "kernel_executed", "launch_weight")  # every emitter's; the others where it fires them


def built(build_one: Callable[[], Path]) -> Path:
    """The library, or unavailable() naming what is missing (gcc, <sys/sdt.h>, the nvidia-* wheels): a skip here,
    a failure on CI."""
    try:
        return build_one()
    except NativeBuildError as exc:
        unavailable(str(exc))
        raise


def dynamic_symbols(path: Path) -> tuple[set[str], set[str]]:
    """(defined global function names in .dynsym, DT_NEEDED entries)."""
    with path.open("rb") as f:
        elf = ELFFile(f)
        names = {s.name for s in elf.get_section_by_name(".dynsym").iter_symbols()
                 if s["st_info"]["type"] == "STT_FUNC" and s["st_info"]["bind"] == "STB_GLOBAL"
                 and s["st_shndx"] != "SHN_UNDEF"}
        needed = {t.needed for t in elf.get_section_by_name(".dynamic").iter_tags() if t.entry.d_tag == "DT_NEEDED"}
    return names, needed


def _file_offset(elf: ELFFile, vaddr: int) -> int:
    for seg in elf.iter_segments():
        if seg["p_type"] == "PT_LOAD" and seg["p_vaddr"] <= vaddr < seg["p_vaddr"] + seg["p_memsz"]:
            return vaddr - seg["p_vaddr"] + seg["p_offset"]
    raise ValueError(f"{vaddr:#x} is in no PT_LOAD segment")


def sdt_notes(path: Path) -> tuple[list[dict[str, Any]], tuple[int, int]]:
    """The .note.stapsdt probes (provider, name, addresses, argument sizes) and the .probes address range."""
    with path.open("rb") as f:
        elf = ELFFile(f)
        probes = elf.get_section_by_name(".probes")
        base = elf.get_section_by_name(".stapsdt.base")["sh_addr"]
        notes = []
        for note in elf.get_section_by_name(".note.stapsdt").iter_notes():
            assert note["n_name"] == "stapsdt"  # type 3, which pyelftools names after the GNU build id
            desc = note["n_descdata"]
            pc, note_base, semaphore = struct.unpack_from("<QQQ", desc)
            provider, name, args = desc[24:].split(b"\0")[:3]
            pc, semaphore = pc + base - note_base, semaphore + base - note_base  # as the note says: prelinking
            notes.append({"provider": provider.decode(), "name": name.decode(), "semaphore": semaphore,
                          "pc_offset": _file_offset(elf, pc), "semaphore_offset": _file_offset(elf, semaphore),
                          "sizes": [int(a.split(b"@")[0]) for a in args.split()]})
    return notes, (probes["sh_addr"], probes["sh_addr"] + probes["sh_size"])


def assert_probes_follow_the_abi(library: Path) -> None:
    """The core probes and any others of the ABI, one site each, with the ABI's argument sizes and their semaphores
    in .probes."""
    notes, (low, high) = sdt_notes(library)
    names = sorted(n["name"] for n in notes)
    assert len(set(names)) == len(names) and set(CORE_PROBES) <= set(names) <= set(PROBE_ARGS), names
    for note in notes:
        assert note["provider"] == "fleetprof"
        assert note["sizes"] == PROBE_ARGS[note["name"]], note["name"]
        assert low <= note["semaphore"] < high, note["name"]
    assert len({n["semaphore"] for n in notes}) == len(notes)


BPF_COUNTER = r"""
struct name_t { char s[64]; };
struct agg_t { u64 n; u64 ns; };
BPF_ARRAY(counts, u64, 4);  /* kernel_launch, launch_weight, sum of weights, kernel_executed */
BPF_HASH(kernels, struct name_t, struct agg_t, 64);
BPF_HASH(apis, struct name_t, u64, 16);
BPF_STACK_TRACE(stacks, 16384);
BPF_HASH(launch_stacks, int, u64, 256);
static void add(int i, u64 v) { u64 *c = counts.lookup(&i); if (c) __sync_fetch_and_add(c, v); }
int on_launch(struct pt_regs *ctx) {
    u64 api = 0, zero = 0; struct name_t k = {};
    bpf_usdt_readarg(3, ctx, &api);
    bpf_probe_read_user_str(&k.s, sizeof(k.s), (void *)api);
    u64 *n = apis.lookup_or_try_init(&k, &zero);
    if (n) __sync_fetch_and_add(n, 1);
    int id = stacks.get_stackid(ctx, BPF_F_USER_STACK);
    u64 *s = launch_stacks.lookup_or_try_init(&id, &zero);
    if (s) __sync_fetch_and_add(s, 1);
    add(0, 1);
    return 0;
}
int on_weight(struct pt_regs *ctx) { u32 w = 0; bpf_usdt_readarg(2, ctx, &w); add(1, 1); add(2, w); return 0; }
int on_executed(struct pt_regs *ctx) {
    u64 start = 0, end = 0, name = 0; struct name_t k = {}; struct agg_t zero = {};
    bpf_usdt_readarg(1, ctx, &start); bpf_usdt_readarg(2, ctx, &end); bpf_usdt_readarg(6, ctx, &name);
    bpf_probe_read_user_str(&k.s, sizeof(k.s), (void *)name);
    struct agg_t *a = kernels.lookup_or_try_init(&k, &zero);
    if (a) { __sync_fetch_and_add(&a->n, 1); __sync_fetch_and_add(&a->ns, end - start); }
    add(3, 1);
    return 0;
}
"""


def _pass_ref_ctr_offset(bcc: Any) -> None:
    """bcc 0.26's Python calls libbcc's 7-argument bpf_attach_uprobe with 6, so ref_ctr_offset is whatever lies on the
    stack and the kernel refuses the uprobe now and then ("ref_ctr_offset mismatch", EINVAL) when another attach to
    the same probe passed the real one. Pass the real one, from the probe's note: the kernel then keeps the semaphore
    raised too (bcc's USDT code also raises it itself, through /proc/PID/mem)."""
    lib = bcc.libbcc.lib
    real = lib.bpf_attach_uprobe
    if len(real.argtypes) != 6:
        return  # a bcc that passes it itself
    real.argtypes = [*real.argtypes, ctypes.c_uint32]

    def attach(progfd: int, kind: int, ev_name: bytes, path: bytes, addr: int, pid: int) -> int:
        try:
            notes, _ = sdt_notes(Path(path.decode()))
        except (OSError, AttributeError, ValueError):
            notes = []
        ref_ctr = next((n["semaphore_offset"] for n in notes if n["pc_offset"] == addr), 0)
        return real(progfd, kind, ev_name, path, addr, pid, ref_ctr)

    lib.bpf_attach_uprobe = attach


@functools.cache
def load_bcc() -> Any:
    """bcc, with the uprobe fix above (once per process); unavailable() when BPF cannot load here."""
    try:
        module = check_bpf()
    except BpfUnavailable as exc:
        unavailable(f"BPF unavailable: {exc}")
    _pass_ref_ctr_offset(module)
    return module


def attach(bcc: Any, pid: int) -> Any:
    usdt = bcc.USDT(pid=pid)
    usdt.enable_probe(probe="fleetprof:kernel_launch", fn_name="on_launch")
    usdt.enable_probe(probe="fleetprof:launch_weight", fn_name="on_weight")
    usdt.enable_probe(probe="fleetprof:kernel_executed", fn_name="on_executed")
    bpf = bcc.BPF(text=BPF_COUNTER.encode(), usdt_contexts=[usdt])
    bpf.usdt_context = usdt  # bcc raised the semaphores through this object, and lowers them when it is freed
    return bpf


def observed(bpf: Any) -> dict[str, Any]:
    counts = bpf[b"counts"]
    kernels = {k.s.decode(): (v.n, v.ns) for k, v in bpf[b"kernels"].items()}
    return {"launches": counts[0].value, "weighted": counts[1].value, "weight_sum": counts[2].value,
            "executed": counts[3].value, "kernels": kernels,
            "apis": {k.s.decode(): v.value for k, v in bpf[b"apis"].items()}}


def private_copy(library: Path, folder: Path) -> Path:
    """A copy with its own inode: uprobes that other tests or tools left on the shared build cannot clash with
    (the kernel refuses a second uprobe on the same probe with a different semaphore offset)."""
    copy = folder / library.name
    shutil.copyfile(library, copy)
    return copy
