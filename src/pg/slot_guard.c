/*
 * pg/slot_guard.c - the slot guard's record: the line
 * "outboxd-slot SLOT SYSID LSN" in the publication's comment, read, written
 * when outboxd creates or first finds the slot, and named for the primary
 * when the server is a read-only hot standby (see pg/slot.h; whether a
 * missing slot may be created is core/slotguard.c's decision).
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/core/snapmark.h"
#include "obx/pg/setup_int.h"
#include "obx/sys/log.h"

#define MARKER "outboxd-slot"

/* A word of a record: a slot name, a system identifier or an LSN fits with room to spare. */
#define WORD_MAX 128

/*
 * Copies the first nw words of line (n bytes; words are separated by white
 * space) into w, each cut to WORD_MAX - 1 bytes: an over-long word still
 * counts, so a damaged record is never taken for none.  Returns how many
 * there were.
 */
static int
split_words(const char *line, size_t n, char w[][WORD_MAX], int nw)
{
	size_t i = 0;
	int k = 0;

	while (k < nw) {
		size_t start, len;

		while (i < n && isspace((unsigned char)line[i]))
			i++;
		if (i == n)
			break;
		start = i;
		while (i < n && !isspace((unsigned char)line[i]))
			i++;
		len = i - start < WORD_MAX ? i - start : WORD_MAX - 1;
		memcpy(w[k], line + start, len);
		w[k][len] = '\0';
		k++;
	}
	return k;
}

/*
 * Finds the record of slot in comment: a line that begins with
 * "outboxd-slot " and goes on with the slot's name, the system identifier
 * and the LSN (anything after them is ignored).  Returns 0 with rec filled
 * (rec->marked set), or OBX_ENOENT with rec empty.
 */
static int
find_marker(const char *comment, const char *slot, struct obx_slotguard *rec)
{
	const size_t ml = strlen(MARKER);

	memset(rec, 0, sizeof(*rec));
	for (const char *p = comment; p != NULL && *p != '\0';) {
		const char *nl = strchr(p, '\n');
		size_t n = nl != NULL ? (size_t)(nl - p) : strlen(p);
		char w[3][WORD_MAX];

		if (n > ml && strncmp(p, MARKER, ml) == 0 && isspace((unsigned char)p[ml]) &&
		    split_words(p + ml, n - ml, w, 3) == 3 && strcmp(w[0], slot) == 0) {
			rec->marked = true;
			/* cut to the fields, as a damaged record is still this slot's record */
			strlcpy(rec->sysid, w[1], sizeof(rec->sysid));
			strlcpy(rec->lsn, w[2], sizeof(rec->lsn));
			return 0;
		}
		p = nl != NULL ? nl + 1 : NULL;
	}
	return OBX_ENOENT;
}

/*
 * Whether slot's guard slot exists: sets rec->marked and rec->guard_slot when
 * it does.  Returns 0 or OBX_EIO (errbuf).
 */
static int
guard_slot_exists(PGconn *c, const char *slot, struct obx_slotguard *rec, char *errbuf, size_t errlen)
{
	char name[64], sql[256], err[1024];
	char *lit;
	PGresult *res;

	obx_snapmark_guard_name(slot, name, sizeof(name));
	if ((lit = PQescapeLiteral(c, name, strlen(name))) == NULL)
		return obx_pgsetup_failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	snprintf(sql, sizeof(sql),
	    "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND slot_type = 'physical'", lit);
	PQfreemem(lit);
	if (obx_pgsetup_query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "could not read slot %s: %s", name, err);
	if (PQntuples(res) > 0) {
		rec->marked = true;
		strlcpy(rec->guard_slot, name, sizeof(rec->guard_slot));
	}
	PQclear(res);
	return 0;
}

