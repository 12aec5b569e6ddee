/* Avro binary bodies read into the Python objects fastavro gives (dicts, lists, str, int, float, bool, None), for
 * messages whose writer schema is the reader schema, from a type tree schemas/avro_fast.py compiles. Strict: any
 * input it is unsure of (a truncated body, a varint beyond 64 bits, an int beyond 32, a boolean byte other than 0 or
 * 1, an enum or union index out of range, invalid UTF-8, a negative length, trailing bytes) raises ValueError and the
 * caller reads the message with fastavro instead, which decides what it is. So this file never has to match
 * fastavro's error behaviour, only its values.
 *
 * Type tree: a primitive is a Python int (T_NULL .. T_STRING); a complex type is a tuple whose first item is its
 * kind: (T_RECORD, names, types, {name: default}), (T_ENUM, symbols), (T_ARRAY, items), (T_MAP, values),
 * (T_UNION, branches), (T_FIXED, size).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { T_NULL, T_BOOLEAN, T_INT, T_LONG, T_FLOAT, T_DOUBLE, T_BYTES, T_STRING,
       T_RECORD, T_ENUM, T_ARRAY, T_MAP, T_UNION, T_FIXED };

#define MAX_DEPTH 64

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
} cursor;

static PyObject *fail(const char *why) {
    PyErr_SetString(PyExc_ValueError, why);
    return NULL;
}

/* A zig-zag varint of at most 64 bits; -1 when the body ends first or it is longer. */
static int read_long(cursor *c, int64_t *out) {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
        if (c->p >= c->end)
            return -1;
        unsigned char b = *c->p++;
        if (shift == 63 && (b & 0xfe))
            return -1;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            break;
    }
    *out = (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
    return 0;
}

/* A length (bytes, string) that the rest of the body can hold. */
static int read_length(cursor *c, Py_ssize_t *out) {
    int64_t n;
    if (read_long(c, &n) < 0 || n < 0 || n > c->end - c->p)
        return -1;
    *out = (Py_ssize_t)n;
    return 0;
}

static PyObject *read_value(cursor *c, PyObject *type, int depth);

static PyObject *read_record(cursor *c, PyObject *type, int depth) {
    PyObject *names = PyTuple_GET_ITEM(type, 1), *types = PyTuple_GET_ITEM(type, 2);
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    PyObject *record = PyDict_New();
    if (record == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = read_value(c, PyTuple_GET_ITEM(types, i), depth + 1);
        if (value == NULL || PyDict_SetItem(record, PyTuple_GET_ITEM(names, i), value) < 0) {
            Py_XDECREF(value);
            Py_DECREF(record);
            return NULL;
        }
        Py_DECREF(value);
    }
    return record;
}

/* The count of the next block of an array or map (0: the end); a negative count is followed by the block's size. */
static int read_block(cursor *c, int64_t *count) {
    int64_t size;
    if (read_long(c, count) < 0)
        return -1;
    if (*count < 0) {
        if (*count == INT64_MIN || read_long(c, &size) < 0 || size < 0)
            return -1;
        *count = -*count;
    }
    /* every item but a null takes a byte at least: a count beyond the body is corrupt, not an allocation */
    return *count > (c->end - c->p) + 1 ? -1 : 0;
}

static PyObject *read_array(cursor *c, PyObject *type, int depth) {
    PyObject *items = PyTuple_GET_ITEM(type, 1);
    PyObject *list = PyList_New(0);
    int64_t count;
    if (list == NULL)
        return NULL;
    for (;;) {
        if (read_block(c, &count) < 0) {
            Py_DECREF(list);
            return fail("corrupt array block");
        }
        if (count == 0)
            return list;
        for (int64_t i = 0; i < count; i++) {
            PyObject *value = read_value(c, items, depth + 1);
            if (value == NULL || PyList_Append(list, value) < 0) {
                Py_XDECREF(value);
                Py_DECREF(list);
                return NULL;
            }
            Py_DECREF(value);
        }
    }
}

static PyObject *read_string(cursor *c) {
    Py_ssize_t n;
    if (read_length(c, &n) < 0)
        return fail("corrupt string length");
    PyObject *s = PyUnicode_DecodeUTF8((const char *)c->p, n, NULL);
    c->p += n;
    return s;
}

static PyObject *read_map(cursor *c, PyObject *type, int depth) {
    PyObject *values = PyTuple_GET_ITEM(type, 1);
    PyObject *map = PyDict_New();
    int64_t count;
    if (map == NULL)
        return NULL;
    for (;;) {
        if (read_block(c, &count) < 0) {
            Py_DECREF(map);
            return fail("corrupt map block");
        }
        if (count == 0)
            return map;
        for (int64_t i = 0; i < count; i++) {
            PyObject *key = read_string(c);
            PyObject *value = key == NULL ? NULL : read_value(c, values, depth + 1);
            if (value == NULL || PyDict_SetItem(map, key, value) < 0) {
                Py_XDECREF(key);
                Py_XDECREF(value);
                Py_DECREF(map);
                return NULL;
            }
            Py_DECREF(key);
            Py_DECREF(value);
        }
    }
}

/* An index into a tuple of choices (enum symbols, union branches); -1 when out of range. */
static Py_ssize_t read_index(cursor *c, PyObject *choices) {
    int64_t i;
    if (read_long(c, &i) < 0 || i < 0 || i >= PyTuple_GET_SIZE(choices))
        return -1;
    return (Py_ssize_t)i;
}

