"""NCCL kernels recognized by name: which collective a kernel ran, on what element type, and how it reads in a profile.

CUPTI names kernels as compiled: usually mangled (`_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgs
StorageILm4096EE`), demangled in stored frames (`ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage
<4096ul>)`). NCCL has named its kernels three ways:
  NCCL >= 2.19   ncclDevKernel_<coll>[_<op>_<type>][_<ALGO>_<PROTO>], and ncclDevKernel_Generic[_N] (RCCL: _1/_2/_4),
                 which runs whatever collective the launch hands it, so its name carries none
  2.8 to 2.18    ncclKernel_<coll>_<ALGO>_<PROTO>_<op>_<C type>
  2.27 and later ncclSymDevKernel_ / ncclSymkDevKernel_<coll>_<algo>[_<sum|avg>_<type>][_profile] (symmetric memory)
A name's op, algorithm and protocol are those the kernel is specialized for, not necessarily what ran: NCCL names its
specialized kernels after Sum and LL (and, since 2.19, RING unless TREE) and runs the launch's own op, algorithm and
protocol through them when they differ. The collective and the element type are the launch's own (except that a
signed integer sum runs in the unsigned kernel), so those two make the label.

sql/queries/nccl_kernel_pattern.sql recognizes the same names and sql/queries/nccl_kernels.sql classifies them the
same way in ClickHouse; tests/test_collectives_sql.py holds both to this module on one corpus of names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

# What the GPU profile queries' `collectives` parameter takes: NCCL kernels as the others, left out, or alone
COLLECTIVE_CHOICES = ("all", "hide", "only")
# Every NCCL kernel's name starts so, mangled or not; what follows may be a collective this module does not know yet
NCCL_KERNEL = re.compile(r"^(?:_Z[0-9]+)?(?:void )?(?:ncclDevKernel|ncclDevKernelDebug|ncclKernel|ncclKernelDebug"
                         r"|ncclSymDevKernel|ncclSymkDevKernel)_")
_MANGLED = re.compile(r"^_Z([0-9]+)")
_DEMANGLED = re.compile(r"^(?:void )?([A-Za-z0-9_]+)")

_COLLECTIVE = "AllReduce|AllGatherV|AllGather|ReduceScatter|Reduce|Broadcast|SendRecv|AllToAllPivot"
_OP = "Sum|Prod|MinMax|Min|Max|PreMulSum|SumPostDiv"
_ALGORITHM = "TREE|RING|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT"
_PROTOCOL = "LL128|LL|SIMPLE"
_SHORT_TYPE = "i8|u8|i32|u32|i64|u64|f16|f32|f64|bf16|f8e4m3|f8e5m2"
_C_TYPE = "int8_t|uint8_t|int32_t|uint32_t|int64_t|uint64_t|half|float|double|__nv_bfloat16"
_SYMMETRIC_TYPE = "f32|f16|bf16|f8e4m3|f8e5m2"

# Each names its groups collective, op, dtype, algorithm, protocol (those it has), over the whole identifier
_DEV_KERNEL = re.compile(rf"^ncclDevKernel(?:Debug)?_(?P<collective>{_COLLECTIVE})(?:_(?P<op>{_OP})_(?P<dtype>"
                         rf"{_SHORT_TYPE}))?(?:_(?P<algorithm>{_ALGORITHM})_(?P<protocol>{_PROTOCOL}))?$")
_KERNEL = re.compile(rf"^ncclKernel(?:Debug)?_(?P<collective>{_COLLECTIVE})_(?P<algorithm>{_ALGORITHM})_(?P<protocol>"
                     rf"{_PROTOCOL})_(?P<op>{_OP})_(?P<dtype>{_C_TYPE})$")
# the algorithm is the shortest run that lets the rest match: AGxLL_R in AllReduce_AGxLL_R_sum_f32
_SYMMETRIC_KERNEL = re.compile(r"^ncclSymk?DevKernel_(?P<collective>AllGather|AllReduce|ReduceScatter)_(?P<algorithm>"
                               rf"[A-Za-z0-9_]+?)(?:_(?P<op>sum|avg)_(?P<dtype>{_SYMMETRIC_TYPE}))?(?:_profile)?$")
_NAMINGS = (_DEV_KERNEL, _KERNEL, _SYMMETRIC_KERNEL)

# NCCL's spellings of an element type, by the names PyTorch gives them
DTYPES = {
    "i8": "int8", "int8_t": "int8", "u8": "uint8", "uint8_t": "uint8",
    "i32": "int32", "int32_t": "int32", "u32": "uint32", "uint32_t": "uint32",
    "i64": "int64", "int64_t": "int64", "u64": "uint64", "uint64_t": "uint64",
    "f16": "float16", "half": "float16", "f32": "float32", "float": "float32", "f64": "float64", "double": "float64",
    "bf16": "bfloat16", "__nv_bfloat16": "bfloat16", "f8e4m3": "float8_e4m3", "f8e5m2": "float8_e5m2",
}
OPS = {"sum": "Sum", "avg": "Avg"}  # the symmetric kernels' lower-case ops; the others' are spelled as NCCL's API
# Collectives that copy rather than reduce: their 2.8-2.18 names carry Sum and int8_t as placeholders
COPIES = frozenset({"AllGather", "AllGatherV", "Broadcast", "SendRecv"})


@dataclass(frozen=True)
class Collective:
    """What an NCCL kernel's name says; a field is '' where the name does not say it."""

    kernel: str  # the kernel's identifier: its name without the mangling or the argument list
    collective: str  # AllReduce, AllGather, AllGatherV, ReduceScatter, Reduce, Broadcast, SendRecv, AllToAllPivot
    op: str  # the reduction op the kernel is specialized for: Sum, Prod, MinMax, PreMulSum, SumPostDiv, Avg
    dtype: str  # float32, bfloat16, float16, float64, int8, uint8, int32, uint32, int64, uint64, float8_e4m3, ...
    algorithm: str  # RING, TREE, NVLS, NVLS_TREE, COLLNET_DIRECT, COLLNET_CHAIN, PAT; symmetric: RSxLD_AGxST, ...
    protocol: str  # LL, LL128, SIMPLE

    @property
    def label(self) -> str:
        """How the kernel reads in a profile: `[nccl AllReduce float32] ncclDevKernel_AllReduce_Sum_f32_RING_LL`,
        `[nccl] ncclDevKernel_Generic` for a kernel whose name says no collective. The kernel's identifier stays, as
        Nsight Systems and torch.profiler show it, with the collective and type (what ran) in front."""
        known = " ".join(part for part in ("nccl", self.collective, self.dtype) if part)
        return f"[{known}] {self.kernel}"


