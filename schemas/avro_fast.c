/* The compiled Avro codec as a Python extension module: reading in avro_read.c, writing in avro_write.c, the
 * columnar CPU-batch reader's varint pass in avro_varints.c (schemas/avro_fast.py builds the files together). */
#include "avro_fast.h"

static PyMethodDef methods[] = {
    {"read", avro_read, METH_VARARGS, "read(tree, data, offset): the Avro body of data[offset:] as Python values"},
    {"read_each", avro_read_each, METH_VARARGS,
     "read_each(tree, datas, offset): read() of each bytes of the list, None where it would raise ValueError"},
    {"write", avro_write, METH_VARARGS, "write(tree, value, prefix): prefix + the Avro body of value"},
    {"varints", avro_varints, METH_VARARGS,
     "varints(data): (values, ends, bad) as int64 bytes: every run of bytes ending below 0x80 as a zigzag varint"},
    {"walk_stacks", avro_walk_stacks, METH_VARARGS,
     "walk_stacks(values, k, count, steps...): (k after count stacks, each stack's first index as int64 bytes)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_avro_fast", NULL, -1, methods};

PyMODINIT_FUNC PyInit__avro_fast(void) { return PyModule_Create(&module); }
