"""The synthetic fleet's binaries: realistic names (C, Itanium-mangled C++, Rust legacy and v0), symbol tables,
PT_LOAD segments and stable build ids. Everything here depends only on the binary's name, never on a loadgen seed,
so one build id always means one table (the `symbols` topic is compacted by build id)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from producers.symbol_chunks import chunk_symbol_table
from schemas.wire import DEFAULT_MAX_BYTES, KERNEL_BINARY

PAGE = 0x1000
KERNEL_BUILD_ID = "kernel-6.1.0-sim"
KERNEL_BASE = 0xFFFFFFFF81000000
MODULE_BASE = 0xFFFFFFFFC0A00000  # the nvidia module's text, also in kallsyms
CONDA_LIB, TORCH_LIB = "/opt/conda/lib", "/opt/conda/lib/python3.11/site-packages/torch/lib"
SYS_LIB = "/usr/lib/x86_64-linux-gnu"

OPS = ("add mul sub div mm addmm bmm baddbmm matmul linear relu gelu silu tanh sigmoid softmax _softmax log_softmax "
       "layer_norm native_layer_norm rms_norm dropout native_dropout embedding index_select gather scatter_add cat "
       "stack copy_ to _to_copy clone contiguous view reshape transpose permute expand sum mean max min argmax topk "
       "sort cumsum exp log sqrt rsqrt pow neg abs clamp where masked_fill fill_ zero_ zeros empty ones full arange "
       "nll_loss cross_entropy_loss mse_loss _foreach_add _foreach_mul _foreach_addcdiv _foreach_sqrt _fused_adam "
       "scaled_dot_product_attention _scaled_dot_product_flash_attention _flash_attention_forward "
       "_efficient_attention_forward conv2d convolution cudnn_convolution batch_norm native_batch_norm "
       "upsample_nearest2d avg_pool2d max_pool2d_with_indices nonzero unique _local_scalar_dense item multinomial "
       "randperm normal_ uniform_ bernoulli_ index_put_ slice select squeeze unsqueeze flatten split chunk narrow "
       "repeat tril triu bitwise_and logical_not eq ne lt gt").split()
_OP_CLASS = {"gemm": "mm addmm bmm baddbmm matmul linear conv2d convolution cudnn_convolution",
             "attention": "scaled_dot_product_attention _scaled_dot_product_flash_attention _flash_attention_forward "
                          "_efficient_attention_forward",
             "softmax": "softmax _softmax log_softmax", "optimizer": "_foreach_add _foreach_mul _foreach_addcdiv "
                                                                     "_foreach_sqrt _fused_adam",
             "norm": "layer_norm native_layer_norm rms_norm batch_norm native_batch_norm",
             "reduce": "sum mean max min argmax cumsum nll_loss cross_entropy_loss mse_loss topk sort",
             "copy": "copy_ to _to_copy clone contiguous cat stack fill_ zero_ zeros ones full empty"}
_CLASS_OF = {op: cls for cls, ops in _OP_CLASS.items() for op in ops.split()}
_SIGS = ("at::Tensor const&", "at::Tensor const&, at::Tensor const&",
         "at::Tensor const&, at::Tensor const&, c10::Scalar const&", "at::Tensor const&, c10::ArrayRef<long>",
         "at::Tensor const&, long, bool", "at::Tensor const&, c10::optional<c10::ScalarType>")


def op_class(op: str) -> str:
    """Which family of CUDA kernels an op launches."""
    return _CLASS_OF.get(op, "elementwise")


def _h(*parts: object) -> int:
    return int.from_bytes(hashlib.sha1("/".join(map(str, parts)).encode()).digest()[:8], "little")


# --- mangling ----------------------------------------------------------------------------------------------------
_BUILTIN = {"void": "v", "bool": "b", "char": "c", "signed char": "a", "unsigned char": "h", "int": "i",
            "unsigned int": "j", "long": "l", "unsigned long": "m", "float": "f", "double": "d"}
_B36 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_B62 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _digits(n: int, alphabet: str) -> str:
    out = ""
    while True:
        n, d = divmod(n, len(alphabet))
        out = alphabet[d] + out
        if n == 0:
            return out


def _split_args(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += (ch == "<") - (ch == ">")
        cur += ch
    return out + [cur.strip()] if cur.strip() else out


def _parse(t: str) -> tuple:
    t = t.strip()
    for suffix, code in (("&&", "O"), ("&", "R"), ("*", "P"), (" const", "K")):
        if t.endswith(suffix):
            return (code, _parse(t[: -len(suffix)]))
    if t in _BUILTIN:
        return ("b", _BUILTIN[t])
    name, _, args = t.partition("<")
    return ("n", tuple(name.split("::")), tuple(_parse(a) for a in _split_args(args.rstrip()[:-1])))


def _source(name: str) -> str:
    return "12_GLOBAL__N_1" if name == "(anonymous namespace)" else f"{len(name)}{name}"


class _Mangler:
    """Itanium C++ ABI mangling of the subset this model uses: nested names, template arguments on the last
    name, const, pointers, references and builtins, with substitutions (S_, S0_, …) as compilers emit them."""

    def __init__(self) -> None:
        self.subs: list[tuple] = []

    def _ref(self, key: tuple) -> str:
        i = self.subs.index(key)
        return "S_" if i == 0 else f"S{_digits(i - 1, _B36)}_"

    def type(self, t: tuple) -> str:
        if t[0] == "b":
            return t[1]
        if t in self.subs:
            return self._ref(t)
        if t[0] == "n":
            return self.name(t[1], t[2])
        out = t[0] + self.type(t[1])
        self.subs.append(t)
        return out

    def name(self, comps: tuple[str, ...], args: tuple = (), function: bool = False) -> str:
        nested = False
        if comps == ("std", "allocator"):
            out = "Sa"
        else:
            first = 1 if comps[0] == "std" else 0
            out, start = ("St" if first else ""), first
            for i in range(len(comps) - 1, first, -1):
                if ("n", comps[:i], ()) in self.subs:
                    out, start = self._ref(("n", comps[:i], ())), i
                    break
            for i in range(start, len(comps)):
                out += _source(comps[i])
                if i < len(comps) - 1 or not function:
                    self.subs.append(("n", comps[: i + 1], ()))
            nested = len(comps) - first > 1
            out = "N" + out if nested else out
        if args:
            out += "I" + "".join(self.type(a) for a in args) + "E"
            if not function:
                self.subs.append(("n", comps, args))
        return out + "E" if nested else out


def mangle(qualname: str, params: str = "") -> str:
    """`mangle("at::native::add", "at::Tensor const&, at::Tensor const&")` -> `_ZN2at6native3addERKNS_6TensorES3_`."""
    m = _Mangler()
    head = m.name(tuple(qualname.split("::")), function=True)
    types = [_parse(p) for p in _split_args(params)]
    return "_Z" + head + ("".join(m.type(t) for t in types) if types else "v")


def rust_legacy(path: str) -> str:
    """Rust's legacy mangling: an Itanium-style nested name ending in a 16-hex hash."""
    return "_ZN" + "".join(_source(c) for c in path.split("::")) + f"17h{_h(path):016x}E"


