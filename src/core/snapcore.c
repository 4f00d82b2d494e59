/*
 * snapcore.c - the snapshot's decisions (pure); see snapcore.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/core/snapcore.h"

int
obx_snap_outcome(struct obx_snap_hold *h, enum obx_dlv_outcome o, uint64_t ticket, const char *slot,
    const char *reason, char *errbuf, size_t errlen)
{
	if (o == OBX_DLV_SENT && ticket > h->sent)
		h->sent = ticket;
	switch (o) {
	case OBX_DLV_SENT:
	case OBX_DLV_SETTLED:
	case OBX_DLV_ACKED:
	case OBX_DLV_IGNORED:
		return 0;
	case OBX_DLV_WAIT_TOPIC:
		/* the earliest record that waits is where the rows are read again */
		if (h->from == 0 || ticket < h->from)
			h->from = ticket;
		return 0;
	case OBX_DLV_RETRY:
		snprintf(errbuf, errlen, "snapshot of slot %s: %s; the snapshot starts again", slot, reason);
		return OBX_EIO;
	case OBX_DLV_REJECTED:
	case OBX_DLV_SOLO: /* not asked for (find_alone): the stream's alone */
	case OBX_DLV_STOP:
		snprintf(errbuf, errlen, "snapshot of slot %s: %s", slot, reason);
		return OBX_ECONFIG;
	}
	return 0;
}

bool
obx_snap_holding(const struct obx_snap_hold *h)
{
	return h->from != 0;
}

uint64_t
obx_snap_resume(struct obx_snap_hold *h)
{
	uint64_t from = h->from;

	h->from = 0;
	h->probe = true;
	if (h->sent > h->until)
		h->until = h->sent;
	return from;
}

int64_t
obx_snap_pause_ms(int64_t last_ms)
{
	if (last_ms <= 0)
		return 1000;
	return last_ms < 15000 ? last_ms * 2 : 30000;
}

void
obx_snap_settled(struct obx_snap_hold *h, uint64_t ticket)
{
	if (h->from == 0 && ticket >= h->until)
		h->probe = false;
}

int
obx_snap_headers(const struct obx_event *ev, const char *point, struct obx_header **hdrs, size_t *cap, size_t *n)
{
	size_t o = 0;

	if (ev->nheaders + 1 > *cap) {
		struct obx_header *h = reallocarray(*hdrs, ev->nheaders + 1, sizeof(*h));

		if (h == NULL)
			return OBX_ENOMEM;
		*hdrs = h;
		*cap = ev->nheaders + 1;
	}
	for (size_t i = 0; i < ev->nheaders; i++) {
		/* the builder's first six are id, type, lsn, seq, xid, commit_ts (event.c) */
		if (i < 6 &&
		    (strcmp(ev->headers[i].name, "xid") == 0 || strcmp(ev->headers[i].name, "commit_ts") == 0))
			continue;
		(*hdrs)[o++] = ev->headers[i];
	}
	(*hdrs)[o++] = (struct obx_header){ "snapshot", point, strlen(point) };
	*n = o;
	return 0;
}
