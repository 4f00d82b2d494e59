/*
 * core/eos_progress.c - the progress record of exactly-once mode (pure); see
 * core/eos_progress.h.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "obx/core/err.h"
#include "obx/core/event.h"
#include "obx/core/eos_progress.h"
#include "obx/core/tables.h"

void
obx_progress_events(struct obx_progress_source *src, const char *schema, const char *table, bool messages,
    const char *prefix)
{
	snprintf(src->events, sizeof(src->events), "%s.%s%s%s", schema, table, messages ? "+messages:" : "",
	    messages ? prefix : "");
}

void
obx_progress_source_init(struct obx_progress_source *src, const char *system_id, const char *database,
    uint32_t timeline, obx_lsn slot_created, const struct obx_config *cfg)
{
	*src = (struct obx_progress_source){ .timeline = timeline, .slot_created = slot_created };
	strlcpy(src->system_id, system_id, sizeof(src->system_id));
	strlcpy(src->database, database, sizeof(src->database));
	obx_progress_events(src, cfg->table_schema, cfg->table_name, cfg->messages, cfg->message_prefix);
	if (obx_tables_several(cfg)) {
		/* several tables: the list as configured counts the events; one too long for the
		 * record is named by its length and a 64-bit FNV-1a hash of it, never cut */
		size_t cap = cfg->n_tables * 300 + 16;
		char *list = malloc(cap);
		uint64_t h = 14695981039346656037ULL;

		if (list != NULL && obx_tables_format(cfg, list, cap) == 0) {
			if (strlen(list) + 64 < sizeof(src->events)) {
				strlcpy(src->events, list, sizeof(src->events));
			} else {
				for (const char *p = list; *p != '\0'; p++)
					h = (h ^ (unsigned char)*p) * 1099511628211ULL;
				snprintf(src->events, sizeof(src->events), "tables(%zu)#%016" PRIx64,
				    cfg->n_tables, h);
			}
			if (cfg->messages) {
				strlcat(src->events, "+messages:", sizeof(src->events));
				strlcat(src->events, cfg->message_prefix, sizeof(src->events));
			}
		}
		free(list);
	}
}

char *
obx_progress_encode(const struct obx_progress *p, const char *slot, const char *txn_id)
{
	char lsn[OBX_LSN_STRLEN], end[OBX_LSN_STRLEN], born[OBX_LSN_STRLEN], ts[40] = "";
	json_t *o;
	char *s;

	if (p->commit_time != 0)
		obx_format_pg_time(p->commit_time, ts, sizeof(ts));
	o = json_pack("{s:s, s:s, s:I, s:s, s:I, s:I, s:s, s:s?, s:I}", "slot", slot, "transactional_id", txn_id,
	    "timeline", (json_int_t)p->src.timeline, "lsn", obx_lsn_format(p->mark.lsn, lsn, sizeof(lsn)), "seq",
	    (json_int_t)p->mark.seq, "lsn_commit_time", (json_int_t)p->mark_commit_time, "end_lsn",
	    obx_lsn_format(p->end_lsn, end, sizeof(end)), "commit_time", ts[0] != '\0' ? ts : NULL, "records",
	    (json_int_t)p->records);
	if (o != NULL && p->has_source &&
	    (json_object_set_new(o, "system_id", json_string(p->src.system_id)) != 0 ||
	        json_object_set_new(o, "database", json_string(p->src.database)) != 0 ||
	        json_object_set_new(o, "slot_created",
	            json_string(obx_lsn_format(p->src.slot_created, born, sizeof(born)))) != 0 ||
	        json_object_set_new(o, "events", json_string(p->src.events)) != 0)) {
		json_decref(o);
		return NULL;
	}
	if (o == NULL)
		return NULL;
	s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
	json_decref(o);
	return s;
}