void
obx_pgsetup_keep_guard_slot(PGconn *c, const struct obx_config *cfg, struct obx_pgsetup_ctx *ctx)
{
	struct obx_slotguard rec = { .marked = false };
	char name[64], sql[256], err[1024], state[6] = "";
	char *ident;
	PGresult *res;

	if (guard_slot_exists(c, cfg->slot, &rec, err, sizeof(err)) != 0 || rec.marked)
		return;
	obx_snapmark_guard_name(cfg->slot, name, sizeof(name));
	if ((ident = PQescapeIdentifier(c, name, strlen(name))) == NULL)
		return;
	/* no RESERVE_WAL: it pins nothing */
	snprintf(sql, sizeof(sql), "CREATE_REPLICATION_SLOT %s PHYSICAL", ident);
	PQfreemem(ident);
	if (obx_pgsetup_query(c, sql, &res, state, err, sizeof(err)) == 0) {
		PQclear(res);
		rec.marked = true;
	} else if (strcmp(state, "42710") == 0 && guard_slot_exists(c, cfg->slot, &rec, err, sizeof(err)) == 0 &&
	    !rec.marked) {
		snprintf(err, sizeof(err), "a logical slot has that name");
	}
	if (rec.marked) { /* made now, or by another instance meanwhile */
		if (!ctx->said_guard_slot)
			obx_log_info("publication %s's comment cannot record slot %s (another role owns the "
			             "publication): physical slot %s records it instead (it reserves no WAL; "
			             "outboxd drop-slot drops it)",
			    cfg->publication, cfg->slot, name);
		ctx->said_guard_slot = true;
		return;
	}
	obx_log_warn("could not record slot %s, neither in publication %s's comment (another role owns it) nor "
	             "as physical slot %s: %s; a later loss of the slot will not be detected",
	    cfg->slot, cfg->publication, name, err);
}

int
obx_pgsetup_read_guard(PGconn *c, const struct obx_config *cfg, const struct obx_pgsetup_names *nm,
    struct obx_pgsetup_guard *g, char *errbuf, size_t errlen)
{
	char sql[1024], err[1024];
	PGresult *res;

	obx_pgsetup_guard_reset(g);
	memset(&g->rec, 0, sizeof(g->rec));
	snprintf(sql, sizeof(sql),
	    "SELECT coalesce(obj_description(oid, 'pg_publication'), '') "
	    "FROM pg_publication WHERE pubname = %s",
	    nm->pub_lit);
	if (obx_pgsetup_query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "could not read publication comment: %s", err);
	g->comment = strdup(PQntuples(res) > 0 ? PQgetvalue(res, 0, 0) : "");
	PQclear(res);
	if (g->comment == NULL)
		return obx_pgsetup_failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	if (find_marker(g->comment, cfg->slot, &g->rec) == 0)
		return 0;
	/* no line in the comment: the guard slot may record it (obx_pgsetup_keep_guard_slot()) */
	return guard_slot_exists(c, cfg->slot, &g->rec, errbuf, errlen);
}

void
obx_pgsetup_guard_reset(struct obx_pgsetup_guard *g)
{
	free(g->comment);
	g->comment = NULL;
}

int
obx_pgsetup_record_marker(PGconn *c, const struct obx_config *cfg, const struct obx_pgsetup_names *nm,
    const char *comment, const char *sysid, const char *lsn, bool quiet)
{
	char *text = NULL, *lit = NULL, *sql = NULL;
	size_t len = 0;
	FILE *fp = open_memstream(&text, &len);
	char err[1024];
	PGresult *res;
	int r = OBX_ENOMEM;

	if (fp == NULL)
		return OBX_ENOMEM;
	/* keep the other lines (other slots, a human's note), replace ours */
	for (const char *p = comment; p != NULL && *p != '\0';) {
		const char *nl = strchr(p, '\n');
		size_t n = nl ? (size_t)(nl - p) : strlen(p);
		char prefix[160];

		snprintf(prefix, sizeof(prefix), MARKER " %s ", cfg->slot);
		if (strncmp(p, prefix, strlen(prefix)) != 0 && n > 0)
			fprintf(fp, "%.*s\n", (int)n, p);
		p = nl ? nl + 1 : NULL;
	}
	fprintf(fp, MARKER " %s %s %s", cfg->slot, sysid, lsn);
	fclose(fp);
	lit = PQescapeLiteral(c, text, strlen(text));
	if (lit == NULL || asprintf(&sql, "COMMENT ON PUBLICATION %s IS %s", nm->pub_ident, lit) <= 0) {
		sql = NULL;
		goto out;
	}
	if (obx_pgsetup_query(c, sql, &res, NULL, err, sizeof(err)) == 0) {
		PQclear(res);
		r = 0;
	} else {
		obx_log(quiet ? OBX_LOG_DEBUG : OBX_LOG_WARN,
		    "could not record the creation of slot %s "
		    "on publication %s: %s; a later loss of the slot will not be detected (make the "
		    "outboxd role own the publication)",
		    cfg->slot, cfg->publication, err);
		r = OBX_EIO;
	}
out:
	free(sql);
	PQfreemem(lit);
	free(text);
	return r;
}

