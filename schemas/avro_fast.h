/* The compiled Avro codec's shared declarations (schemas/avro_fast.py builds avro_fast.c, avro_read.c,
 * avro_write.c and avro_varints.c into one extension module).
 *
 * Type tree: a primitive is a Python int (T_NULL .. T_STRING); a complex type is a tuple whose first item is its
 * kind: (T_RECORD, names, types, {name: default}), (T_ENUM, symbols), (T_ARRAY, items), (T_MAP, values),
 * (T_UNION, branches), (T_FIXED, size); and (T_COLUMNS, record), an array of records read as one column per field
 * ({name: column}: an int or long field's the bytes of its int64 values, any other's a list; what a consumer that
 * wants whole columns reads, see avro_fast.columns_reader_for).
 */
#ifndef FLEETPROF_AVRO_FAST_H
#define FLEETPROF_AVRO_FAST_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { T_NULL, T_BOOLEAN, T_INT, T_LONG, T_FLOAT, T_DOUBLE, T_BYTES, T_STRING,
       T_RECORD, T_ENUM, T_ARRAY, T_MAP, T_UNION, T_FIXED, T_COLUMNS };

#define MAX_DEPTH 64

/* the module's functions (avro_read.c, avro_write.c, avro_varints.c) */
PyObject *avro_read(PyObject *self, PyObject *args);
PyObject *avro_read_each(PyObject *self, PyObject *args);
PyObject *avro_write(PyObject *self, PyObject *args);
PyObject *avro_varints(PyObject *self, PyObject *args);
PyObject *avro_walk_stacks(PyObject *self, PyObject *args);

#endif
