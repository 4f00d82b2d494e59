/*
 * reader.h - bounded big-endian reader over a borrowed byte buffer
 * (sshbuf/rkbuf style).  No read ever goes past len: every function returns
 * 0 or OBX_EPROTO when the buffer is too short, and leaves the position
 * unchanged on failure.  Views returned by obx_read_cstring/obx_read_bytes
 * point into the buffer and live as long as it does.
 */
#ifndef OBX_READER_H
#define OBX_READER_H

#include <stddef.h>
#include <stdint.h>

struct obx_reader {
	const uint8_t *buf;
	size_t len;
	size_t off;
};

void obx_reader_init(struct obx_reader *r, const void *buf, size_t len);
size_t obx_reader_left(const struct obx_reader *r);

int obx_read_u8(struct obx_reader *r, uint8_t *out);
int obx_read_u16(struct obx_reader *r, uint16_t *out);
int obx_read_u32(struct obx_reader *r, uint32_t *out);
int obx_read_u64(struct obx_reader *r, uint64_t *out);
/* A NUL-terminated string; *out points at it (borrowed), NUL included in the buffer. */
int obx_read_cstring(struct obx_reader *r, const char **out);
/* n raw bytes; *out points at them (borrowed). */
int obx_read_bytes(struct obx_reader *r, size_t n, const uint8_t **out);

/* Big-endian stores into a caller buffer with room for the value. */
void obx_put_u64(uint8_t *p, uint64_t v);

#endif
