#include <stdlib.h>
#include <string.h>

#include "obx/core/acktrack.h"
#include "obx/core/err.h"

void
obx_ack_init(struct obx_acktrack *t, obx_lsn start)
{
	memset(t, 0, sizeof(*t));
	t->flushable = start;
}

void
obx_ack_reset(struct obx_acktrack *t)
{
	free(t->ring);
	memset(t, 0, sizeof(*t));
}

static struct obx_ack_txn *
at(struct obx_acktrack *t, size_t i)
{
	return &t->ring[(t->head + i) % t->cap];
}

static int
grow(struct obx_acktrack *t)
{
	size_t ncap = t->cap ? t->cap * 2 : 64;
	struct obx_ack_txn *n = calloc(ncap, sizeof(*n));

	if (n == NULL)
		return OBX_ENOMEM;
	for (size_t i = 0; i < t->count; i++)
		n[i] = *at(t, i);
	free(t->ring);
	t->ring = n;
	t->cap = ncap;
	t->head = 0;
	return 0;
}

/* Pops fully acknowledged committed transactions off the head. */
static void
advance(struct obx_acktrack *t)
{
	while (t->count > 0) {
		struct obx_ack_txn *h = at(t, 0);

		if (!h->committed || h->outstanding > 0)
			break;
		if (h->end_lsn > t->flushable)
			t->flushable = h->end_lsn;
		t->head = (t->head + 1) % t->cap;
		t->count--;
		t->head_ticket++;
	}
}

int
obx_ack_begin_at(struct obx_acktrack *t, int64_t time)
{
	if (t->open)
		return OBX_ESTATE;
	t->open = true;
	t->open_queued = false;
	t->open_time = time;
	return 0;
}

int
obx_ack_begin(struct obx_acktrack *t)
{
	return obx_ack_begin_at(t, 0);
}

bool
obx_ack_oldest_time(const struct obx_acktrack *t, int64_t *time)
{
	if (t->count == 0)
		return false;
	*time = t->ring[t->head].time;
	return true;
}

int64_t
obx_ack_ticket_time(const struct obx_acktrack *t, uint64_t ticket)
{
	if (ticket < t->head_ticket || ticket - t->head_ticket >= t->count)
		return 0;
	return t->ring[(t->head + (size_t)(ticket - t->head_ticket)) % t->cap].time;
}

int
obx_ack_add_event(struct obx_acktrack *t, uint64_t *ticket)
{
	int rc;

	if (!t->open)
		return OBX_ESTATE;
	if (!t->open_queued) {
		if (t->count == t->cap && (rc = grow(t)) != 0)
			return rc;
		*at(t, t->count) = (struct obx_ack_txn){ 0, t->open_time, 0, false };
		t->count++;
		t->open_queued = true;
	}
	at(t, t->count - 1)->outstanding++;
	t->outstanding++;
	*ticket = t->head_ticket + t->count - 1;
	return 0;
}

int
obx_ack_commit(struct obx_acktrack *t, obx_lsn end_lsn)
{
	if (!t->open)
		return OBX_ESTATE;
	t->open = false;
	if (t->open_queued) {
		struct obx_ack_txn *tail = at(t, t->count - 1);

		tail->committed = true;
		tail->end_lsn = end_lsn;
	} else if (t->count > 0) {
		/* no events: complete, but it may not be confirmed before its predecessors */
		struct obx_ack_txn *tail = at(t, t->count - 1);

		if (end_lsn > tail->end_lsn)
			tail->end_lsn = end_lsn;
	} else if (end_lsn > t->flushable) {
		t->flushable = end_lsn;
	}
	t->open_queued = false;
	advance(t);
	return 0;
}

int
obx_ack_ack(struct obx_acktrack *t, uint64_t ticket)
{
	struct obx_ack_txn *e;

	if (ticket < t->head_ticket || ticket - t->head_ticket >= t->count)
		return OBX_ENOENT;
	e = at(t, (size_t)(ticket - t->head_ticket));
	if (e->outstanding == 0)
		return OBX_ENOENT;
	e->outstanding--;
	t->outstanding--;
	advance(t);
	return 0;
}

void
obx_ack_keepalive(struct obx_acktrack *t, obx_lsn wal_end)
{
	if (!t->open && t->count == 0 && t->streams_open == 0 && wal_end > t->flushable)
		t->flushable = wal_end;
}

obx_lsn
obx_ack_flushable(const struct obx_acktrack *t)
{
	return t->flushable;
}

bool
obx_ack_idle(const struct obx_acktrack *t)
{
	return !t->open && t->count == 0 && t->streams_open == 0;
}

void
obx_ack_streams_open(struct obx_acktrack *t, size_t n)
{
	t->streams_open = n;
}