def rust_v0(path: str) -> str:
    """Rust's v0 mangling of crate::module::…::function."""
    crate, *rest = path.split("::")
    ident = [f"{len(s)}_{s}" if s[0].isdigit() or s[0] == "_" else f"{len(s)}{s}" for s in rest]
    root = f"Cs{_digits(_h(crate) % 62**6, _B62)}_{len(crate)}{crate}"
    return "_RNv" + "Nt" * (len(rest) - 1) + root + "".join(ident)


# --- names -------------------------------------------------------------------------------------------------------
PYTHON_EXE = "_start main _init _fini deregister_tm_clones register_tm_clones __do_global_dtors_aux frame_dummy"
LD_SO = ("_dl_start _dl_start_user _dl_runtime_resolve_xsavec _dl_fixup _dl_lookup_symbol_x do_lookup_x check_match "
         "_dl_map_object _dl_map_object_from_fd _dl_relocate_object _dl_catch_exception _dl_open dl_open_worker "
         "_dl_init call_init _dl_sysdep_start _dl_new_object _dl_name_match_p _dl_tlsdesc_return __tls_get_addr "
         "_dl_update_slotinfo update_get_addr _dl_allocate_tls _dl_deallocate_tls _dl_find_object")
KERNEL_CORE = (
    "entry_SYSCALL_64 entry_SYSCALL_64_after_hwframe do_syscall_64 syscall_exit_to_user_mode "
    "exit_to_user_mode_prepare __x64_sys_read ksys_read vfs_read new_sync_read ext4_file_read_iter "
    "generic_file_read_iter filemap_read filemap_get_pages copy_page_to_iter _copy_to_iter "
    "copy_user_enhanced_fast_string __x64_sys_write ksys_write vfs_write new_sync_write sock_write_iter sock_sendmsg "
    "tcp_sendmsg tcp_sendmsg_locked tcp_push __tcp_push_pending_frames tcp_write_xmit __tcp_transmit_skb "
    "ip_queue_xmit ip_finish_output2 __dev_queue_xmit __x64_sys_ioctl do_vfs_ioctl __x64_sys_futex do_futex "
    "futex_wait futex_wait_queue schedule __schedule finish_task_switch __x64_sys_sched_yield do_sched_yield "
    "__x64_sys_epoll_wait do_epoll_wait ep_poll schedule_hrtimeout_range asm_exc_page_fault exc_page_fault "
    "do_user_addr_fault handle_mm_fault __handle_mm_fault do_anonymous_page clear_page_erms "
    "asm_sysvec_apic_timer_interrupt sysvec_apic_timer_interrupt __sysvec_apic_timer_interrupt hrtimer_interrupt "
    "__hrtimer_run_queues tick_sched_timer update_process_times _raw_spin_lock _raw_spin_unlock_irqrestore "
    "native_queued_spin_lock_slowpath __x64_sys_poll do_sys_poll __x64_sys_nanosleep hrtimer_nanosleep do_nanosleep")
