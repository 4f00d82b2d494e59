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

#include "obx/core/delivery.h"
#include "obx/core/event.h"

/*
 * What outcome o of the delivery policy (delivery.h) for a record of the
 * snapshot of slot means for the run; why is the policy's line for it.
 * Returns 0 when the run goes on (sent, settled, acknowledged, ignored);
 * OBX_EIO for a wait for a topic or a transient failure (the session ends
 * and the next one starts the snapshot again); OBX_ECONFIG for what
 * on_error cannot take, a record rejected for good or on_error = stop
 * (exit 1).  On a non-zero return errbuf gets the run's reason.
 */
int obx_snap_outcome(enum obx_dlv_outcome o, const char *slot, const char *reason, char *errbuf, size_t errlen);

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