static PyObject *read_primitive(cursor *c, long kind) {
    int64_t v;
    Py_ssize_t n;
    switch (kind) {
    case T_NULL:
        Py_RETURN_NONE;
    case T_BOOLEAN:
        if (c->p >= c->end || *c->p > 1)
            return fail("corrupt boolean");
        return PyBool_FromLong(*c->p++);
    case T_INT:
        if (read_long(c, &v) < 0 || v < INT32_MIN || v > INT32_MAX)
            return fail("corrupt int");
        return PyLong_FromLongLong(v);
    case T_LONG:
        if (read_long(c, &v) < 0)
            return fail("corrupt long");
        return PyLong_FromLongLong(v);
    case T_FLOAT: {
        float f;
        if (c->end - c->p < 4)
            return fail("truncated float");
        memcpy(&f, c->p, 4); /* little-endian hosts only: avro_fast.py builds it on those */
        c->p += 4;
        return PyFloat_FromDouble(f);
    }
    case T_DOUBLE: {
        double d;
        if (c->end - c->p < 8)
            return fail("truncated double");
        memcpy(&d, c->p, 8);
        c->p += 8;
        return PyFloat_FromDouble(d);
    }
    case T_BYTES: {
        if (read_length(c, &n) < 0)
            return fail("corrupt bytes length");
        PyObject *b = PyBytes_FromStringAndSize((const char *)c->p, n);
        c->p += n;
        return b;
    }
    case T_STRING:
        return read_string(c);
    }
    return fail("unknown primitive type");
}

static PyObject *read_value(cursor *c, PyObject *type, int depth) {
    if (depth > MAX_DEPTH)
        return fail("nested too deep");
    if (PyLong_CheckExact(type))
        return read_primitive(c, PyLong_AsLong(type));
    Py_ssize_t i;
    switch (PyLong_AsLong(PyTuple_GET_ITEM(type, 0))) {
    case T_RECORD:
        return read_record(c, type, depth);
    case T_ARRAY:
        return read_array(c, type, depth);
    case T_MAP:
        return read_map(c, type, depth);
    case T_ENUM: {
        PyObject *symbols = PyTuple_GET_ITEM(type, 1);
        if ((i = read_index(c, symbols)) < 0)
            return fail("enum index out of range");
        PyObject *symbol = PyTuple_GET_ITEM(symbols, i);
        Py_INCREF(symbol);
        return symbol;
    }
    case T_UNION: {
        PyObject *branches = PyTuple_GET_ITEM(type, 1);
        if ((i = read_index(c, branches)) < 0)
            return fail("union index out of range");
        return read_value(c, PyTuple_GET_ITEM(branches, i), depth + 1);
    }
    case T_FIXED: {
        Py_ssize_t n = PyLong_AsSsize_t(PyTuple_GET_ITEM(type, 1));
        if (c->end - c->p < n)
            return fail("truncated fixed");
        PyObject *b = PyBytes_FromStringAndSize((const char *)c->p, n);
        c->p += n;
        return b;
    }
    }
    return fail("unknown complex type");
}

/* read(tree, data, offset): the value of `data[offset:]`, which it must fill exactly. */
static PyObject *avro_read(PyObject *self, PyObject *args) {
    PyObject *tree;
    Py_buffer data;
    Py_ssize_t offset;
    if (!PyArg_ParseTuple(args, "Oy*n", &tree, &data, &offset))
        return NULL;
    if (offset < 0 || offset > data.len) {
        PyBuffer_Release(&data);
        return fail("offset outside the message");
    }
    cursor c = {(const unsigned char *)data.buf + offset, (const unsigned char *)data.buf + data.len};
    PyObject *value = read_value(&c, tree, 0);
    if (value != NULL && c.p != c.end) {
        Py_DECREF(value);
        value = fail("trailing bytes");
    }
    PyBuffer_Release(&data);
    return value;
}

/* read_each(tree, datas, offset): for each bytes object of the list, what read(tree, data, offset) returns, or None
 * where it would raise ValueError (the caller reads those with fastavro); a batch without a call per message. */
static PyObject *avro_read_each(PyObject *self, PyObject *args) {
    PyObject *tree, *datas;
    Py_ssize_t offset;
    if (!PyArg_ParseTuple(args, "OO!n", &tree, &PyList_Type, &datas, &offset))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(datas);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(datas, i);
        PyObject *value = NULL;
        if (PyBytes_Check(item) && offset >= 0 && offset <= PyBytes_GET_SIZE(item)) {
            const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(item);
            cursor c = {b + offset, b + PyBytes_GET_SIZE(item)};
            value = read_value(&c, tree, 0);
            if (value != NULL && c.p != c.end)
                Py_CLEAR(value);  /* trailing bytes */
            if (value == NULL && PyErr_Occurred()) {
                if (!PyErr_ExceptionMatches(PyExc_ValueError)) {  /* out of memory, say: not the body's fault */
                    Py_DECREF(out);
                    return NULL;
                }
                PyErr_Clear();
            }
        }
        if (value == NULL)
            value = Py_NewRef(Py_None);
        PyList_SET_ITEM(out, i, value);
    }
    return out;
}

/* --- writing: the bytes fastavro writes, for values of exactly the types fastavro gives when reading; anything else
 * (a missing field, an int where a float goes, a union beyond null and one type) raises ValueError and the caller
 * writes the record with fastavro. */

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
static PyObject *avro_write(PyObject *self, PyObject *args) {
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

static PyMethodDef methods[] = {
    {"read", avro_read, METH_VARARGS, "read(tree, data, offset): the Avro body of data[offset:] as Python values"},
    {"read_each", avro_read_each, METH_VARARGS,
     "read_each(tree, datas, offset): read() of each bytes of the list, None where it would raise ValueError"},
    {"write", avro_write, METH_VARARGS, "write(tree, value, prefix): prefix + the Avro body of value"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_avro_fast", NULL, -1, methods};

PyMODINIT_FUNC PyInit__avro_fast(void) { return PyModule_Create(&module); }
