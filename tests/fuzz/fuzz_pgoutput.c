/*
 * libFuzzer entry point over what the network feeds: CopyData framing, the
 * pgoutput decoder, the relation cache and the event builder.  The input is
 * a byte choosing the protocol version, then a sequence of messages, each
 * prefixed by a 2-byte big-endian length; every
 * decoded Relation updates the cache and every Insert on a cached relation
 * is built into a record, as the relay does; inside streamed blocks rows go
 * to the stream buffer and are built at Stream Commit or dropped at Abort.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/config.h"
#include "obx/core/event.h"
#include "obx/core/pgoutput.h"
#include "obx/core/relcache.h"
#include "obx/core/streambuf.h"
#include "obx/core/walmsg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct obx_config cfg;
static int initialised;

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct obx_pgoutput dec;
	struct obx_relcache rc;
	struct obx_event_builder eb;
	struct obx_streambuf sb;
	struct obx_txninfo txn = { 0x1000, 7, 0 };
	uint32_t stream_xid = 0;
	size_t off = 0;
	uint32_t seq = 0;

	if (!initialised) {
		char err[256];

		obx_config_init(&cfg);
		obx_config_set(&cfg, "outbox", "headers", "headers", "fuzz", false, err, sizeof(err));
		obx_config_set(&cfg, "outbox", "timestamp", "created_at", "fuzz", false, err, sizeof(err));
		obx_config_set(&cfg, "outbox", "header.source", "origin", "fuzz", false, err, sizeof(err));
		initialised = 1;
	}
	/* the first byte picks the protocol version (1-4) and streaming = parallel */
	if (size == 0)
		return 0;
	obx_pgoutput_init(&dec, 1 + data[0] % 4);
	dec.stream_parallel = (data[0] & 4) != 0;
	off = 1;
	obx_relcache_init(&rc);
	obx_streambuf_init(&sb, 1 << 20);
	if (obx_event_builder_init(&eb, &cfg) != 0)
		abort();
	while (off + 2 <= size) {
		size_t len = (size_t)data[off] << 8 | data[off + 1];
		struct obx_walmsg w;
		struct obx_pgmsg m;
		uint8_t *copy;

		off += 2;
		if (len > size - off)
			len = size - off;
		/* an exact-size heap copy, so any over-read is caught */
		copy = malloc(len ? len : 1);
		memcpy(copy, data + off, len);
		off += len;
		if (obx_walmsg_parse(copy, len, &w) == 0 && w.kind == 'w' &&
		    obx_pgoutput_decode(&dec, w.payload, w.payload_len, &m) == 0) {
			struct obx_event ev;
			char errbuf[256];

			if (m.type == 'R') {
				obx_relcache_update(&rc, &m);
			} else if (m.type == 'I') {
				const struct obx_rel *rel = obx_relcache_get(&rc, m.u.insert.relid);

				if (rel != NULL && dec.in_stream)
					obx_streambuf_add(&sb, stream_xid, m.xid, rel, &m.u.insert.tuple);
				else if (rel != NULL)
					obx_event_build(&eb, rel, &m.u.insert.tuple, &txn, seq++, &ev, errbuf,
					    sizeof(errbuf));
			} else if (m.type == 'S') {
				stream_xid = m.u.stream_start.xid;
				obx_streambuf_start(&sb, stream_xid);
			} else if (m.type == 'A') {
				obx_streambuf_abort(&sb, m.u.stream_abort.xid, m.u.stream_abort.subxid);
			} else if (m.type == 'c') {
				const struct obx_sbuf_txn *t = obx_streambuf_get(&sb, m.u.stream_commit.xid);

				obx_event_builder_forget(&eb);
				for (size_t i = 0; t != NULL && i < t->nrows; i++)
					obx_event_build(&eb, &t->rels[t->rows[i].rel], &t->rows[i].tuple, &txn,
					    (uint32_t)i, &ev, errbuf, sizeof(errbuf));
				obx_event_builder_forget(&eb);
				obx_streambuf_drop(&sb, m.u.stream_commit.xid);
			}
		}
		free(copy);
	}
	obx_event_builder_reset(&eb);
	obx_streambuf_reset(&sb);
	obx_relcache_reset(&rc);
	obx_pgoutput_reset(&dec);
	return 0;
}