/*
 * A hot standby is read-only: the guard cannot record the slot there.  Says
 * so once, with the line that protects the slot when added to the
 * publication's comment on the primary (it reaches the standby through the
 * WAL like any other change).
 */
void
obx_pgsetup_note_standby_guard(const struct obx_config *cfg, const char *sysid, const char *lsn,
    struct obx_pgsetup_ctx *ctx)
{
	if (ctx->said_standby_guard)
		return;
	ctx->said_standby_guard = true;
	obx_log_warn("this hot standby is read-only: the slot guard cannot record slot %s on "
	             "publication %s here, so a loss of the slot would not be detected; to protect it, add the "
	             "line '" MARKER " %s %s %s' to the publication's comment on the primary",
	    cfg->slot, cfg->publication, cfg->slot, sysid, lsn);
}

/*
 * The slot exists but the publication holds no record of it: a slot made
 * outside outboxd (or by an earlier version), recorded now so that a later
 * loss is detected.  A publication dropped and created again behind the
 * slot also loses the record; the server then cannot decode the slot's
 * backlog ("publication ... does not exist"), which ends the run with the
 * recovery steps (relay.c).  Only warns, and only once per process, when
 * the record cannot be written; on a hot standby, which cannot write it,
 * says once what to add on the primary.
 */
void
obx_pgsetup_adopt_slot(PGconn *c, const struct obx_config *cfg, const struct obx_pgsetup_names *nm,
    const char *sysid, obx_lsn confirmed, bool in_recovery, struct obx_pgsetup_ctx *ctx, obx_lsn *born)
{
	char sql[1024], err[1024], at[OBX_LSN_STRLEN];
	struct obx_slotguard rec = { .marked = false };
	PGresult *res;

	*born = 0;
	snprintf(sql, sizeof(sql),
	    "SELECT coalesce(obj_description(oid, 'pg_publication'), '') "
	    "FROM pg_publication WHERE pubname = %s",
	    nm->pub_lit);
	if (obx_pgsetup_query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return;
	if (PQntuples(res) == 1 && find_marker(PQgetvalue(res, 0, 0), cfg->slot, &rec) == 0) {
		if (obx_lsn_parse(rec.lsn, born) != 0)
			*born = 0;
	} else if (PQntuples(res) == 1 && guard_slot_exists(c, cfg->slot, &rec, err, sizeof(err)) == 0 &&
	    rec.marked) {
		/* recorded by its guard slot since an earlier session, which knew no birth position: a
		 * comment line written now would give the same slot another identity (exactly-once) */
	} else if (PQntuples(res) == 1) {
		obx_lsn_format(confirmed, at, sizeof(at));
		if (in_recovery)
			obx_pgsetup_note_standby_guard(cfg, sysid, at, ctx);
		else if (obx_pgsetup_record_marker(c, cfg, nm, PQgetvalue(res, 0, 0), sysid, at, true) == 0) {
			obx_log_info("slot %s has no record on publication %s (made outside outboxd?): "
			             "recorded it at %s",
			    cfg->slot, cfg->publication, at);
			*born = confirmed;
		} else {
			obx_pgsetup_keep_guard_slot(c, cfg, ctx);
		}
	}
	PQclear(res);
}
