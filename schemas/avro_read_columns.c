/* An array of records read as columns (T_COLUMNS, avro_fast.columns_reader_for): {field name: column}, filled a
 * record at a time with no dict per record. An int or long field's column is the bytes of its values as int64
 * (avro_fast.py views them as a numpy array: no Python int per value), any other field's a list. A string equal to
 * the same field's in the record before is that string object again: a window's samples repeat their process's
 * names row after row. As strict as avro_read.c: whatever it is unsure of raises ValueError.
 */
#include "avro_read.h"

/* One field of the array's records while it is read. */
typedef struct {
    long kind;                      /* its primitive type, or -1 for a complex one */
    int64_t *ints;                  /* an int or long field's values so far */
    Py_ssize_t n, cap;
    const unsigned char *last;      /* a string field's bytes in the record before (NULL before the first) */
    Py_ssize_t last_len;
} field_state;

static int is_int64(long kind) {
    return kind == T_INT || kind == T_LONG;
}

/* Room for `count` more values in every int or long field (read_block bounds count by the bytes left). */
static int reserve_ints(field_state *fields, Py_ssize_t n, int64_t count) {
    for (Py_ssize_t f = 0; f < n; f++) {
        if (!is_int64(fields[f].kind) || fields[f].n + count <= fields[f].cap)
            continue;
        Py_ssize_t cap = fields[f].n + (Py_ssize_t)count;
        int64_t *grown = PyMem_Realloc(fields[f].ints, (size_t)cap * sizeof(int64_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        fields[f].ints = grown;
        fields[f].cap = cap;
    }
    return 0;
}

/* A string field's next value: the record before's object where the bytes are the same, else decoded. */
static PyObject *read_repeated_string(cursor *c, field_state *field, PyObject *list) {
    Py_ssize_t len;
    if (read_length(c, &len) < 0)
        return fail("corrupt string length");
    PyObject *value;
    if (field->last != NULL && len == field->last_len && memcmp(c->p, field->last, (size_t)len) == 0) {
        value = Py_NewRef(PyList_GET_ITEM(list, PyList_GET_SIZE(list) - 1));
    } else {
        value = PyUnicode_DecodeUTF8((const char *)c->p, len, NULL);
        field->last = c->p;
        field->last_len = len;
    }
    c->p += len;
    return value;
}

/* One record's fields appended to their columns; -1 (the error set) when one fails. */
static int read_row(cursor *c, PyObject *types, PyObject *lists, field_state *fields, Py_ssize_t n, int depth) {
    for (Py_ssize_t f = 0; f < n; f++) {
        field_state *field = &fields[f];
        if (is_int64(field->kind)) {
            int64_t v;
            if (read_long(c, &v) < 0 || (field->kind == T_INT && (v < INT32_MIN || v > INT32_MAX))) {
                fail(field->kind == T_INT ? "corrupt int" : "corrupt long");
                return -1;
            }
            field->ints[field->n++] = v;
            continue;
        }
        PyObject *list = PyTuple_GET_ITEM(lists, f);
        PyObject *value = field->kind == T_STRING ? read_repeated_string(c, field, list)
                                                  : read_value(c, PyTuple_GET_ITEM(types, f), depth);
        if (value == NULL || PyList_Append(list, value) < 0) {
            Py_XDECREF(value);
            return -1;
        }
        Py_DECREF(value);
    }
    return 0;
}

PyObject *read_columns(cursor *c, PyObject *type, int depth) {
    PyObject *record = PyTuple_GET_ITEM(type, 1);
    PyObject *names = PyTuple_GET_ITEM(record, 1), *types = PyTuple_GET_ITEM(record, 2);
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    PyObject *columns = PyDict_New(), *lists = PyTuple_New(n);  /* the tuple holds the lists while they fill */
    field_state *fields = PyMem_Calloc(n ? (size_t)n : 1, sizeof(field_state));
    int64_t count;
    if (columns == NULL || lists == NULL || fields == NULL) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto failed;
    }
    for (Py_ssize_t f = 0; f < n; f++) {
        PyObject *t = PyTuple_GET_ITEM(types, f);
        fields[f].kind = PyLong_CheckExact(t) ? PyLong_AsLong(t) : -1;
        /* every field in the dict now, in the record's order: an int field's bytes replace its None at the end */
        PyObject *list = is_int64(fields[f].kind) ? Py_NewRef(Py_None) : PyList_New(0);
        if (list == NULL)
            goto failed;
        PyTuple_SET_ITEM(lists, f, list);
        if (PyDict_SetItem(columns, PyTuple_GET_ITEM(names, f), list) < 0)
            goto failed;
    }
    for (;;) {
        if (read_block(c, &count) < 0) {
            fail("corrupt array block");
            goto failed;
        }
        if (count == 0)
            break;
        if (reserve_ints(fields, n, count) < 0)
            goto failed;
        for (int64_t i = 0; i < count; i++)
            if (read_row(c, types, lists, fields, n, depth + 2) < 0)
                goto failed;
    }
    for (Py_ssize_t f = 0; f < n; f++) {
        if (!is_int64(fields[f].kind))
            continue;
        PyObject *bytes = PyBytes_FromStringAndSize((const char *)fields[f].ints,
                                                    fields[f].n * (Py_ssize_t)sizeof(int64_t));
        if (bytes == NULL || PyDict_SetItem(columns, PyTuple_GET_ITEM(names, f), bytes) < 0) {
            Py_XDECREF(bytes);
            goto failed;
        }
        Py_DECREF(bytes);
    }
    goto done;
failed:
    Py_CLEAR(columns);
done:
    Py_XDECREF(lists);
    if (fields != NULL)
        for (Py_ssize_t f = 0; f < n; f++)
            PyMem_Free(fields[f].ints);
    PyMem_Free(fields);
    return columns;
}
