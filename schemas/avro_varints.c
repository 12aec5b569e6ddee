/* Every varint of a message at once, for the columnar CpuStackBatch reader (schemas/cpu_batch_reader.py, _Varints):
 * each run of bytes that ends in a byte < 0x80 is decoded as a zigzag varint, as that file's numpy passes decode it.
 * A run of more than 10 bytes, or of 10 whose last byte is over 1, is over 64 bits: its index is listed as bad (its
 * value is what the first bytes give, never to be used). Two passes without a branch per byte: where every run
 * ends, then each run on its own (no run waits for the one before), its first 8 bytes read as one word and their
 * 7-bit groups packed in three shift-and-merge steps.
 */
#include "avro_fast.h"

static inline uint64_t word_at(const unsigned char *b, Py_ssize_t p, Py_ssize_t n) {
    uint64_t w = 0;
    if (n - p >= 8)
        memcpy(&w, b + p, 8);  /* little-endian hosts only (avro_fast.py checks) */
    else
        for (Py_ssize_t i = 0; p + i < n; i++)
            w |= (uint64_t)b[p + i] << (8 * i);
    return w;
}

static uint64_t packed_groups(uint64_t w) {
    uint64_t u = w & 0x7F007F007F007F00ULL;
    w = (w & 0x007F007F007F007FULL) | (u >> 1);
    u = w & 0x3FFF00003FFF0000ULL;
    w = (w & 0x00003FFF00003FFFULL) | (u >> 2);
    u = w & 0x0FFFFFFF00000000ULL;
    return (w & 0x000000000FFFFFFFULL) | (u >> 4);
}

PyObject *avro_varints(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data))
        return NULL;
    const unsigned char *b = data.buf;
    Py_ssize_t n = data.len, runs = 0, bad = 0;
    PyObject *values = NULL, *ends = NULL, *bads = NULL, *out = NULL;
    int64_t *badv = NULL, *e = PyMem_Malloc(n * 8 + 8);
    if (e == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* where each run ends: no branch per byte (the store lands on the next slot until a byte < 0x80 moves it) */
    for (Py_ssize_t i = 0; i < n; i++) {
        e[runs] = i;
        runs += b[i] < 0x80;
    }
    values = PyBytes_FromStringAndSize(NULL, runs * 8);
    ends = PyBytes_FromStringAndSize((const char *)e, runs * 8);
    badv = PyMem_Malloc(runs * 8 + 8);
    if (values == NULL || ends == NULL || badv == NULL)
        goto done;
    int64_t *v = (int64_t *)PyBytes_AS_STRING(values);
    /* each run decoded on its own: its start is the previous run's end + 1 */
    for (Py_ssize_t k = 0; k < runs; k++) {
        Py_ssize_t start = k ? e[k - 1] + 1 : 0, len = e[k] - start + 1;
        uint64_t w = word_at(b, start, n), u;
        if (len <= 8) {
            u = packed_groups(len == 8 ? w : w & ((1ULL << (8 * len)) - 1));
        } else {  /* the 9th group, and the 10th byte's bit */
            u = packed_groups(w) | (uint64_t)(b[start + 8] & 0x7F) << 56;
            if (len == 10)
                u |= (uint64_t)b[start + 9] << 63;
            if (len > 10 || (len == 10 && b[start + 9] > 1))
                badv[bad++] = k;
        }
        v[k] = (int64_t)((u >> 1) ^ (~(u & 1) + 1));
    }
    bads = PyBytes_FromStringAndSize((const char *)badv, bad * 8);
    if (bads != NULL)
        out = PyTuple_Pack(3, values, ends, bads);
done:
    PyMem_Free(e);
    PyMem_Free(badv);
    Py_XDECREF(values);
    Py_XDECREF(ends);
    Py_XDECREF(bads);
    PyBuffer_Release(&data);
    return out;
}

/* The fast walk over one block of a stacks array (cpu_batch_reader._Cursor._walk_fast): `count` stacks from varint
 * k, each a run of numbers, an address array of one block (its count, items, end marker; or a lone 0), numbers, the
 * second such array, numbers (the steps: before the first array, after an empty one, after a full one's items,
 * likewise after the second). Returns (the varint index after them, each stack's first varint index as int64
 * bytes); ValueError "not one block" or "truncated stacks array". */
PyObject *avro_walk_stacks(PyObject *self, PyObject *args) {
    Py_buffer values;
    Py_ssize_t k, count, before, between1, between2, after1, after2;
    if (!PyArg_ParseTuple(args, "y*nnnnnnn", &values, &k, &count, &before, &between1, &between2, &after1, &after2))
        return NULL;
    const int64_t *v = values.buf;
    Py_ssize_t n = values.len / 8;
    PyObject *at = NULL, *out = NULL;
    const char *why = NULL;
    if (count < 0 || count > n)
        why = "truncated stacks array";
    else if ((at = PyBytes_FromStringAndSize(NULL, count * 8)) == NULL)
        goto done;
    int64_t *a = why ? NULL : (int64_t *)PyBytes_AS_STRING(at);
    for (Py_ssize_t i = 0; why == NULL && i < count; i++) {
        a[i] = k;
        Py_ssize_t steps[2][2] = {{between1, between2}, {after1, after2}};
        k += before;
        for (int arr = 0; arr < 2 && why == NULL; arr++) {
            if (k < 0 || k >= n) {
                why = "truncated stacks array";
                break;
            }
            int64_t items = v[k];
            if (items < 0) {
                why = "not one block";
            } else if (items == 0) {
                k += steps[arr][0];
            } else if (items >= n - k - 1) {
                why = "truncated stacks array";
            } else if (v[k + 1 + items] != 0) {
                why = "not one block";
            } else {
                k += items + steps[arr][1];
            }
        }
    }
    if (why != NULL)
        PyErr_SetString(PyExc_ValueError, why);
    else
        out = Py_BuildValue("(nO)", k, at);
done:
    Py_XDECREF(at);
    PyBuffer_Release(&values);
    return out;
}
