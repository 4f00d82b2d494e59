/* core/slotguard.c - the slot guard's decision (see slotguard.h). */
#include <stdio.h>

#include "obx/core/err.h"
#include "obx/core/slotguard.h"

int
obx_slotguard_may_create(const struct obx_slotguard *g, const char *slot, bool recreate, bool create_slot,
    char *errbuf, size_t errlen)
{
	if (g->marked && !recreate && g->guard_slot[0] != '\0') {
		snprintf(errbuf, errlen,
		    "replication slot %s is missing but existed before (physical slot %s records it): "
		    "after a failover, a drop or a restore, events committed since its last position may "
		    "not be published; reconcile, then start once with --recreate-slot",
		    slot, g->guard_slot);
		return OBX_ECONFIG;
	}
	if (g->marked && !recreate) {
		snprintf(errbuf, errlen,
		    "replication slot %s is missing but existed before (created at %s on system %s): "
		    "after a failover, a drop or a restore, events committed since its last position may "
		    "not be published; reconcile, then start once with --recreate-slot",
		    slot, g->lsn, g->sysid);
		return OBX_ECONFIG;
	}
	if (!g->marked && !create_slot) {
		snprintf(errbuf, errlen, "replication slot %s does not exist and create_slot = false", slot);
		return OBX_ECONFIG;
	}
	return 0;
}