/* The source fields of a record, all of them or none. */
static bool
parse_source(json_t *o, struct obx_progress_source *src)
{
	const char *sys = NULL, *db = NULL, *born = NULL, *events = NULL;

	if (json_unpack(o, "{s:s, s:s, s:s, s:s}", "system_id", &sys, "database", &db, "slot_created", &born,
	        "events", &events) != 0 ||
	    obx_lsn_parse(born, &src->slot_created) != 0)
		return false;
	strlcpy(src->system_id, sys, sizeof(src->system_id));
	strlcpy(src->database, db, sizeof(src->database));
	strlcpy(src->events, events, sizeof(src->events));
	return true;
}

int
obx_progress_parse(const void *value, size_t len, const char *slot, struct obx_progress *out, char *errbuf,
    size_t errlen)
{
	const char *s = NULL, *lsn = NULL, *end = NULL;
	json_int_t seq = -1, records = 0, timeline = 0, mark_time = 0;
	json_error_t jerr;
	json_t *o;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	o = value != NULL ? json_loadb(value, len, 0, &jerr) : NULL;
	if (o == NULL) {
		snprintf(errbuf, errlen, "not JSON");
		return OBX_EINVAL;
	}
	if (json_unpack(o, "{s:s, s:s, s:I, s?s, s?I, s?I, s?I}", "slot", &s, "lsn", &lsn, "seq", &seq, "end_lsn",
	        &end, "records", &records, "timeline", &timeline, "lsn_commit_time", &mark_time) != 0) {
		snprintf(errbuf, errlen, "no slot, lsn or seq");
		rc = OBX_EINVAL;
	} else if (strcmp(s, slot) != 0) {
		rc = OBX_ENOENT;
	} else if (obx_lsn_parse(lsn, &out->mark.lsn) != 0 || seq < 0 || seq > UINT32_MAX ||
	    (end != NULL && obx_lsn_parse(end, &out->end_lsn) != 0)) {
		snprintf(errbuf, errlen, "lsn, seq or end_lsn out of form");
		rc = OBX_EINVAL;
	} else {
		out->mark.seq = (uint32_t)seq;
		out->mark_commit_time = mark_time;
		out->records = (uint64_t)records;
		out->src.timeline = timeline > 0 && timeline <= UINT32_MAX ? (uint32_t)timeline : 0;
		out->has_source = parse_source(o, &out->src);
	}
	json_decref(o);
	return rc;
}

bool
obx_progress_trusted(const struct obx_progress *rec, const struct obx_progress_source *now, obx_lsn server_lsn,
    char *errbuf, size_t errlen)
{
	char a[OBX_LSN_STRLEN], b[OBX_LSN_STRLEN];
	const struct obx_progress_source *was = &rec->src;

	if (!rec->has_source)
		snprintf(errbuf, errlen, "names no source (written by an earlier version)");
	else if (strcmp(was->system_id, now->system_id) != 0)
		snprintf(errbuf, errlen, "was written for system %s, the server is system %s", was->system_id,
		    now->system_id);
	else if (strcmp(was->database, now->database) != 0)
		snprintf(errbuf, errlen,
		    "was written for database %s, this session decodes %s (a transactional.id "
		    "shared by two sources)",
		    was->database, now->database);
	else if (was->timeline != now->timeline)
		/* LSNs of another timeline are not comparable (a point-in-time recovery, a failover) */
		snprintf(errbuf, errlen, "was written on timeline %" PRIu32 ", the server is on timeline %" PRIu32,
		    was->timeline, now->timeline);
	else if (was->slot_created != now->slot_created)
		snprintf(errbuf, errlen,
		    "was written for a slot created at %s, the slot was created at %s (dropped "
		    "and created again)",
		    obx_lsn_format(was->slot_created, a, sizeof(a)),
		    obx_lsn_format(now->slot_created, b, sizeof(b)));
	else if (strcmp(was->events, now->events) != 0)
		/* each at most 200 bytes in the line: a reason, not a dump */
		snprintf(errbuf, errlen, "numbers the events of %.200s, this session those of %.200s", was->events,
		    now->events);
	else if (rec->mark.lsn > server_lsn || rec->end_lsn > server_lsn)
		snprintf(errbuf, errlen,
		    "marks lsn %s, beyond the server's WAL position %s (the server went back: "
		    "a data directory restored from a copy?)",
		    obx_lsn_format(rec->mark.lsn, a, sizeof(a)), obx_lsn_format(server_lsn, b, sizeof(b)));
	else if (rec->mark_commit_time == 0)
		snprintf(errbuf, errlen, "has no commit time to check its mark with");
	else
		return true;
	return false;
}

