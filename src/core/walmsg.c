#include "obx/core/err.h"
#include "obx/core/reader.h"
#include "obx/core/walmsg.h"

int
obx_walmsg_parse(const void *buf, size_t len, struct obx_walmsg *out)
{
	struct obx_reader r;
	uint8_t kind, reply;
	uint64_t t;

	obx_reader_init(&r, buf, len);
	if (obx_read_u8(&r, &kind) != 0)
		return OBX_EPROTO;
	out->kind = (char)kind;
	out->payload = NULL;
	out->payload_len = 0;
	out->reply_requested = false;
	out->data_start = 0;
	switch (kind) {
	case 'w':
		if (obx_read_u64(&r, &out->data_start) != 0 || obx_read_u64(&r, &out->wal_end) != 0 ||
		    obx_read_u64(&r, &t) != 0)
			return OBX_EPROTO;
		out->send_time = (int64_t)t;
		out->payload_len = obx_reader_left(&r);
		return obx_read_bytes(&r, out->payload_len, &out->payload);
	case 'k':
		if (obx_read_u64(&r, &out->wal_end) != 0 || obx_read_u64(&r, &t) != 0 ||
		    obx_read_u8(&r, &reply) != 0 || obx_reader_left(&r) != 0)
			return OBX_EPROTO;
		out->send_time = (int64_t)t;
		out->reply_requested = reply != 0;
		return 0;
	default:
		return OBX_EPROTO;
	}
}

void
obx_walmsg_status(uint8_t out[OBX_STATUS_UPDATE_LEN], obx_lsn write, obx_lsn flush, obx_lsn apply,
    int64_t send_time, bool reply_requested)
{
	out[0] = 'r';
	obx_put_u64(out + 1, write);
	obx_put_u64(out + 9, flush);
	obx_put_u64(out + 17, apply);
	obx_put_u64(out + 25, (uint64_t)send_time);
	out[33] = reply_requested ? 1 : 0;
}