def kernel_identifier(name: str) -> str:
    """The function's own name in a kernel name: what a mangled name's length prefix spans (`_Z39ncclDev…`), or a
    demangled name up to its template or argument list."""
    mangled = _MANGLED.match(name)
    if mangled:
        start = mangled.end()
        return name[start:start + int(mangled.group(1))]
    demangled = _DEMANGLED.match(name)
    return demangled.group(1) if demangled else ""


@lru_cache(maxsize=4096)
def nccl_collective(kernel_name: str) -> Collective | None:
    """The collective of an NCCL kernel, mangled or demangled; None for any other kernel. A name NCCL's kernels start
    with but of a form not known here is still NCCL's: its fields are '' but `kernel`."""
    if not NCCL_KERNEL.match(kernel_name):
        return None
    kernel = kernel_identifier(kernel_name)
    for naming in _NAMINGS:
        found = naming.match(kernel)
        if found:
            parts = found.groupdict(default="")
            break
    else:
        return Collective(kernel, "", "", "", "", "")
    collective = parts["collective"]
    copy = collective in COPIES
    return Collective(kernel, collective, "" if copy else OPS.get(parts.get("op", ""), parts.get("op", "")),
                      "" if copy else DTYPES.get(parts.get("dtype", ""), ""), parts.get("algorithm", ""),
                      parts.get("protocol", ""))


def nccl_label(function: str) -> str:
    """A kernel frame's name as a profile shows it: the label of an NCCL kernel, any other name as it is."""
    found = nccl_collective(function)
    return found.label if found else function
