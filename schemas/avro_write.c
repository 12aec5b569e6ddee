/* The bytes fastavro writes, for values of exactly the types fastavro gives when reading (avro_read.c), from the
 * same type tree (avro_fast.h); anything else (a missing field without a default, an int where a float goes, a union
 * beyond null and one type) raises ValueError and the caller writes the record with fastavro. */
#include "avro_fast.h"

typedef struct {
    char *buf;
    Py_ssize_t len, cap;
} output;

static int reserve(output *o, Py_ssize_t n) {
    if (o->len + n <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap * 2 > o->len + n ? o->cap * 2 : o->len + n + 256;
    char *grown = PyMem_Realloc(o->buf, cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->buf = grown;
    o->cap = cap;
    return 0;
}

static int write_long(output *o, int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    if (reserve(o, 10) < 0)
        return -1;
    while (z > 0x7f) {
        o->buf[o->len++] = (char)((z & 0x7f) | 0x80);
        z >>= 7;
    }
    o->buf[o->len++] = (char)z;
    return 0;
}

static int write_raw(output *o, const char *p, Py_ssize_t n) {
    if (reserve(o, n) < 0)
        return -1;
    memcpy(o->buf + o->len, p, n);
    o->len += n;
    return 0;
}

static int refuse(const char *why) {
    PyErr_SetString(PyExc_ValueError, why);
    return -1;
}

static int write_value(output *o, PyObject *type, PyObject *value, int depth);

static int write_string(output *o, PyObject *value) {
    Py_ssize_t n;
    if (!PyUnicode_CheckExact(value))
        return refuse("not a str");
    const char *utf8 = PyUnicode_AsUTF8AndSize(value, &n);
    if (utf8 == NULL)
        return -1;
    return write_long(o, n) < 0 ? -1 : write_raw(o, utf8, n);
}

static int write_primitive(output *o, long kind, PyObject *value) {
    int overflow;
    long long v;
    switch (kind) {
    case T_NULL:
        return value == Py_None ? 0 : refuse("not None");
    case T_BOOLEAN:
        if (!PyBool_Check(value))
            return refuse("not a bool");
        return write_raw(o, value == Py_True ? "\x01" : "\x00", 1);
    case T_INT:
    case T_LONG:
        if (!PyLong_CheckExact(value))
            return refuse("not an int");
        v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred()))
            return refuse("int beyond 64 bits");
        return write_long(o, v);
    case T_FLOAT: {
        if (!PyFloat_CheckExact(value))
            return refuse("not a float");
        float f = (float)PyFloat_AS_DOUBLE(value);
        return write_raw(o, (const char *)&f, 4);
    }
    case T_DOUBLE: {
        if (!PyFloat_CheckExact(value))
            return refuse("not a float");
        double d = PyFloat_AS_DOUBLE(value);
        return write_raw(o, (const char *)&d, 8);
    }
    case T_BYTES:
        if (!PyBytes_CheckExact(value))
            return refuse("not bytes");
        return write_long(o, PyBytes_GET_SIZE(value)) < 0
                   ? -1 : write_raw(o, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value));
    case T_STRING:
        return write_string(o, value);
    }
    return refuse("unknown primitive type");
}

/* a field the record lacks is written as its default (fastavro does the same), refused where it has none */
static int write_record(output *o, PyObject *type, PyObject *value, int depth) {
    PyObject *names = PyTuple_GET_ITEM(type, 1), *types = PyTuple_GET_ITEM(type, 2);
    PyObject *defaults = PyTuple_GET_ITEM(type, 3);
    if (!PyDict_CheckExact(value))
        return refuse("not a dict");
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        PyObject *field = PyDict_GetItemWithError(value, name);
        if (field == NULL && !PyErr_Occurred())
            field = PyDict_GetItemWithError(defaults, name);
        if (field == NULL)
            return PyErr_Occurred() ? -1 : refuse("a field without a default is missing");
        if (write_value(o, PyTuple_GET_ITEM(types, i), field, depth + 1) < 0)
            return -1;
    }
    return 0;
}