KERNEL_FILLER = " ".join(
    p + v for p in ("ext4_ tcp_ udp_ ip_ sk_ mm_ vma_ page_ folio_ sched_ rcu_ irq_ blk_ nvme_ xfs_ cgroup_ bpf_ perf_ "
                    "kmem_cache_ dentry_ inode_ hrtimer_ timer_ task_ signal_ net_ skb_ sock_ mem_cgroup_ kvm_").split()
    for v in ("alloc free init lookup insert remove update flush wait wake_up lock unlock commit submit complete "
              "release get put open close read write poll queue dequeue balance account charge uncharge "
              "handle").split())
NVIDIA_MODULE = ("nvidia_unlocked_ioctl nvidia_ioctl nvidia_frontend_unlocked_ioctl rm_ioctl os_acquire_spinlock "
                 "os_release_spinlock nv_alloc_pages " + " ".join(f"_nv{n:06d}rm" for n in range(1000, 1300, 7)))


def _libc() -> str:
    core = ("__libc_start_main __libc_start_call_main malloc free calloc realloc _int_malloc _int_free "
            "malloc_consolidate read write ioctl sched_yield epoll_wait poll clone3 start_thread pthread_cond_wait "
            "__pthread_cond_wait_common pthread_mutex_lock __lll_lock_wait __futex_abstimed_wait_common "
            "pthread_create nanosleep clock_nanosleep clock_gettime sendmsg recvmsg mmap64 munmap madvise open64 "
            "close fstat64 getpid __qsort_r msort_with_tmp fwrite _IO_file_xsputn __vfprintf_internal snprintf "
            "____strtol_l_internal dlopen dlsym getenv abort raise exit __run_exit_handlers")
    fast = [f"__{b}{v}" for b in ("memmove memset memcpy strlen strchr strrchr memchr strcmp strncmp strcpy stpcpy "
                                  "strnlen memcmp wcslen rawmemchr strcat").split()
            for v in "_sse2_unaligned _sse2_unaligned_erms _avx_unaligned_erms _avx2_unaligned_erms _avx2 _avx2_rtm "
                     "_evex _evex_movbe _avx512_unaligned_erms _ssse3".split()]
    posix = ("accept bind connect listen socket getsockopt setsockopt fcntl dup2 pipe2 readv writev pread64 pwrite64 "
             "lseek64 stat64 lstat64 access unlink rename mkdir rmdir opendir readdir64 closedir getcwd chdir kill "
             "sigaction sigprocmask getuid geteuid getrlimit setrlimit sysconf uname gettimeofday localtime_r "
             "gmtime_r mktime strftime setlocale iconv fopen fclose fread fgets fputs fflush fseek ftell perror "
             "strerror_r bsearch rand_r random srandom getaddrinfo freeaddrinfo inet_ntop inet_pton").split()
    return " ".join([core, *fast, *(f"{p}{n}" for n in posix for p in ("", "__GI_", "__libc_"))])


