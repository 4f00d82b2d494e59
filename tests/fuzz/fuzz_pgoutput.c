/*
 * libFuzzer entry point over what the network feeds: CopyData framing, the
 * pgoutput decoder, the relation cache and the event builder.  The input is
 * a byte choosing the protocol version, then a sequence of messages, each
 * prefixed by a 2-byte big-endian length; every
 * decoded Relation updates the cache and every Insert on a cached relation
 * is built into a record, as the relay does.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "obx/config.h"
#include "obx/event.h"
#include "obx/pgoutput.h"
#include "obx/relcache.h"
#include "obx/walmsg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct obx_config cfg;
static int initialised;

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct obx_pgoutput dec;
	struct obx_relcache rc;
	struct obx_event_builder eb;
	struct obx_txninfo txn = { 0x1000, 7, 0 };
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
			if (m.type == 'R') {
				obx_relcache_update(&rc, &m);
			} else if (m.type == 'I') {
				const struct obx_rel *rel = obx_relcache_get(&rc, m.u.insert.relid);
				struct obx_event ev;
				char why[256];

				if (rel != NULL)
					obx_event_build(&eb, rel, &m.u.insert.tuple, &txn, seq++, &ev, why, sizeof(why));
			}
		}
		free(copy);
	}
	obx_event_builder_reset(&eb);
	obx_relcache_reset(&rc);
	obx_pgoutput_reset(&dec);
	return 0;
}
