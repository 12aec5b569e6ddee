"""NCCL kernel names as CUPTI reports them (mangled) and as stored frames hold them (demangled), built the way NCCL's
own kernel generators name them, each with what fleetprof/collectives.py should read in it; and kernel names that are
not NCCL's. tests/test_collectives.py judges the Python reading on them, tests/test_collectives_sql.py the SQL one.
"""

from __future__ import annotations

from collections.abc import Iterator

# (NCCL >= 2.19 short type, 2.8-2.18 C type or None where those names never had it, the name PyTorch gives it)
TYPES = [("i8", "int8_t", "int8"), ("u8", "uint8_t", "uint8"), ("i32", "int32_t", "int32"),
         ("u32", "uint32_t", "uint32"), ("i64", "int64_t", "int64"), ("u64", "uint64_t", "uint64"),
         ("f16", "half", "float16"), ("f32", "float", "float32"), ("f64", "double", "float64"),
         ("bf16", "__nv_bfloat16", "bfloat16"), ("f8e4m3", None, "float8_e4m3"), ("f8e5m2", None, "float8_e5m2")]
REDUCTIONS = ("AllReduce", "Reduce", "ReduceScatter")
COPIES = ("AllGather", "AllGatherV", "Broadcast")
OLD_ALGORITHMS = ("TREE", "RING", "COLLNET", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE")

# How each generation's kernels take their arguments: (mangled suffix, demangled argument list)
DEV_ARGS = ("24ncclDevKernelArgsStorageILm4096EE", "(ncclDevKernelArgsStorage<4096ul>)")  # NCCL >= 2.19
WORK_ARGS = ("P11ncclDevCommmP8ncclWork", "(ncclDevComm*, unsigned long, ncclWork*)")  # 2.12 to 2.18
ELEM_ARGS = ("12ncclWorkElem", "(ncclWorkElem)")  # 2.8 to 2.11
SYMMETRIC_ARGS = ("14ncclSymDevArgs", "(ncclSymDevArgs)")  # 2.27
SYMMETRIC_WORK_ARGS = ("21ncclSymkDevWorkArgs4K", "(ncclSymkDevWorkArgs4K)")  # 2.28 and later

Expected = tuple[str, str, str, str, str, str]  # kernel, collective, op, dtype, algorithm, protocol


def _both(kernel: str, args: tuple[str, str], expected: Expected) -> Iterator[tuple[str, Expected]]:
    yield f"_Z{len(kernel)}{kernel}{args[0]}", expected
    yield f"{kernel}{args[1]}", expected


def nccl_kernels() -> list[tuple[str, Expected]]:
    """(kernel name, what it says) for every kernel name form of NCCL's, mangled and demangled."""
    names: list[tuple[str, Expected]] = []
    # NCCL >= 2.19: reductions specialized per type for RING and TREE with LL; copies once; the rest generic
    for coll in REDUCTIONS:
        for short, _, dtype in TYPES:
            for algo in ("RING", "TREE"):
                kernel = f"ncclDevKernel_{coll}_Sum_{short}_{algo}_LL"
                names += _both(kernel, DEV_ARGS, (kernel, coll, "Sum", dtype, algo, "LL"))
    for coll in COPIES:
        kernel = f"ncclDevKernel_{coll}_RING_LL"
        names += _both(kernel, DEV_ARGS, (kernel, coll, "", "", "RING", "LL"))
    for kernel, expected in [
            ("ncclDevKernel_SendRecv", ("SendRecv", "", "", "", "")),
            ("ncclDevKernel_AllReduce_MinMax_bf16_NVLS_TREE_SIMPLE", ("AllReduce", "MinMax", "bfloat16", "NVLS_TREE",
                                                                      "SIMPLE")),
            ("ncclDevKernel_ReduceScatter_PreMulSum_f16_COLLNET_DIRECT_LL128", ("ReduceScatter", "PreMulSum",
                                                                                "float16", "COLLNET_DIRECT", "LL128")),
            ("ncclDevKernel_AllGather_PAT_SIMPLE", ("AllGather", "", "", "PAT", "SIMPLE")),
            ("ncclDevKernelDebug_AllReduce_Sum_f32_RING_LL", ("AllReduce", "Sum", "float32", "RING", "LL")),
            ("ncclDevKernel_AllToAllPivot_RING_SIMPLE", ("AllToAllPivot", "", "", "RING", "SIMPLE")),  # RCCL
            ("ncclDevKernel_Generic", ("", "", "", "", "")),
            ("ncclDevKernel_Generic_1", ("", "", "", "", "")),  # RCCL's unrolled variants
            ("ncclDevKernel_Generic_4", ("", "", "", "", "")),
            ("ncclDevKernelDebug_Generic", ("", "", "", "", ""))]:
        names += _both(kernel, DEV_ARGS, (kernel, *expected))
    # 2.8 to 2.18: Sum kernels for LL per collective, algorithm and type; copies and send/recv on int8_t placeholders
    for coll in REDUCTIONS:
        for _, ctype, dtype in TYPES:
            for algo in OLD_ALGORITHMS:
                if ctype:
                    kernel = f"ncclKernel_{coll}_{algo}_LL_Sum_{ctype}"
                    names += _both(kernel, WORK_ARGS, (kernel, coll, "Sum", dtype, algo, "LL"))
    for coll, algo, proto in [("AllGather", "RING", "LL"), ("Broadcast", "RING", "LL"), ("AllGather", "NVLS", "LL"),
                              ("SendRecv", "RING", "SIMPLE")]:
        kernel = f"ncclKernel_{coll}_{algo}_{proto}_Sum_int8_t"
        names += _both(kernel, WORK_ARGS, (kernel, coll, "", "", algo, proto))
    names += _both("ncclKernel_AllReduce_RING_LL_Sum_float", ELEM_ARGS,
                   ("ncclKernel_AllReduce_RING_LL_Sum_float", "AllReduce", "Sum", "float32", "RING", "LL"))
    names += _both("ncclKernelDebug_AllReduce_TREE_LL_Sum_half", WORK_ARGS,
                   ("ncclKernelDebug_AllReduce_TREE_LL_Sum_half", "AllReduce", "Sum", "float16", "TREE", "LL"))
    names += _both("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", ELEM_ARGS,
                   ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "SendRecv", "", "", "RING", "SIMPLE"))
    # symmetric memory kernels: algorithms of their own, lower-case ops
    for prefix, args in (("ncclSymDevKernel", SYMMETRIC_ARGS), ("ncclSymkDevKernel", SYMMETRIC_WORK_ARGS)):
        for rest, expected in [
                ("AllReduce_RSxLD_AGxST_sum_bf16", ("AllReduce", "Sum", "bfloat16", "RSxLD_AGxST")),
                ("AllReduce_AGxLL_R_sum_f32", ("AllReduce", "Sum", "float32", "AGxLL_R")),
                ("AllReduce_AGxLLMC_R_sum_f8e5m2", ("AllReduce", "Sum", "float8_e5m2", "AGxLLMC_R")),
                ("ReduceScatter_LL_sum_f16", ("ReduceScatter", "Sum", "float16", "LL")),
                ("ReduceScatter_RailA2A_LsaLD_avg_f8e4m3", ("ReduceScatter", "Avg", "float8_e4m3", "RailA2A_LsaLD")),
                ("AllGather_LLMC", ("AllGather", "", "", "LLMC")),
                ("AllGather_RailRing_LsaSTMC", ("AllGather", "", "", "RailRing_LsaSTMC"))]:
            kernel = f"{prefix}_{rest}"
            names += _both(kernel, args, (kernel, *expected, ""))
    # the instrumented variant a profiler gets (2.28 and later)
    names += _both("ncclSymkDevKernel_AllReduce_RSxLD_AGxST_sum_bf16_profile", SYMMETRIC_WORK_ARGS,
                   ("ncclSymkDevKernel_AllReduce_RSxLD_AGxST_sum_bf16_profile", "AllReduce", "Sum", "bfloat16",
                    "RSxLD_AGxST", ""))
    return names


# Kernels that are not NCCL's, some of them close
NOT_NCCL = [
    "ncclSomethingElse",
    "ncclKernel",
    "ncclDevKernelArgsStorage",
    "my_ncclKernel_AllReduce_RING_LL_Sum_float",
    "_Z41my_ncclKernel_AllReduce_RING_LL_Sum_floatv",
    "_ZN4nccl22ncclKernel_AllReduce_xEv",  # a namespace's function of that name
    "ampere_sgemm_128x64_nn",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >"
    "(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)",
    "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_",
    "cross_device_reduce_1stage",  # vLLM's own all-reduce: a collective, but not NCCL's
    "ncclAllReduceRingLLKernel_sum_f32(ncclColl)",  # NCCL 2.4 to 2.7, not read
    "",
]