def _libpython() -> str:
    core = ("Py_BytesMain Py_RunMain pymain_run_python _PyRun_AnyFileObject _PyRun_SimpleFileObject run_mod "
            "run_eval_code_obj PyEval_EvalCode _PyEval_EvalFrameDefault _PyFunction_Vectorcall method_vectorcall "
            "_PyObject_Call slot_tp_call _PyObject_FastCallDictTstate PyObject_Call _PyObject_MakeTpCall "
            "cfunction_call cfunction_vectorcall_FASTCALL_KEYWORDS method_vectorcall_VARARGS_KEYWORDS _PyObject_Malloc "
            "_PyObject_Free _PyDict_GetItem_KnownHash PyList_Append _PyLong_Add binary_op1 unicode_concatenate "
            "_PyObject_GenericGetAttrWithDict gc_collect_main PyGC_Collect take_gil drop_gil PyEval_RestoreThread "
            "PyEval_SaveThread _PyMem_RawMalloc builtin_len _PyType_Lookup lookdict_unicode_nodummy")
    types = ("Long Float Unicode List Dict Tuple Bytes Set Object Type Module Frame Code Gen Iter Number Sequence "
             "Mapping Err Import Thread GC").split()
    methods = ("New FromLong AsLong GetItem SetItem Size Append Contains Check Repr Str Hash Compare Concat Clear Copy "
               "Fini Init").split()
    statics = [f"{t}_{m}" for t in "list dict tuple long float unicode bytes set frame gen func method type".split()
               for m in ("new dealloc repr hash richcompare traverse clear iter iternext subscript ass_subscript "
                         "contains vectorcall getattro").split()]
    return " ".join([core, *(f"Py{t}_{m}" for t in types for m in methods), *statics])


def _cudart() -> str:
    api = ("LaunchKernel LaunchKernelExC MemcpyAsync MemsetAsync StreamSynchronize DeviceSynchronize EventRecord "
           "EventQuery StreamWaitEvent Malloc Free MallocAsync FreeAsync GetDevice SetDevice GetLastError "
           "PeekAtLastError GetDeviceCount StreamGetCaptureInfo FuncGetAttributes PointerGetAttributes HostAlloc "
           "Memcpy StreamCreateWithPriority EventCreateWithFlags EventDestroy EventSynchronize GraphLaunch "
           "DeviceGetAttribute OccupancyMaxActiveBlocksPerMultiprocessor").split()
    return " ".join([*(f"cuda{a}" for a in api), *(f"__cudart{n}" for n in range(100, 1000, 3))])


def _libcuda() -> str:
    objs = ("Mem Stream Event Ctx Module Func Launch Graph Device Pointer Occupancy Array Tex Surf Link Library "
            "Kernel MemPool Ipc Profiler").split()
    verbs = ("Create Destroy Synchronize Query GetAttribute SetAttribute Record Alloc Free Get Set Push Pop Load "
             "Unload Wait Map Unmap Export Import Retain Release GetInfo").split()
    core = "cuLaunchKernel cuLaunchKernelEx cuMemcpyHtoDAsync_v2 cuMemcpyDtoHAsync_v2 cuCtxGetCurrent"
    internal = [f"_nv{n:06d}cuda" for n in range(2000, 2400, 3)]  # stripped driver internals, named for the model
    return " ".join([core, *(f"cu{o}{v}" for o in objs for v in verbs), *internal])


def _libstdcxx() -> list[tuple[str, str]]:
    raw = _c("_Znwm _ZdlPv _ZdlPvm _Znam _ZdaPv __cxa_throw __cxa_begin_catch __cxa_allocate_exception "
             "__gxx_personality_v0 execute_native_thread_routine")
    classes = ("locale ios_base basic_ios ostream istream __basic_file filebuf stringbuf thread condition_variable "
               "mutex __shared_count random_device chrono::_V2::system_clock __detail::_Prime_rehash_policy bad_alloc "
               "runtime_error logic_error exception error_category ctype numpunct codecvt").split()
    methods = ("_M_init _M_dispose _M_release _M_destroy _M_run what flush put write sync imbue seekoff overflow "
               "underflow xsputn xsgetn _M_insert _M_extract now notify_all notify_one wait lock unlock _M_next_bkt "
               "_M_need_rehash").split()
    params = ("", "unsigned long", "char const*", "char const*, long", "int", "void*")
    items = [("std::condition_variable::wait", "std::unique_lock<std::mutex>&")]
    items += [(f"std::{c}::{m}", params[_h(c, m) % len(params)]) for c in classes for m in methods]
    return raw + _cxx(items)


