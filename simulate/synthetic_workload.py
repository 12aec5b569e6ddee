"""What the simulated processes do: call paths per process kind (a small grammar over the synthetic binaries),
sampled CUDA launches with the kernels they ran, and NVML-like metrics."""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

import numpy as np

from schemas.wire import KERNEL_BINARY as K
from simulate.synthetic_binaries import OPS, RUST_FNS, RUST_MODULES, backward_node, op_class

if TYPE_CHECKING:
    from simulate.synthetic_fleet import SimNode, SyntheticFleet

PY, LPY, C, LD, CXX = "python3.11", "libpython3.11.so.1.0", "libc.so.6", "ld-linux-x86-64.so.2", "libstdc++.so.6"
TP, TC, TG = "libtorch_python.so", "libtorch_cpu.so", "libtorch_cuda.so"
RT, DRV, VEC = "libcudart.so.12", "libcuda.so.1", "vector"
TRAINER_BINARIES = [PY, LPY, LD, C, CXX, TP, TC, TG, RT, DRV]
KIND_BINARIES = {"trainer": TRAINER_BINARIES, "worker": TRAINER_BINARIES, "shipper": [VEC, LD, C]}  # exe first
PATHS_PER_KIND = {"trainer": 320, "worker": 120, "shipper": 60}
Frame = tuple[str, str]
GPU_NAME = "NVIDIA H100 80GB HBM3 (simulated)"
GPU_MEM_BYTES = 85_520_809_984
MEM_PAGE = 2 * 1024 * 1024  # device memory is handed out in 2 MiB pages, so NVML's used memory moves in them
LAUNCH_CALLBACK_ID = 211  # CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000
TRUE_LAUNCH_RATE = 5000.0  # kernel launches per second per busy GPU; each sampled launch stands for a share

# Kernels per op class: (name as CUPTI reports it, median duration in µs, lognormal sigma).
GPU_KERNELS: dict[str, list[tuple[str, float, float]]] = {
    "gemm": [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
         "kernel__5x_cublas", 420.0, 0.5),
        ("ampere_sgemm_128x64_tn", 180.0, 0.4),
        ("_ZN7cutlass6KernelI66cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_nn_align8EEvNT_6ParamsE",
         260.0, 0.5)],
    "attention": [("_ZN5flash16flash_fwd_kernelE16Flash_fwd_params", 900.0, 0.3)],
    "softmax": [("_ZN2at6native12_GLOBAL__N_119cunn_SoftMaxForwardILi8EfffNS1_22SoftMaxForwardEpilogueEEEvPT2_"
                 "PKT0_i", 35.0, 0.5)],
    "norm": [("_ZN2at6native12_GLOBAL__N_128vectorized_layer_norm_kernelIffEEviT0_PKT_S6_S6_PS4_S7_S7_", 28.0, 0.4)],
    "reduce": [("_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIfNS0_14func_wrapper_tIfNS0_11sum_functorIfff"
                "EEEEjfLi4EEEEEvT1_", 22.0, 0.6),
               ("_ZN2at6native12_GLOBAL__N_138nll_loss_forward_reduce_cuda_kernel_2dIffEEvPT_S4_PKS3_PKlS7_biii",
                18.0, 0.4)],
    "optimizer": [("_ZN2at6native12_GLOBAL__N_125multi_tensor_apply_kernelINS1_18TensorListMetadataILi4EEENS1_13"
                   "FusedAdamMathIfEEJffffffbEEEvT_T0_DpT1_", 140.0, 0.3)],
    "elementwise": [
        ("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIfEESt5arrayIPcLm3EEEEviT0_T1_",
         12.0, 0.6),
        ("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_13BinaryFunctorIfffNS0_15binary_internal10MulFunctor"
         "IfEEEESt5arrayIPcLm3EEEEviT0_T1_", 11.0, 0.6),
        ("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11GeluFunctorIfEESt5arrayIPcLm2EEEEviT0_T1_", 15.0, 0.5),
        ("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_", 4.0, 0.5)],
}
GPU_KERNELS["copy"] = GPU_KERNELS["elementwise"][3:]

_PY_ROOT = [(PY, "_start"), (C, "__libc_start_main"), (C, "__libc_start_call_main"), (PY, "main"),
            (LPY, "Py_BytesMain"), (LPY, "Py_RunMain"), (LPY, "pymain_run_python"), (LPY, "_PyRun_AnyFileObject"),
            (LPY, "_PyRun_SimpleFileObject"), (LPY, "run_mod"), (LPY, "run_eval_code_obj"), (LPY, "PyEval_EvalCode")]
