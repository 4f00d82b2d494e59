/*
 * slotguard.h - the slot guard's decision (pure): whether a missing slot may
 * be created.  The guard's record of a slot is the line
 * "outboxd-slot SLOT SYSID LSN" in the publication's comment, written when
 * outboxd creates the slot (pg/slot.h; docs/internals/design.md, "Slot
 * guard").
 */
#ifndef OBX_SLOTGUARD_H
#define OBX_SLOTGUARD_H

#include <stdbool.h>
#include <stddef.h>

/* What the publication's comment records of one slot. */
struct obx_slotguard {
	bool marked;         /* the comment records the slot: it existed */
	char sysid[32];      /* the system it was created on (informational, never compared) */
	char lsn[32];        /* its creation point, as the record writes it */
	char guard_slot[64]; /* "" or the physical slot that records it instead (obx_snapmark_guard_name()) */
};

/*
 * Decides whether slot, missing now, may be created: not when g says it
 * existed before, unless recreate (outboxd run --recreate-slot), nor when
 * it never existed and create_slot ([source] create_slot) is false.
 * Returns 0, or OBX_ECONFIG with the line that says why and what to do in
 * errbuf.
 */
int obx_slotguard_may_create(const struct obx_slotguard *g, const char *slot, bool recreate, bool create_slot,
    char *errbuf, size_t errlen);

#endif