def _libtorch_python() -> list[tuple[str, str]]:
    items = [(f"torch::autograd::THPVariable_{op}", "_object*, _object*, _object*") for op in OPS]
    items += [(f"torch::autograd::THPVariable_{op}_", "_object*, _object*, _object*") for op in OPS
              if not op.endswith("_")]
    items += [("pybind11::cpp_function::dispatcher", "_object*, _object*, _object*"),
              ("torch::autograd::python::PythonEngine::execute",
               "std::vector<torch::autograd::Edge, std::allocator<torch::autograd::Edge> > const&, "
               "std::vector<at::Tensor, std::allocator<at::Tensor> > const&, bool, bool, bool, "
               "std::vector<torch::autograd::Edge, std::allocator<torch::autograd::Edge> > const&"),
              ("torch::autograd::THPEngine_run_backward", "_object*, _object*, _object*"),
              ("torch::utils::wrap_tensor", "at::Tensor")]
    return _c("THPFunction_apply THPVariable_getitem THPVariable_setitem") + _cxx(items)


# --- the catalogue -----------------------------------------------------------------------------------------------
@dataclass(eq=False)
class Binary:
    name: str  # file name, as frames show it
    path: str
    build_id: str
    kind: str  # ELF or KERNEL
    names: list[str]  # symbol names in address order
    addrs: np.ndarray  # uint64 function starts: ELF vaddrs, absolute for the kernel
    sizes: np.ndarray  # int64
    segments: list[tuple[int, int, int]]  # PT_LOAD (file_offset, vaddr, memsz); none for the kernel
    text: tuple[int, int, int]  # the executable segment
    span: int  # address space one mapping of the whole file takes
    index: dict[str, int]  # readable key (C++ qualified name, Rust path) -> symbol index

    def symbol_chunks(self, max_bytes: int | None = DEFAULT_MAX_BYTES) -> list[dict]:
        """SymbolChunk records, each encoding to at most `max_bytes`, as the agent chunks a real table."""
        segs = [{"file_offset": o, "vaddr": v, "memsz": m} for o, v, m in self.segments]
        return chunk_symbol_table(self.build_id, self.name, self.kind, segs, self.addrs.view(np.int64).tolist(),
                                  self.sizes.tolist(), self.names, max_bytes)


