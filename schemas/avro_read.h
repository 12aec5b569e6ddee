/* What the reader's files share (avro_read.c, the values; avro_read_columns.c, arrays of records as columns): the
 * cursor over a body and the primitives both read it with. Where one is unsure of the input, those returning an int
 * give -1 with no error set (the caller says why, with fail), those returning an object NULL with the error set. */
#ifndef FLEETPROF_AVRO_READ_H
#define FLEETPROF_AVRO_READ_H

#include "avro_fast.h"

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
} cursor;

PyObject *fail(const char *why);                      /* ValueError(why); NULL */
int read_long(cursor *c, int64_t *out);               /* a zig-zag varint of at most 64 bits */
int read_length(cursor *c, Py_ssize_t *out);          /* a length the rest of the body can hold */
int read_block(cursor *c, int64_t *count);            /* the count of an array's or map's next block (0: the end) */
PyObject *read_value(cursor *c, PyObject *type, int depth);
PyObject *read_columns(cursor *c, PyObject *type, int depth);  /* T_COLUMNS (avro_read_columns.c) */

#endif
