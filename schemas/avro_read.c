/* Avro binary bodies read into the Python objects fastavro gives (dicts, lists, str, int, float, bool, None), for
 * messages whose writer schema is the reader schema, from a type tree schemas/avro_fast.py compiles (avro_fast.h).
 * Strict: any input it is unsure of (a truncated body, a varint beyond 64 bits, an int beyond 32, a boolean byte
 * other than 0 or 1, an enum or union index out of range, invalid UTF-8, a negative length, trailing bytes) raises
 * ValueError and the caller reads the message with fastavro instead, which decides what it is. So this file never
 * has to match fastavro's error behaviour, only its values.
 */
#include "avro_read.h"

PyObject *fail(const char *why) {
    PyErr_SetString(PyExc_ValueError, why);
    return NULL;
}

/* A zig-zag varint of at most 64 bits; -1 when the body ends first or it is longer. */
int read_long(cursor *c, int64_t *out) {
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
int read_length(cursor *c, Py_ssize_t *out) {
    int64_t n;
    if (read_long(c, &n) < 0 || n < 0 || n > c->end - c->p)
        return -1;
    *out = (Py_ssize_t)n;
    return 0;
}

static PyObject *read_primitive(cursor *c, long kind);

/* A dict sized for `n` keys up front: a record's dict is filled without growing (CPython 3.11 and 3.12 export the
 * call; later versions get a plain dict). */
static PyObject *new_dict(Py_ssize_t n) {
#if PY_VERSION_HEX < 0x030D0000
    return _PyDict_NewPresized(n);
#else
    (void)n;
    return PyDict_New();
#endif
}

/* A record type's fields [from, to) read from `c` into `record`; -1 (the error set) when one fails. */
static int read_fields_into(cursor *c, PyObject *type, PyObject *record, Py_ssize_t from, Py_ssize_t to, int depth) {
    PyObject *names = PyTuple_GET_ITEM(type, 1), *types = PyTuple_GET_ITEM(type, 2);
    for (Py_ssize_t i = from; i < to; i++) {
        PyObject *value = read_value(c, PyTuple_GET_ITEM(types, i), depth + 1);
        if (value == NULL || PyDict_SetItem(record, PyTuple_GET_ITEM(names, i), value) < 0) {
            Py_XDECREF(value);
            return -1;
        }
        Py_DECREF(value);
    }
    return 0;
}

/* A new dict of a record type's fields [0, n) read from `c`; NULL (the error set) when one fails. */
static PyObject *read_fields(cursor *c, PyObject *type, Py_ssize_t n, int depth) {
    PyObject *record = new_dict(PyTuple_GET_SIZE(PyTuple_GET_ITEM(type, 1)));
    if (record != NULL && read_fields_into(c, type, record, 0, n, depth) < 0)
        Py_CLEAR(record);
    return record;
}

static PyObject *read_record(cursor *c, PyObject *type, int depth) {
    return read_fields(c, type, PyTuple_GET_SIZE(PyTuple_GET_ITEM(type, 1)), depth);
}

/* The count of the next block of an array or map (0: the end); a negative count is followed by the block's size. */
int read_block(cursor *c, int64_t *count) {
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
    /* an array of a primitive (addresses, ids): no dispatch per item */
    long kind = PyLong_CheckExact(items) ? PyLong_AsLong(items) : -1;
    PyObject *list = NULL;  /* the first block's list; later blocks (rare) are appended to it */
    int64_t count;
    for (;;) {
        if (read_block(c, &count) < 0) {
            Py_XDECREF(list);
            return fail("corrupt array block");
        }
        if (count == 0)
            return list != NULL ? list : PyList_New(0);
        /* sized up front (read_block bounds the count by the bytes left); a slot not filled yet is NULL, which
         * the list's deallocation and traversal skip */
        PyObject *block = PyList_New((Py_ssize_t)count);
        if (block == NULL) {
            Py_XDECREF(list);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < (Py_ssize_t)count; i++) {
            PyObject *value = kind >= 0 ? read_primitive(c, kind) : read_value(c, items, depth + 1);
            if (value == NULL) {
                Py_DECREF(block);
                Py_XDECREF(list);
                return NULL;
            }
            PyList_SET_ITEM(block, i, value);
        }
        if (list == NULL) {
            list = block;
        } else {
            int failed = PyList_SetSlice(list, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, block) < 0;
            Py_DECREF(block);
            if (failed) {
                Py_DECREF(list);
                return NULL;
            }
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

PyObject *read_value(cursor *c, PyObject *type, int depth) {
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
    case T_COLUMNS:
        return read_columns(c, type, depth);
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
PyObject *avro_read(PyObject *self, PyObject *args) {
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

typedef struct {
    PyObject *tails;            /* tail bytes -> tuple of their values */
    Py_ssize_t max_tails;       /* the dict is cleared once it holds this many */
    Py_ssize_t max_tail_bytes;  /* a longer tail is read each time, never kept */
} tail_cache;

/* A record of `tree` whose fields from `split` on (its tail) are taken from the cache when the same bytes were read
 * before, else read and kept there: a tail that repeats (a launch's stack) is one set of objects for all the records
 * that have it. A tail over max_tail_bytes (a launch that carries its process's mappings: large, and seldom the same)
 * is read as usual. NULL with ValueError as read_value. */
static PyObject *read_record_tail(cursor *c, PyObject *tree, Py_ssize_t split, const tail_cache *cache) {
    PyObject *names = PyTuple_GET_ITEM(tree, 1), *types = PyTuple_GET_ITEM(tree, 2), *tails = cache->tails;
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    PyObject *record = read_fields(c, tree, split, 0);
    if (record == NULL)
        return NULL;
    if (c->end - c->p > cache->max_tail_bytes) {
        if (read_fields_into(c, tree, record, split, n, 0) < 0)
            Py_CLEAR(record);
        return record;
    }
    PyObject *key = PyBytes_FromStringAndSize((const char *)c->p, c->end - c->p);
    if (key == NULL) {
        Py_DECREF(record);
        return NULL;
    }
    PyObject *values = PyDict_GetItemWithError(tails, key);  /* borrowed */
    if (values != NULL) {
        Py_INCREF(values);
        c->p = c->end;
    } else if (PyErr_Occurred()) {
        Py_DECREF(key);
        Py_DECREF(record);
        return NULL;
    } else {
        values = PyTuple_New(n - split);
        for (Py_ssize_t i = split; values != NULL && i < n; i++) {
            PyObject *value = read_value(c, PyTuple_GET_ITEM(types, i), 1);
            if (value == NULL)
                Py_CLEAR(values);
            else
                PyTuple_SET_ITEM(values, i - split, value);
        }
        if (values != NULL && c->p != c->end)
            Py_CLEAR(values);  /* trailing bytes: the caller's check sees c->p short of the end */
        if (values != NULL) {
            if (PyDict_GET_SIZE(tails) >= cache->max_tails)
                PyDict_Clear(tails);
            if (PyDict_SetItem(tails, key, values) < 0)
                Py_CLEAR(values);
        }
    }
    Py_DECREF(key);
    for (Py_ssize_t i = split; values != NULL && i < n; i++) {
        if (PyDict_SetItem(record, PyTuple_GET_ITEM(names, i), PyTuple_GET_ITEM(values, i - split)) < 0)
            Py_CLEAR(values);
    }
    if (values == NULL) {
        Py_DECREF(record);
        if (!PyErr_Occurred())
            return fail("trailing bytes");
        return NULL;
    }
    Py_DECREF(values);
    return record;
}

/* read_each(tree, datas, offset[, split, tails, max_tails, max_tail_bytes]): for each bytes object of the list, what
 * read(tree, data, offset) returns, or None where it would raise ValueError (the caller reads those with fastavro); a
 * batch without a call per message. With `split` (a record tree's field count before its tail) and a dict `tails`,
 * repeated tails are read once (read_record_tail). */
PyObject *avro_read_each(PyObject *self, PyObject *args) {
    PyObject *tree, *datas;
    Py_ssize_t offset, split = -1;
    tail_cache cache = {NULL, 0, PY_SSIZE_T_MAX};
    if (!PyArg_ParseTuple(args, "OO!n|nO!nn", &tree, &PyList_Type, &datas, &offset, &split, &PyDict_Type,
                          &cache.tails, &cache.max_tails, &cache.max_tail_bytes))
        return NULL;
    if (split >= 0 && (cache.tails == NULL || !PyTuple_Check(tree) || cache.max_tails < 1
                       || PyLong_AsLong(PyTuple_GET_ITEM(tree, 0)) != T_RECORD
                       || split > PyTuple_GET_SIZE(PyTuple_GET_ITEM(tree, 1)))) {
        PyErr_SetString(PyExc_TypeError, "read_each: split needs a record tree, a dict of tails and max_tails >= 1");
        return NULL;
    }
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
            value = split >= 0 ? read_record_tail(&c, tree, split, &cache) : read_value(&c, tree, 0);
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
