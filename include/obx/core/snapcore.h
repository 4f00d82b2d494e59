/*
 * snapcore.h - the decisions of the snapshot of pending rows ([source]
 * snapshot = pending; docs/internals/design.md, "Rows pending at the slot's
 * creation"): what an outcome of the delivery policy means for the run,
 * and which headers a snapshot record carries.  run/snapshot.c reads the
 * rows and performs the decisions.  Pure.
 */
#ifndef OBX_SNAPCORE_H
#define OBX_SNAPCORE_H

#include <stddef.h>
#include <stdint.h>

#include "obx/core/delivery.h"
#include "obx/core/event.h"

/*
 * A missing topic holds the snapshot instead of ending it: the run stops
 * producing, lets what is in flight report, and then reads its rows again
 * from the first one whose topic was missing (the same rows: one
 * repeatable-read transaction), producing each record that the first
 * round had produced only once the one before it has its report.  So a
 * record after it is published at most twice, however long and however
 * many topics are waited for ([delivery] missing_topic_timeout).  A record
 * of the topic sent before the first refusal was reported can still reach
 * a topic created meanwhile ahead of the waiting one.
 */
struct obx_snap_hold {
	uint64_t from;  /* the first record (its ticket: the row's ordinal + 1) whose topic is missing;
	                   0: none */
	uint64_t sent;  /* the highest ticket handed to the producer */
	uint64_t until; /* after a resume: the highest ticket the rounds before produced */
	bool probe;     /* after a resume: one record at a time until one past until is settled */
};

/*
 * What outcome o of the delivery policy (delivery.h) for the record ticket
 * of the snapshot of slot means for the run; why is the policy's line for
 * it.  Returns 0 when the run goes on (sent, settled, acknowledged,
 * ignored, and a wait for a topic, which h then holds); OBX_EIO for a
 * transient failure (the session ends and the next one starts the snapshot
 * again); OBX_ECONFIG for what on_error cannot take, a record rejected for
 * good or on_error = stop (exit 1).  On a non-zero return errbuf gets the
 * run's reason.
 */
int obx_snap_outcome(struct obx_snap_hold *h, enum obx_dlv_outcome o, uint64_t ticket, const char *slot,
    const char *reason, char *errbuf, size_t errlen);

/* True when the run must produce nothing more and read again from h->from once nothing is in flight. */
bool obx_snap_holding(const struct obx_snap_hold *h);

/* Nothing is in flight: the ticket to read again from; the hold ends and the probe begins. */
uint64_t obx_snap_resume(struct obx_snap_hold *h);

/* How long a hold pauses before the rows are read again, after a hold in a row that paused last_ms
 * (0: the first): a second, twice as long each time after, up to 30 s, so a topic missing for
 * minutes costs the server a re-read (its sort and MOVE) every 30 s, not every second. */
int64_t obx_snap_pause_ms(int64_t last_ms);

/* While probing, record ticket had its report: once nothing holds and ticket is past every record
 * the rounds before produced, the run produces freely again (none of them goes out a third time). */
void obx_snap_settled(struct obx_snap_hold *h, uint64_t ticket);

/*
 * The headers of a snapshot record made of the event builder's (ev): id,
 * type and the [outbox] ones; lsn 0/0 and seq the row's ordinal (below
 * every streamed record's mark, so restart de-duplication never skips a
 * streamed event for them); no xid or commit_ts (no transaction of the
 * stream wrote them); snapshot the slot's creation point (point).  They go
 * into *hdrs, an array of *cap entries grown here as needed (the caller
 * frees it with free(); NULL and 0 at first), their number into *n.  The
 * headers borrow ev's strings and point.  Returns 0 or OBX_ENOMEM (*hdrs
 * and *cap unchanged).
 */
int obx_snap_headers(const struct obx_event *ev, const char *point, struct obx_header **hdrs, size_t *cap,
    size_t *n);

#endif