enum obx_progress_fence
obx_progress_fenced(bool connection_ours, const char *txn_id, const char *slot, char *errbuf, size_t errlen)
{
	if (connection_ours) {
		snprintf(errbuf, errlen,
		    "the broker fenced transactional.id %s while this instance still holds "
		    "slot %s (a Kafka transaction outlived transaction.timeout.ms and was aborted); starting a "
		    "new session",
		    txn_id, slot);
		return OBX_PROGRESS_NEW_SESSION;
	}
	snprintf(errbuf, errlen,
	    "fenced: another instance took over transactional.id %s (the broker refuses "
	    "this producer's epoch and the replication connection is gone); stopping without publishing "
	    "anything more",
	    txn_id);
	return OBX_PROGRESS_STOP;
}

bool
obx_progress_taken_over(bool fenced_before, bool slot_in_use, const char *txn_id, const char *slot, char *errbuf,
    size_t errlen)
{
	if (!fenced_before || !slot_in_use)
		return false;
	snprintf(errbuf, errlen,
	    "fenced: another instance took over transactional.id %s (the broker refuses "
	    "this producer's epoch and slot %s is in use by another instance); stopping without "
	    "publishing anything more",
	    txn_id, slot);
	return true;
}

int32_t
obx_progress_partition(const char *txn_id, int32_t nparts)
{
	return nparts > 0 ? obx_dd_partition(txn_id, strlen(txn_id), nparts) : -1;
}

enum obx_progress_floor
obx_progress_floor(const struct obx_config *cfg, const char *txn_id, const struct obx_progress_source *now,
    obx_lsn server_lsn, bool slot_made, int read_rc, const char *read_why, const struct obx_progress *rec,
    char *line, size_t linelen)
{
	char a[OBX_LSN_STRLEN], errbuf[768];

	if (slot_made) {
		/* a slot made now streams only what commits from now on: no progress can apply */
		snprintf(line, linelen, "exactly-once: transactional.id %s; a new slot, nothing to skip", txn_id);
		return OBX_PROGRESS_FLOOR_NEW_SLOT;
	}
	if (read_rc < 0) {
		snprintf(line, linelen, "could not read the progress of slot %s from %s: %s", cfg->slot,
		    cfg->progress_topic, read_why);
		return OBX_PROGRESS_FLOOR_UNREADABLE;
	}
	if (read_rc == 0) {
		snprintf(line, linelen, "exactly-once: transactional.id %s; no progress record of it in %s yet",
		    txn_id, cfg->progress_topic);
		return OBX_PROGRESS_FLOOR_NONE;
	}
	if (!obx_progress_trusted(rec, now, server_lsn, errbuf, sizeof(errbuf))) {
		snprintf(line, linelen,
		    "exactly-once: the last progress record of transactional.id %s %s: not "
		    "skipping anything this session (events may be published again)",
		    txn_id, errbuf);
		return OBX_PROGRESS_FLOOR_UNTRUSTED;
	}
	snprintf(line, linelen,
	    "exactly-once: transactional.id %s; the last committed Kafka transaction ends "
	    "at event lsn %s seq %" PRIu32 ": replayed events up to it are not sent again once the replay "
	    "meets that transaction",
	    txn_id, obx_lsn_format(rec->mark.lsn, a, sizeof(a)), rec->mark.seq);
	return OBX_PROGRESS_FLOOR_TRUSTED;
}