_PY_CALLS = ["_PyFunction_Vectorcall", "method_vectorcall", "_PyObject_Call", "slot_tp_call",
             "_PyObject_FastCallDictTstate", "PyObject_Call"]
_PY_LEAVES = ["_PyEval_EvalFrameDefault", "_PyObject_Malloc", "_PyObject_Free", "_PyDict_GetItem_KnownHash",
              "PyList_Append", "_PyLong_Add", "binary_op1", "unicode_concatenate", "_PyObject_GenericGetAttrWithDict",
              "_PyType_Lookup", "lookdict_unicode_nodummy", "builtin_len", "list_iter", "dict_subscript",
              "tuple_dealloc", "PyObject_Hash", "long_richcompare", "unicode_hash", "func_vectorcall"]
_SYS = ["entry_SYSCALL_64_after_hwframe", "do_syscall_64"]
_KPATHS = {
    "ioctl": _SYS + ["__x64_sys_ioctl", "nvidia_unlocked_ioctl", "nvidia_ioctl", "rm_ioctl", "os_acquire_spinlock"],
    "read": _SYS + ["__x64_sys_read", "ksys_read", "vfs_read", "new_sync_read", "ext4_file_read_iter",
                    "generic_file_read_iter", "filemap_read", "copy_page_to_iter", "_copy_to_iter",
                    "copy_user_enhanced_fast_string"],
    "write": _SYS + ["__x64_sys_write", "ksys_write", "vfs_write", "new_sync_write", "sock_write_iter", "sock_sendmsg",
                     "tcp_sendmsg", "tcp_sendmsg_locked", "tcp_push", "__tcp_push_pending_frames", "tcp_write_xmit",
                     "__tcp_transmit_skb", "ip_queue_xmit", "ip_finish_output2", "__dev_queue_xmit"],
    "futex": _SYS + ["__x64_sys_futex", "do_futex", "futex_wait", "futex_wait_queue", "schedule", "__schedule",
                     "finish_task_switch"],
    "yield": _SYS + ["__x64_sys_sched_yield", "do_sched_yield", "schedule", "__schedule", "finish_task_switch"],
    "epoll": _SYS + ["__x64_sys_epoll_wait", "do_epoll_wait", "ep_poll", "schedule_hrtimeout_range", "schedule",
                     "__schedule"],
    "timer": ["asm_sysvec_apic_timer_interrupt", "sysvec_apic_timer_interrupt", "__sysvec_apic_timer_interrupt",
              "hrtimer_interrupt", "__hrtimer_run_queues", "tick_sched_timer", "update_process_times"],
    "fault": ["asm_exc_page_fault", "exc_page_fault", "do_user_addr_fault", "handle_mm_fault", "__handle_mm_fault",
              "do_anonymous_page", "clear_page_erms"],
}
_WAIT = [(C, "pthread_cond_wait"), (C, "__pthread_cond_wait_common"), (C, "__futex_abstimed_wait_common")]


def _kernel(r: random.Random, name: str) -> list[Frame]:
    """A kernel path, cut where the sample landed (never above the syscall handler)."""
    path = _KPATHS[name]
    return [(K, f) for f in path[: r.randint(min(3, len(path)), len(path))]]


def _maybe_interrupt(r: random.Random, frames: list[Frame]) -> list[Frame]:
    return frames + _kernel(r, "timer") if r.random() < 0.05 else frames


def _py(r: random.Random) -> list[Frame]:
    frames = list(_PY_ROOT)
    for _ in range(r.randint(2, 9)):
        frames += [(LPY, "_PyEval_EvalFrameDefault"), (LPY, r.choice(_PY_CALLS))]
    return frames + [(LPY, "_PyEval_EvalFrameDefault")]


def _torch_entry(r: random.Random, op: str) -> list[Frame]:
    return [(LPY, r.choice(["cfunction_call", "_PyObject_MakeTpCall", "method_vectorcall_VARARGS_KEYWORDS"])),
            (TP, f"torch::autograd::THPVariable_{op}"), (TC, f"at::_ops::{op}::call"),
            (TC, f"torch::autograd::VariableType::(anonymous namespace)::{op}"), (TC, f"at::_ops::{op}::redispatch")]