def _page_up(n: int) -> int:
    return -(-n // PAGE) * PAGE


def _place(name: str, entries: list[tuple[str, str]], base: int) -> tuple[list[str], np.ndarray, np.ndarray, dict]:
    """Functions in a shuffled order, 16-aligned, with padding between them, from `base` on."""
    rng = np.random.default_rng(_h("layout", name))
    keys: dict[str, str] = {}
    for key, symbol in entries:
        keys.setdefault(key, symbol)  # the first symbol per key wins
    order = rng.permutation(len(keys))
    items = list(keys.items())
    sizes = np.clip(rng.lognormal(5.3, 1.1, len(items)), 24, 40_000).astype(np.int64)
    slots = (sizes + 15) // 16 * 16 + 16 * rng.integers(0, 3, len(items))
    starts = np.uint64(base) + (np.cumsum(slots) - slots).astype(np.uint64)
    names = [items[i][1] for i in order]
    index = {items[i][0]: pos for pos, i in enumerate(order)}
    return names, starts, sizes, index


def _elf(name: str, path: str, delta: int, entries: list[tuple[str, str]]) -> Binary:
    """An ELF file: R (headers, dynsym), R-X text, R rodata, RW data+bss; text vaddr = file offset + delta."""
    text_off = _page_up(0x1000 + 40 * len(entries))
    names, addrs, sizes, index = _place(name, entries, text_off + delta + 0x40)
    text_size = _page_up(int(addrs[-1]) + int(sizes[-1]) - text_off - delta)
    ro_off = text_off + text_size
    ro_size = _page_up(text_size // 3)
    rw_off, rw_size = ro_off + ro_size, _page_up(text_size // 10 + PAGE)
    segs = [(0, 0, text_off), (text_off, text_off + delta, text_size), (ro_off, ro_off + delta, ro_size),
            (rw_off, rw_off + delta + PAGE, rw_size + 3 * PAGE)]
    build_id = hashlib.sha1(f"fleetprof-sim/{name}".encode()).hexdigest()
    return Binary(name, path, build_id, "ELF", names, addrs, sizes, segs, segs[1],
                  _page_up(rw_off + delta + PAGE + rw_size + 3 * PAGE), index)


def _c(names: str) -> list[tuple[str, str]]:
    return [(n, n) for n in names.split()]


def _cxx(items: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(q, mangle(q, p)) for q, p in items]


def _sig(op: str, sfx: str) -> str:
    sig = _SIGS[_h(op) % len(_SIGS)]
    if sfx == "_":  # in place: the first argument is written
        return sig.replace("at::Tensor const&", "at::Tensor&", 1)
    return sig + ", at::Tensor&" if sfx == "_out" else sig


def _torch_cpu() -> list[tuple[str, str]]:
    ks = "c10::DispatchKeySet, "
    out = _cxx([("torch::autograd::Engine::thread_init",
                 "int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool"),
                ("torch::autograd::Engine::thread_main", "std::shared_ptr<torch::autograd::GraphTask> const&"),
                ("torch::autograd::Engine::evaluate_function",
                 "std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, "
                 "torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&"),
                ("torch::autograd::call_function", "std::shared_ptr<torch::autograd::GraphTask>&, "
                 "torch::autograd::Node*, torch::autograd::InputBuffer&"),
                ("c10::alloc_cpu", "unsigned long"), ("c10::free_cpu", "void*"),
                ("at::TensorIteratorBase::build", "at::TensorIteratorConfig&"),
                ("at::native::DEFAULT::vectorized_loop", "char**, long, long"),
                ("at::internal::invoke_parallel", "long, long, long, void*")])
    for op in OPS:
        cls = backward_node(op)
        out += _cxx([(f"at::native::(anonymous namespace)::{op}_kernel", "at::TensorIteratorBase&"),
                     (f"torch::autograd::generated::{cls}::apply",
                      "std::vector<at::Tensor, std::allocator<at::Tensor> >&&"),
                     (f"torch::autograd::generated::{cls}::release_variables", "")])
        for sfx in ("", "_", "_out", "_Scalar") if not op.endswith("_") else ("", "_out"):
            n, sig = op + sfx, _sig(op, sfx)
            out += _cxx([(f"at::_ops::{n}::call", sig), (f"at::_ops::{n}::redispatch", ks + sig),
                         (f"at::native::{n}", sig), (f"at::cpu::{n}", sig), (f"at::meta::{n}", sig),
                         (f"at::compositeexplicitautograd::{n}", sig),
                         (f"torch::autograd::VariableType::(anonymous namespace)::{n}", ks + sig),
                         (f"torch::ADInplaceOrView::(anonymous namespace)::{n}", ks + sig),
                         (f"torch::TraceType::(anonymous namespace)::{n}", ks + sig),
                         (f"at::functionalization::{n}", ks + sig),
                         (f"at::compositeimplicitautograd::{n}", sig),
                         (f"at::(anonymous namespace)::wrapper_CPU_{n}", sig)])
    return out


def _torch_cuda() -> list[tuple[str, str]]:
    out = _cxx([("at::cuda::blas::gemm_internal_cublas", "char, char, long, long, long, float, float const*, long, "
                 "float const*, long, float, float*, long"),
                ("at::native::launch_vectorized_kernel", "at::TensorIteratorBase&"),
                ("at::native::launch_legacy_kernel", "at::TensorIteratorBase&"),
                ("at::native::gpu_reduce_kernel", "at::TensorIteratorBase&"),
                ("at::cuda::memcpy_and_sync", "void*, void const*, long, cudaMemcpyKind, CUstream_st*"),
                ("c10::cuda::CUDACachingAllocator::Native::(anonymous namespace)::NativeCachingAllocator::malloc",
                 "void**, signed char, unsigned long, CUstream_st*"),
                ("c10::cuda::device_synchronize", ""), ("c10::cuda::getCurrentCUDAStream", "signed char")])
    for op in OPS:
        out += _cxx([(f"at::native::{op}_kernel_cuda", "at::TensorIteratorBase&")])
        for sfx in ("", "_", "_out") if not op.endswith("_") else ("",):
            out += _cxx([(f"at::(anonymous namespace)::wrapper_CUDA_{op}{sfx}", _sig(op, sfx)),
                         (f"at::cuda::{op}{sfx}", _sig(op, sfx))])
    return out


RUST_MODULES = {
    "vector": "sinks::http sinks::kafka sources::kubernetes_logs transforms::remap topology::builder config::loading "
              "internal_events app", "vector_core": "event::log_event fanout",
    "tokio": "runtime::scheduler::multi_thread::worker runtime::task::harness runtime::io::driver runtime::time::wheel "
             "runtime::blocking::pool sync::mpsc::chan net::tcp::stream",
    "hyper": "proto::h1::dispatch proto::h1::io client::conn", "serde_json": "ser de value::de",
    "vrl": "compiler::expression stdlib::parse_json", "regex_automata": "meta::strategy hybrid::search",
    "std": "rt sys::pal::unix::thread io::stdio sync::mutex", "core": "fmt ptr slice::sort",
    "alloc": "raw_vec vec string"}
RUST_FNS = ("run poll poll_next call process handle flush encode decode next drop_in_place write_all read_buf grow_one "
            "fmt clone into_iter from_str serialize deserialize_any").split()


def backward_node(op: str) -> str:
    """The autograd node class an op's backward runs in, e.g. mm -> MmBackward0."""
    return "".join(w.capitalize() for w in op.strip("_").split("_")) + "Backward0"


def _rust() -> list[tuple[str, str]]:
    mods, fns = RUST_MODULES, RUST_FNS
    out = _c("_start main _init _fini")
    extra = ["std::rt::lang_start_internal", "std::sys::pal::unix::thread::Thread::new::thread_start",
             "vector::main", "tokio::runtime::scheduler::multi_thread::worker::Context::run_task",
             "tokio::runtime::io::driver::Driver::turn", "tokio::runtime::park::CachedParkThread::block_on"]
    for path in extra + [f"{c}::{m}::{f}" for c, ms in mods.items() for m in ms.split() for f in fns]:
        crate = path.split("::")[0]
        out.append((path, rust_legacy(path) if crate in ("std", "core", "alloc") else rust_v0(path)))
    return out


def _kernel() -> Binary:
    names, addrs, sizes, index = [], [], [], {}
    for base, entries in ((KERNEL_BASE, KERNEL_CORE + " " + KERNEL_FILLER), (MODULE_BASE, NVIDIA_MODULE)):
        n, a, s, idx = _place("vmlinux" if base == KERNEL_BASE else "nvidia.ko", _c(entries), base)
        index.update({k: i + len(names) for k, i in idx.items()})
        names += n
        addrs.append(a)
        sizes.append(s)
    return Binary(KERNEL_BINARY, "", KERNEL_BUILD_ID, "KERNEL", names, np.concatenate(addrs),
                  np.concatenate(sizes), [], (0, 0, 0), 0, index)


def catalogue() -> list[Binary]:
    """Every binary of the fleet, the kernel last."""
    return [
        _elf("python3.11", "/opt/conda/bin/python3.11", 0, _c(PYTHON_EXE)),
        _elf("libpython3.11.so.1.0", f"{CONDA_LIB}/libpython3.11.so.1.0", 0, _c(_libpython())),
        _elf("ld-linux-x86-64.so.2", f"{SYS_LIB}/ld-linux-x86-64.so.2", 0, _c(LD_SO)),
        _elf("libc.so.6", f"{SYS_LIB}/libc.so.6", 0, _c(_libc())),
        _elf("libstdc++.so.6", f"{CONDA_LIB}/libstdc++.so.6", 0, _libstdcxx()),
        _elf("libtorch_python.so", f"{TORCH_LIB}/libtorch_python.so", 0, _libtorch_python()),
        _elf("libtorch_cpu.so", f"{TORCH_LIB}/libtorch_cpu.so", 0, _torch_cpu()),
        _elf("libtorch_cuda.so", f"{TORCH_LIB}/libtorch_cuda.so", PAGE, _torch_cuda()),
        _elf("libcudart.so.12", "/opt/conda/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12",
             0, _c(_cudart())),
        _elf("libcuda.so.1", f"{SYS_LIB}/libcuda.so.1", 0x200000, _c(_libcuda())),
        _elf("vector", "/usr/bin/vector", PAGE, _rust()),
        _kernel(),
    ]
