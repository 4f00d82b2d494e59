/* A tiny big-endian byte writer for hand-made protocol fixtures. */
#ifndef OBX_TEST_BYTES_H
#define OBX_TEST_BYTES_H

#include <stdint.h>
#include <string.h>

struct bytes {
	uint8_t b[8192];
	size_t n;
};

static inline void
put8(struct bytes *w, uint8_t v)
{
	w->b[w->n++] = v;
}

static inline void
put16(struct bytes *w, uint16_t v)
{
	put8(w, (uint8_t)(v >> 8));
	put8(w, (uint8_t)v);
}

static inline void
put32(struct bytes *w, uint32_t v)
{
	put16(w, (uint16_t)(v >> 16));
	put16(w, (uint16_t)v);
}

static inline void
put64(struct bytes *w, uint64_t v)
{
	put32(w, (uint32_t)(v >> 32));
	put32(w, (uint32_t)v);
}

static inline void
putstr(struct bytes *w, const char *s)
{
	memcpy(w->b + w->n, s, strlen(s) + 1);
	w->n += strlen(s) + 1;
}

/* A text column of TupleData. */
static inline void
puttext(struct bytes *w, const char *s)
{
	put8(w, 't');
	put32(w, (uint32_t)strlen(s));
	memcpy(w->b + w->n, s, strlen(s));
	w->n += strlen(s);
}

#endif
