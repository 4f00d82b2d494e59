/*
 * progress.c - the progress record of exactly-once mode (pure); see
 * progress.h.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "obx/err.h"
#include "obx/event.h"
#include "obx/progress.h"

char *
obx_progress_encode(const struct obx_progress *p, const char *slot, const char *txn_id)
{
	char lsn[OBX_LSN_STRLEN], end[OBX_LSN_STRLEN], ts[40] = "";
	json_t *o;
	char *s;

	if (p->commit_time != 0)
		obx_format_pg_time(p->commit_time, ts, sizeof(ts));
	o = json_pack("{s:s, s:s, s:I, s:s, s:I, s:s, s:s?, s:I}", "slot", slot, "transactional_id", txn_id,
	    "timeline", (json_int_t)p->timeline,
	    "lsn", obx_lsn_format(p->mark.lsn, lsn, sizeof(lsn)), "seq", (json_int_t)p->mark.seq,
	    "end_lsn", obx_lsn_format(p->end_lsn, end, sizeof(end)), "commit_time",
	    ts[0] != '\0' ? ts : NULL, "records", (json_int_t)p->records);
	if (o == NULL)
		return NULL;
	s = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	return s;
}

int
obx_progress_parse(const void *value, size_t len, const char *slot, struct obx_progress *out,
    char *why, size_t whylen)
{
	const char *s = NULL, *lsn = NULL, *end = NULL;
	json_int_t seq = -1, records = 0, timeline = 0;
	json_error_t jerr;
	json_t *o;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	o = value != NULL ? json_loadb(value, len, 0, &jerr) : NULL;
	if (o == NULL) {
		snprintf(why, whylen, "not JSON");
		return OBX_EINVAL;
	}
	if (json_unpack(o, "{s:s, s:s, s:I, s?s, s?I, s?I}", "slot", &s, "lsn", &lsn, "seq", &seq,
	    "end_lsn", &end, "records", &records, "timeline", &timeline) != 0) {
		snprintf(why, whylen, "no slot, lsn or seq");
		rc = OBX_EINVAL;
	} else if (strcmp(s, slot) != 0) {
		rc = OBX_ENOENT;
	} else if (obx_lsn_parse(lsn, &out->mark.lsn) != 0 || seq < 0 || seq > UINT32_MAX ||
	    (end != NULL && obx_lsn_parse(end, &out->end_lsn) != 0)) {
		snprintf(why, whylen, "lsn, seq or end_lsn out of form");
		rc = OBX_EINVAL;
	} else {
		out->mark.seq = (uint32_t)seq;
		out->records = (uint64_t)records;
		out->timeline = timeline > 0 && timeline <= UINT32_MAX ? (uint32_t)timeline : 0;
	}
	json_decref(o);
	return rc;
}
