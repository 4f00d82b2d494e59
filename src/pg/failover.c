/*
 * pg/failover.c - the slot's failover flag (PostgreSQL 17+): made
 * [source] failover, and what is said once about it: ignored below 17, off
 * on a hot standby's own slot until the promotion, a slot synchronized from
 * a former primary (see pg/slot.h; docs/internals/design.md, "Slot guard").
 */
#include <stdio.h>

#include "obx/core/err.h"
#include "obx/core/pgversion.h"
#include "obx/pg/setup_int.h"
#include "obx/sys/log.h"

/* ALTER_REPLICATION_SLOT waits for a slot another instance holds; this long at most. */
#define ALTER_WAIT_MS 5000

void
obx_pgsetup_note_failover_ignored(const struct obx_config *cfg, const struct obx_pgfacts *f,
    struct obx_pgsetup_ctx *ctx)
{
	char ver[32];

	if (!cfg->failover || !cfg->failover_set || f->failover_slots || ctx->said_failover_ignored)
		return;
	obx_log_info("[source] failover = on is ignored: PostgreSQL %s cannot synchronize slots to "
	             "standbys (17 and later can); after a failover the slot guard refuses to go on without "
	             "the slot",
	    obx_pgversion_format(f->version, ver, sizeof(ver)));
	ctx->said_failover_ignored = true;
}

void
obx_pgsetup_note_standby_failover(const struct obx_config *cfg, struct obx_pgsetup_ctx *ctx)
{
	if (ctx->said_standby_failover)
		return;
	ctx->said_standby_failover = true;
	obx_log_info("slot %s is on a hot standby, where failover cannot be enabled (only a primary's "
	             "slots are synchronized to standbys): outboxd enables it when it connects after this "
	             "server's promotion",
	    cfg->slot);
}

/*
 * Makes the slot's failover flag [source] failover (PostgreSQL 17+).  A hot
 * standby's own slot cannot have failover (only a primary's slots are
 * synchronized): said once, and enabled by the first session after the
 * promotion.  A slot another instance streams from is left alone:
 * ALTER_REPLICATION_SLOT would wait until that instance lets go.  Returns 0
 * (also when the server refused the change, which is only logged),
 * OBX_EBUSY (another instance took the slot meanwhile) or OBX_EIO (the
 * connection failed, or a stop signal came while waiting).
 */
int
obx_pgsetup_match_failover(PGconn *c, const struct obx_config *cfg, const struct obx_pgsetup_names *nm,
    const struct obx_pgsetup_slotrow *row, bool in_recovery, struct obx_pgsetup_ctx *ctx, char *errbuf,
    size_t errlen)
{
	char sql[512], err[1024], state[6];
	PGresult *res;
	int r;

	if (row->failover == cfg->failover)
		return 0;
	if (in_recovery && cfg->failover) {
		obx_pgsetup_note_standby_failover(cfg, ctx);
		return 0;
	}
	if (row->active) {
		obx_log_debug("slot %s is in use: its failover flag is left as it is", cfg->slot);
		return 0;
	}
	snprintf(sql, sizeof(sql), "ALTER_REPLICATION_SLOT %s (FAILOVER %s)", nm->slot_ident,
	    cfg->failover ? "true" : "false");
	r = obx_pgsetup_query_waiting(c, sql, ALTER_WAIT_MS, ctx, &res, state, err, sizeof(err));
	if (r == 0) {
		PQclear(res);
		if (cfg->failover)
			obx_log_info("enabled failover on slot %s: standbys that run sync_replication_slots = on "
			             "keep a copy of it for a failover",
			    cfg->slot);
		else
			obx_log_info("disabled failover on slot %s ([source] failover = off): a failover to a "
			             "standby loses the slot",
			    cfg->slot);
		return 0;
	}
	if (r == OBX_EBUSY)
		return obx_pgsetup_failf(errbuf, errlen, OBX_EBUSY, "slot %s is in use by another instance",
		    cfg->slot);
	if (r == OBX_ESTATE || PQstatus(c) != CONNECTION_OK)
		return obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "could not set failover on slot %s: %s",
		    cfg->slot, r == OBX_ESTATE ? "stopped while waiting" : err);
	obx_log_warn("could not set failover = %s on slot %s: %s; streaming without the change",
	    cfg->failover ? "on" : "off", cfg->slot, err);
	return 0;
}

/*
 * A slot synchronized to a standby (17, failover) that was then promoted:
 * the same slot, at the position last copied from the former primary,
 * which may be behind what outboxd confirmed there.  Said once.
 */
void
obx_pgsetup_note_synced(const struct obx_config *cfg, obx_lsn confirmed, struct obx_pgsetup_ctx *ctx)
{
	char at[OBX_LSN_STRLEN];

	if (ctx->said_synced)
		return;
	ctx->said_synced = true;
	obx_log_info("slot %s was synchronized from the former primary before this server's "
	             "promotion: resuming at %s; events confirmed there after the last synchronization are "
	             "published again",
	    cfg->slot, obx_lsn_format(confirmed, at, sizeof(at)));
}