static int write_array(output *o, PyObject *type, PyObject *value, int depth) {
    PyObject *items = PyTuple_GET_ITEM(type, 1);
    if (!PyList_CheckExact(value))
        return refuse("not a list");
    Py_ssize_t n = PyList_GET_SIZE(value);
    if (n > 0) {
        if (write_long(o, n) < 0)
            return -1;
        for (Py_ssize_t i = 0; i < n; i++)
            if (write_value(o, items, PyList_GET_ITEM(value, i), depth + 1) < 0)
                return -1;
    }
    return write_long(o, 0);
}

static int write_map(output *o, PyObject *type, PyObject *value, int depth) {
    PyObject *values = PyTuple_GET_ITEM(type, 1), *key, *item;
    Py_ssize_t pos = 0;
    if (!PyDict_CheckExact(value))
        return refuse("not a dict");
    if (PyDict_GET_SIZE(value) > 0) {
        if (write_long(o, PyDict_GET_SIZE(value)) < 0)
            return -1;
        while (PyDict_Next(value, &pos, &key, &item))
            if (write_string(o, key) < 0 || write_value(o, values, item, depth + 1) < 0)
                return -1;
    }
    return write_long(o, 0);
}

/* null and one other type, as every union of the schemas is; fastavro picks the branch the same way for those */
static int write_union(output *o, PyObject *type, PyObject *value, int depth) {
    PyObject *branches = PyTuple_GET_ITEM(type, 1);
    if (PyTuple_GET_SIZE(branches) != 2)
        return refuse("a union of more than two types");
    PyObject *first = PyTuple_GET_ITEM(branches, 0), *second = PyTuple_GET_ITEM(branches, 1);
    int null_first = PyLong_CheckExact(first) && PyLong_AsLong(first) == T_NULL;
    int null_second = PyLong_CheckExact(second) && PyLong_AsLong(second) == T_NULL;
    if (null_first == null_second)
        return refuse("a union without exactly one null");
    Py_ssize_t index = (value == Py_None) == null_first ? 0 : 1;
    return write_long(o, index) < 0 ? -1 : write_value(o, PyTuple_GET_ITEM(branches, index), value, depth + 1);
}

static int write_value(output *o, PyObject *type, PyObject *value, int depth) {
    if (depth > MAX_DEPTH)
        return refuse("nested too deep");
    if (PyLong_CheckExact(type))
        return write_primitive(o, PyLong_AsLong(type), value);
    switch (PyLong_AsLong(PyTuple_GET_ITEM(type, 0))) {
    case T_RECORD:
        return write_record(o, type, value, depth);
    case T_ARRAY:
        return write_array(o, type, value, depth);
    case T_MAP:
        return write_map(o, type, value, depth);
    case T_UNION:
        return write_union(o, type, value, depth);
    case T_ENUM: {
        PyObject *symbols = PyTuple_GET_ITEM(type, 1);
        if (!PyUnicode_CheckExact(value))
            return refuse("not a str");
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(symbols); i++) {
            int equal = PyUnicode_Compare(PyTuple_GET_ITEM(symbols, i), value);
            if (equal == 0)
                return write_long(o, i);
            if (equal == -1 && PyErr_Occurred())
                return -1;
        }
        return refuse("not a symbol of the enum");
    }
    case T_FIXED: {
        if (!PyBytes_CheckExact(value) || PyBytes_GET_SIZE(value) != PyLong_AsSsize_t(PyTuple_GET_ITEM(type, 1)))
            return refuse("not bytes of the fixed size");
        return write_raw(o, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value));
    }
    }
    return refuse("unknown complex type");
}

/* write(tree, value, prefix): prefix followed by the Avro body of value. */
PyObject *avro_write(PyObject *self, PyObject *args) {
    PyObject *tree, *value, *result = NULL;
    Py_buffer prefix;
    if (!PyArg_ParseTuple(args, "OOy*", &tree, &value, &prefix))
        return NULL;
    output o = {NULL, 0, 0};
    if (write_raw(&o, prefix.buf, prefix.len) == 0 && write_value(&o, tree, value, 0) == 0)
        result = PyBytes_FromStringAndSize(o.buf, o.len);
    PyMem_Free(o.buf);
    PyBuffer_Release(&prefix);
    return result;
}
