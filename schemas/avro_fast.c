/* The compiled Avro codec as a Python extension module: reading in avro_read.c, writing in avro_write.c
 * (schemas/avro_fast.py builds the three files together). */
#include "avro_fast.h"

static PyMethodDef methods[] = {
    {"read", avro_read, METH_VARARGS, "read(tree, data, offset): the Avro body of data[offset:] as Python values"},
    {"read_each", avro_read_each, METH_VARARGS,
     "read_each(tree, datas, offset): read() of each bytes of the list, None where it would raise ValueError"},
    {"write", avro_write, METH_VARARGS, "write(tree, value, prefix): prefix + the Avro body of value"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_avro_fast", NULL, -1, methods};

PyMODINIT_FUNC PyInit__avro_fast(void) { return PyModule_Create(&module); }
