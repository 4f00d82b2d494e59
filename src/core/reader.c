#include <string.h>

#include "obx/core/err.h"
#include "obx/core/reader.h"

void
obx_reader_init(struct obx_reader *r, const void *buf, size_t len)
{
	r->buf = buf;
	r->len = len;
	r->off = 0;
}

size_t
obx_reader_left(const struct obx_reader *r)
{
	return r->len - r->off;
}

static int
read_be(struct obx_reader *r, size_t n, uint64_t *out)
{
	uint64_t v = 0;

	if (obx_reader_left(r) < n)
		return OBX_EPROTO;
	for (size_t i = 0; i < n; i++)
		v = (v << 8) | r->buf[r->off + i];
	r->off += n;
	*out = v;
	return 0;
}

int
obx_read_u8(struct obx_reader *r, uint8_t *out)
{
	uint64_t v;
	int rc = read_be(r, 1, &v);

	if (rc == 0)
		*out = (uint8_t)v;
	return rc;
}

int
obx_read_u16(struct obx_reader *r, uint16_t *out)
{
	uint64_t v;
	int rc = read_be(r, 2, &v);

	if (rc == 0)
		*out = (uint16_t)v;
	return rc;
}

int
obx_read_u32(struct obx_reader *r, uint32_t *out)
{
	uint64_t v;
	int rc = read_be(r, 4, &v);

	if (rc == 0)
		*out = (uint32_t)v;
	return rc;
}

int
obx_read_u64(struct obx_reader *r, uint64_t *out)
{
	return read_be(r, 8, out);
}

int
obx_read_cstring(struct obx_reader *r, const char **out)
{
	const uint8_t *start = r->buf + r->off;
	const uint8_t *nul;

	if (obx_reader_left(r) == 0)
		return OBX_EPROTO;
	nul = memchr(start, '\0', obx_reader_left(r));
	if (nul == NULL)
		return OBX_EPROTO;
	*out = (const char *)start;
	r->off += (size_t)(nul - start) + 1;
	return 0;
}

int
obx_read_bytes(struct obx_reader *r, size_t n, const uint8_t **out)
{
	if (obx_reader_left(r) < n)
		return OBX_EPROTO;
	*out = r->buf + r->off;
	r->off += n;
	return 0;
}

void
obx_put_u64(uint8_t *p, uint64_t v)
{
	for (int i = 7; i >= 0; i--) {
		p[i] = (uint8_t)(v & 0xff);
		v >>= 8;
	}
}