def _cuda_tail(r: random.Random, op: str) -> list[Frame]:
    """From the CUDA dispatch of `op` to the launch, and as deep into the driver as the sample landed."""
    launcher = {"gemm": "at::cuda::blas::gemm_internal_cublas", "reduce": "at::native::gpu_reduce_kernel"}.get(
        op_class(op), r.choice(["at::native::launch_vectorized_kernel", "at::native::launch_legacy_kernel"]))
    frames = [(TG, f"at::(anonymous namespace)::wrapper_CUDA_{op}"), (TG, f"at::native::{op}_kernel_cuda"),
              (TG, launcher), (RT, "cudaLaunchKernel")]
    depth = r.random()
    if depth < 0.3:
        return frames
    frames.append((RT, f"__cudart{100 + 3 * r.randrange(300)}"))
    if depth < 0.55:
        return frames
    frames += [(DRV, "cuLaunchKernel"), (DRV, f"_nv{2000 + 3 * r.randrange(133):06d}cuda")]
    return frames if depth < 0.85 else frames + [(C, "ioctl")] + _kernel(r, "ioctl")


def _cpu_tail(r: random.Random, op: str) -> list[Frame]:
    frames = [(TC, f"at::(anonymous namespace)::wrapper_CPU_{op}"), (TC, f"at::native::{op}"),
              (TC, r.choice(["at::TensorIteratorBase::build", "at::internal::invoke_parallel"])),
              (TC, f"at::native::(anonymous namespace)::{op}_kernel"), (TC, "at::native::DEFAULT::vectorized_loop")]
    x = r.random()
    if x < 0.3:
        return frames + [(C, r.choice(["__memmove_avx_unaligned_erms", "__memset_avx2_unaligned_erms"]))]
    if x < 0.45:
        return frames + [(TC, "c10::alloc_cpu"), (C, "malloc"), (C, "_int_malloc")] + (
            _kernel(r, "fault") if r.random() < 0.5 else [])
    return frames


def _thread_root() -> list[Frame]:
    return [(C, "clone3"), (C, "start_thread"), (CXX, "execute_native_thread_routine"),
            (TC, "torch::autograd::Engine::thread_init"), (TC, "torch::autograd::Engine::thread_main")]


def _trainer(r: random.Random) -> tuple[int, list[Frame], str]:
    x, op = r.random(), r.choice(OPS)
    if x < 0.34:
        return 0, _py(r) + _torch_entry(r, op) + _cuda_tail(r, op), op
    if x < 0.48:  # the autograd engine's device thread runs backward nodes
        frames = _thread_root() + [(TC, "torch::autograd::Engine::evaluate_function"),
                                   (TC, "torch::autograd::call_function"),
                                   (TC, f"torch::autograd::generated::{backward_node(op)}::apply"),
                                   (TC, f"at::_ops::{op}::call"), (TC, f"at::_ops::{op}::redispatch")]
        return r.randint(1, 2), frames + _cuda_tail(r, op), op
    if x < 0.56:
        return 0, _maybe_interrupt(r, _py(r) + _torch_entry(r, op) + _cpu_tail(r, op)), ""
    if x < 0.62:  # .item(): a device sync, spinning in the driver
        frames = _py(r) + [(LPY, "cfunction_call"), (TP, "torch::autograd::THPVariable_item"),
                           (TC, "at::_ops::item::call"), (TC, "at::native::item"),
                           (TC, "at::_ops::_local_scalar_dense::call"),
                           (TG, "at::(anonymous namespace)::wrapper_CUDA__local_scalar_dense"),
                           (TG, "at::cuda::memcpy_and_sync"), (RT, "cudaStreamSynchronize"),
                           (DRV, "cuStreamSynchronize"), (DRV, f"_nv{2000 + 3 * r.randrange(133):06d}cuda"),
                           (C, "sched_yield")]
        return 0, frames + (_kernel(r, "yield") if r.random() < 0.6 else []), ""
    if x < 0.67:
        frames = _thread_root() + [(CXX, "std::condition_variable::wait")] + _WAIT
        return r.randint(1, 2), frames + _kernel(r, "futex"), ""
    if x < 0.72:  # waiting for the GIL
        return 0, _py(r) + [(LPY, "PyEval_RestoreThread"), (LPY, "take_gil")] + _WAIT + _kernel(r, "futex"), ""
    if x < 0.74:
        return 0, _py(r) + [(LPY, "cfunction_call"), (LD, "_dl_runtime_resolve_xsavec"), (LD, "_dl_fixup"),
                            (LD, "_dl_lookup_symbol_x"), (LD, "do_lookup_x"), (LD, "check_match")], ""
    return 0, _maybe_interrupt(r, _python_leaf(r)), ""


