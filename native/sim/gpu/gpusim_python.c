/* gpusim_python: a CPython extension calling the GPU simulator's launch directly, as PyTorch's C++ calls
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

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "Launch a simulated kernel."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "gpusim_python", NULL, -1, methods};

PyMODINIT_FUNC PyInit_gpusim_python(void)
{
    return PyModule_Create(&module);
}
