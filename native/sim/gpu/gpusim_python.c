/* gpusim_python: a CPython extension calling the GPU simulator's launches (kernels, copies, sets, graphs) directly, as PyTorch's C++ calls
 * cudaLaunchKernel. Calls through ctypes go through libffi, whose ffi_call_unix64 keeps a frame that a
 * frame-pointer unwinder cannot step over; without it the launching Python functions would not show in the
 * launch stacks. Built per interpreter (its headers) with frame pointers and no sibling calls.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "gpusim.h"

/* launch(kernel_name: bytes, duration_ns: int, stream: int) -> correlation id (0: the device queue was full) */
static PyObject *__attribute__((noinline)) launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "launch(kernel_name: bytes, duration_ns: int, stream: int)");
        return NULL;
    }
    unsigned long long duration = PyLong_AsUnsignedLongLong(args[1]);
    unsigned long stream = PyLong_AsUnsignedLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    uint32_t id = gpusim_launch(PyBytes_AS_STRING(args[0]), (uint64_t)duration, (uint32_t)stream);
    return PyLong_FromUnsignedLong(id);
}

/* The unsigned integer arguments of a call, or -1 with a TypeError set. */
static int unsigned_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, unsigned long long *out,
                         const char *usage)
{
    if (nargs != want) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    for (Py_ssize_t i = 0; i < want; i++) {
        out[i] = PyLong_AsUnsignedLongLong(args[i]);
        if (PyErr_Occurred())
            return -1;
    }
    return 0;
}

/* memcpy(bytes, copy_kind, src_kind, dst_kind, duration_ns, stream) -> correlation id */
static PyObject *__attribute__((noinline)) memcpy_(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    unsigned long long a[6];
    if (unsigned_args(args, nargs, 6, a, "memcpy(bytes, copy_kind, src_kind, dst_kind, duration_ns, stream)"))
        return NULL;
    uint32_t id = gpusim_memcpy(a[0], (uint32_t)a[1], (uint32_t)a[2], (uint32_t)a[3], a[4], (uint32_t)a[5]);
    return PyLong_FromUnsignedLong(id);
}

/* memset(bytes, dst_kind, duration_ns, stream) -> correlation id */
static PyObject *__attribute__((noinline)) memset_(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    unsigned long long a[4];
    if (unsigned_args(args, nargs, 4, a, "memset(bytes, dst_kind, duration_ns, stream)"))
        return NULL;
    uint32_t id = gpusim_memset(a[0], (uint32_t)a[1], a[2], (uint32_t)a[3]);
    return PyLong_FromUnsignedLong(id);
}

/* graph_launch(graph_id, stream) -> correlation id */
static PyObject *__attribute__((noinline)) graph_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    unsigned long long a[2];
    if (unsigned_args(args, nargs, 2, a, "graph_launch(graph_id, stream)"))
        return NULL;
    uint32_t id = gpusim_graph_launch((uint32_t)a[0], (uint32_t)a[1]);
    return PyLong_FromUnsignedLong(id);
}

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "Launch a simulated kernel."},
    {"memcpy", (PyCFunction)(void (*)(void))memcpy_, METH_FASTCALL, "Launch a simulated copy."},
    {"memset", (PyCFunction)(void (*)(void))memset_, METH_FASTCALL, "Launch a simulated set."},
    {"graph_launch", (PyCFunction)(void (*)(void))graph_launch, METH_FASTCALL, "Launch a simulated graph."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "gpusim_python", NULL, -1, methods};

PyMODINIT_FUNC PyInit_gpusim_python(void)
{
    return PyModule_Create(&module);
}