def _python_leaf(r: random.Random) -> list[Frame]:
    x = r.random()
    if x < 0.15:
        return _py(r) + [(LPY, "gc_collect_main"), (LPY, r.choice(["dict_traverse", "list_traverse",
                                                                   "tuple_traverse", "func_clear"]))]
    if x < 0.3:
        return _py(r) + [(LPY, "_PyObject_Malloc"), (LPY, "_PyMem_RawMalloc"), (C, "malloc"), (C, "_int_malloc")]
    return _py(r) + [(LPY, r.choice(_PY_LEAVES))]


def _worker(r: random.Random) -> tuple[int, list[Frame], str]:
    x = r.random()
    if x < 0.3:  # reading samples from disk
        return 0, _py(r) + [(LPY, "cfunction_call"), (C, "read")] + _kernel(r, "read"), ""
    if x < 0.5:  # collate
        op = r.choice(["cat", "stack", "copy_", "to", "_to_copy", "clone", "contiguous"])
        return 0, _py(r) + _torch_entry(r, op) + _cpu_tail(r, op), ""
    if x < 0.6:  # waiting on the index queue
        return 0, _py(r) + [(LPY, "PyEval_SaveThread")] + _WAIT + _kernel(r, "futex"), ""
    return 0, _maybe_interrupt(r, _python_leaf(r)), ""


def _shipper(r: random.Random) -> tuple[int, list[Frame], str]:
    worker = [(C, "clone3"), (C, "start_thread"), (VEC, "std::sys::pal::unix::thread::Thread::new::thread_start"),
              (VEC, "tokio::runtime::scheduler::multi_thread::worker::run"),
              (VEC, "tokio::runtime::scheduler::multi_thread::worker::Context::run_task"),
              (VEC, "tokio::runtime::task::harness::poll")]
    x = r.random()
    if x < 0.25:
        return r.randint(1, 4), worker[:4] + [(VEC, "tokio::runtime::io::driver::Driver::turn"),
                                              (C, "epoll_wait")] + _kernel(r, "epoll"), ""
    crates = r.sample(["vector", "vector_core", "hyper", "serde_json", "vrl", "regex_automata"], r.randint(2, 4))
    chain = [(VEC, f"{c}::{r.choice(RUST_MODULES[c].split())}::{r.choice(RUST_FNS)}") for c in crates]
    if x < 0.45:
        return r.randint(1, 4), worker + chain + [(C, "write")] + _kernel(r, "write"), ""
    if x < 0.55:
        main = [(VEC, "_start"), (C, "__libc_start_main"), (C, "__libc_start_call_main"), (VEC, "main"),
                (VEC, "std::rt::lang_start_internal"), (VEC, "vector::main"),
                (VEC, "tokio::runtime::park::CachedParkThread::block_on"), (VEC, "vector::app::run")]
        return 0, main + chain, ""
    leaf = r.choice([(VEC, f"alloc::raw_vec::{r.choice(RUST_FNS)}"), (VEC, f"core::fmt::{r.choice(RUST_FNS)}"),
                     (C, "malloc"), (C, "__memmove_avx_unaligned_erms")])
    return r.randint(1, 4), _maybe_interrupt(r, worker + chain + [leaf]), ""


def build_paths(r: random.Random) -> list[tuple[str, int, list[Frame], str]]:
    """Distinct call paths per process kind: (kind, thread, frames root first, CUDA op launched or "")."""
    out = []
    for kind, make in (("trainer", _trainer), ("worker", _worker), ("shipper", _shipper)):
        seen: set = set()
        while len(seen) < PATHS_PER_KIND[kind]:
            thread, frames, op = make(r)
            key = (thread, tuple(frames))
            if key not in seen:
                seen.add(key)
                out.append((kind, thread, frames, op))
    return out


