/*
 * lsn.h - PostgreSQL log sequence numbers in their "X/X" text form.
 */
#ifndef OBX_LSN_H
#define OBX_LSN_H

#include <stddef.h>
#include <stdint.h>

typedef uint64_t obx_lsn;

#define OBX_LSN_INVALID ((obx_lsn)0)
#define OBX_LSN_STRLEN 18 /* "FFFFFFFF/FFFFFFFF" plus NUL */

/*
 * Parses "HI/LO" (1-8 hex digits each, nothing else) into *out.
 * Returns 0, or OBX_EINVAL on any other text (also overlong halves).
 */
int obx_lsn_parse(const char *s, obx_lsn *out);

/* Formats lsn as "HI/LO" into buf (at least OBX_LSN_STRLEN bytes); returns buf. */
char *obx_lsn_format(obx_lsn lsn, char *buf, size_t len);

#endif