def gpu_window(fleet: SyntheticFleet, node: SimNode, start_ns: int, window_ns: int, launch_rate: float,
               tally: dict[tuple[int, str], list[int]] | None = None) -> tuple[list[dict], list[dict]]:
    """Sampled launches (GpuLaunch) of every trainer in one window, each with the kernel it ran (GpuKernel).

    As the agent's rate limit does, a sampled launch stands for itself and the launches skipped since the previous
    sample: its weight is the gap between their correlation ids. The first launch of a process in the window carries
    the process's mappings, the others []. `tally` (optional) gets [duration x weight, weight] added per (launching
    path, kernel name): what the correlator must attribute."""
    rng, paths, t = node.rng, fleet.launch_paths, fleet.templates
    # at most 2^19: a weight stays within what the correlator takes (processors/correlate.py MAX_WEIGHT)
    mean_gap = min(1 << 19, max(1, round(TRUE_LAUNCH_RATE / launch_rate))) if launch_rate > 0 else 1
    weights = np.arange(1, len(paths) + 1) ** -fleet.zipf_s
    launches: list[dict] = []
    kernels: list[dict] = []
    for p, proc in enumerate(node.processes):
        n = int(rng.poisson(launch_rate * window_ns / 1e9)) if proc.kind == "trainer" and paths else 0
        if n == 0:
            continue
        times = np.sort(rng.integers(start_ns, start_ns + window_ns, n)).tolist()
        which = rng.choice(len(paths), n, p=weights / weights.sum()).tolist()
        gaps = rng.integers(1, 2 * mean_gap, n)
        corr = (node.correlation.get(proc.pid, 0) + np.cumsum(gaps)).tolist()
        stand_for = gaps.tolist()
        node.correlation[proc.pid] = corr[-1]
        queue = rng.lognormal(math.log(20_000), 1.0, n).astype(np.int64).tolist()
        pick, z = rng.random(n).tolist(), rng.standard_normal(n).tolist()
        for i in range(n):
            tpl = paths[which[i]]
            name, median_us, sigma = (c := GPU_KERNELS[op_class(t.ops[tpl])])[int(pick[i] * len(c))]
            begin = times[i] + queue[i]
            duration = max(1000, int(median_us * 1000 * math.exp(sigma * z[i])))
            launches.append({"node": node.name, "pid": proc.pid, "tid": proc.pid + int(t.thread[tpl]),
                             "process_start_ns": proc.start_ns, "time_ns": times[i], "correlation_id": corr[i],
                             "callback_id": LAUNCH_CALLBACK_ID, "api_name": "cudaLaunchKernel",
                             "identity_id": proc.identity_id,
                             "weight": stand_for[i], "user_addrs": fleet.launch_stack(node, p, tpl),
                             "mappings": proc.mappings if i == 0 else [], "simulated": True})
            kernels.append({"node": node.name, "pid": proc.pid, "process_start_ns": proc.start_ns,
                            "correlation_id": corr[i], "start_ns": begin, "end_ns": begin + duration,
                            "device_id": proc.device, "stream_id": 7, "kernel_name": name, "simulated": True})
            if tally is not None:
                cell = tally.setdefault((tpl, name), [0, 0])
                cell[0] += duration * stand_for[i]
                cell[1] += stand_for[i]
    return launches, kernels


def metrics(fleet: SyntheticFleet, node: SimNode, time_ns: int) -> dict:
    """One NVML poll (GpuMetrics): utilization around the node's baseline, power and temperature following it."""
    rng, g = node.rng, fleet.gpus
    util = np.clip(node.util + rng.normal(0, 4, g), 0, 100).astype(int).tolist()
    noise = rng.normal(0, 1, (4, g))
    # used memory moves in the allocator's 2 MiB pages (~200 MB either way), as NVML reports it, not byte by byte
    mem = (node.mem_used + np.rint(noise[0] * 100).astype(np.int64) * MEM_PAGE).tolist()
    pcie = rng.integers(2_000_000, 12_000_000, (2, g)).tolist()
    devices = [{"index": i, "uuid": node.gpu_uuids[i], "name": GPU_NAME, "parent_uuid": "", "gpu_util_pct": u,
                "mem_util_pct": int(np.clip(u * 0.6 + noise[1, i] * 3, 0, 100)), "mem_used_bytes": mem[i],
                "mem_total_bytes": GPU_MEM_BYTES, "sm_clock_mhz": 1980 if u > 5 else 345, "mem_clock_mhz": 2619,
                "power_mw": min(700_000, int(90_000 + u * 6_000 + noise[2, i] * 5_000)), "power_limit_mw": 700_000,
                "temperature_c": int(32 + u * 0.4 + noise[3, i]), "pcie_tx_kbps": pcie[0][i],
                "pcie_rx_kbps": pcie[1][i], "clock_event_reasons": 0 if u > 5 else 1, "xid_errors": [],
                "identity_id": node.gpu_owner_ids[i] if node.gpu_owner_ids else 0}
               for i, u in enumerate(util)]
    procs = [{"device_index": p.device, "pid": p.pid, "comm": p.comm, "container_id": p.container_id,
              "sm_util_pct": util[p.device], "mem_util_pct": devices[p.device]["mem_util_pct"],
              "used_memory_bytes": mem[p.device] - 512 * 1024 * 1024, "identity_id": p.identity_id}
             for p in node.processes if p.kind == "trainer"]
    return {"node": node.name, "time_ns": time_ns, "simulated": True, "devices": devices, "processes": procs}
