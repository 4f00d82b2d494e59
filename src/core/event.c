#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obx/core/err.h"
#include "obx/core/event.h"
#include "obx/core/tables.h"
#include "obx/core/walmsg.h"

#define BYTEA_OID 17
#define INT8_OID 20
#define TIMESTAMP_OID 1114
#define TIMESTAMPTZ_OID 1184

const char *const obx_reserved_headers[] = { "id", "type", "lsn", "seq", "xid", "commit_ts", "txn", "snapshot",
	NULL };

bool
obx_header_is_reserved(const char *name)
{
	for (size_t i = 0; obx_reserved_headers[i] != NULL; i++)
		if (strcmp(name, obx_reserved_headers[i]) == 0)
			return true;
	return false;
}

static int
dbuf_reserve(struct obx_dbuf *d, size_t need)
{
	char *p;
	size_t cap;

	if (need <= d->cap)
		return 0;
	cap = d->cap ? d->cap : 64;
	while (cap < need)
		cap *= 2;
	p = realloc(d->p, cap);
	if (p == NULL)
		return OBX_ENOMEM;
	d->p = p;
	d->cap = cap;
	return 0;
}

static int
dbuf_append(struct obx_dbuf *d, const void *data, size_t len)
{
	if (dbuf_reserve(d, d->len + len + 1) != 0)
		return OBX_ENOMEM;
	memcpy(d->p + d->len, data, len);
	d->len += len;
	d->p[d->len] = '\0';
	return 0;
}

static void
dbuf_free(struct obx_dbuf *d)
{
	free(d->p);
	memset(d, 0, sizeof(*d));
}

int
obx_event_builder_init(struct obx_event_builder *b, const struct obx_config *cfg)
{
	size_t max_extra = 0, max_parts = 1;
	char errbuf[256];
	int r;

	memset(b, 0, sizeof(*b));
	b->base = cfg;
	b->table_header = obx_tables_several(cfg);
	b->nmaps = cfg->n_overrides + 1;
	if ((b->maps = calloc(b->nmaps, sizeof(*b->maps))) == NULL)
		return OBX_ENOMEM;
	for (size_t i = 0; i < b->nmaps; i++) {
		struct obx_event_map *m = &b->maps[i];

		obx_tables_view(cfg, (int)i, cfg->table_schema, cfg->table_name, &m->view);
		if ((r = obx_template_parse(&m->tpl, m->view.topic, errbuf, sizeof(errbuf))) != 0)
			return r;
		if (m->tpl.nparts > max_parts)
			max_parts = m->tpl.nparts;
		if (m->view.n_extra_headers > max_extra)
			max_extra = m->view.n_extra_headers;
	}
	b->cfg = &b->maps[0].view;
	b->tpl = &b->maps[0].tpl;
	b->i_tpl = calloc(max_parts, sizeof(int));
	b->i_extra = calloc(max_extra ? max_extra : 1, sizeof(int));
	b->header_cap = 7 + max_extra + 16;
	b->headers = calloc(b->header_cap, sizeof(*b->headers));
	if (b->i_tpl == NULL || b->i_extra == NULL || b->headers == NULL)
		return OBX_ENOMEM;
	return 0;
}

static void
clear_dumps(struct obx_event_builder *b)
{
	for (size_t i = 0; i < b->n_dumps; i++)
		free(b->hdr_dumps[i]);
	b->n_dumps = 0;
	json_decref(b->hdr_json);
	b->hdr_json = NULL;
}

void
obx_event_builder_forget(struct obx_event_builder *b)
{
	b->rel = NULL;
	b->rel_version = 0;
}

void
obx_event_builder_reset(struct obx_event_builder *b)
{
	for (size_t i = 0; b->maps != NULL && i < b->nmaps; i++)
		obx_template_reset(&b->maps[i].tpl);
	free(b->maps);
	free(b->i_tpl);
	free(b->i_extra);
	free(b->headers);
	clear_dumps(b);
	free(b->hdr_dumps);
	dbuf_free(&b->topic);
	dbuf_free(&b->id);
	dbuf_free(&b->value);
	memset(b, 0, sizeof(*b));
}

bool
obx_event_is_outbox(const struct obx_event_builder *b, const struct obx_rel *rel)
{
	return obx_tables_mapping(b->base, rel->nspname, rel->relname) >= 0;
}

static int
col_or_none(const struct obx_rel *rel, const char *name)
{
	return name[0] == '\0' ? -2 : obx_rel_column(rel, name);
}

static void
resolve(struct obx_event_builder *b, const struct obx_rel *rel)
{
	const struct obx_config *c;
	int map;

	if (b->rel == rel && b->rel_version == rel->version)
		return;
	b->rel = rel;
	b->rel_version = rel->version;
	/* a row the caller builds is an outbox row: one no entry matches (a snapshot's) takes [outbox] */
	map = rel->message ? 0 : obx_tables_mapping(b->base, rel->nspname, rel->relname); /* a message: [outbox] */
	c = b->cfg = &b->maps[map > 0 ? map : 0].view;
	b->tpl = &b->maps[map > 0 ? map : 0].tpl;
	snprintf(b->table, sizeof(b->table), "%s.%s", rel->nspname, rel->relname);
	b->i_id = obx_rel_column(rel, c->col_id);
	b->i_key = obx_rel_column(rel, c->col_key);
	b->i_type = obx_rel_column(rel, c->col_type);
	b->i_payload = obx_rel_column(rel, c->col_payload);
	b->i_headers = col_or_none(rel, c->col_headers);
	b->i_timestamp = col_or_none(rel, c->col_timestamp);
	for (size_t i = 0; i < b->tpl->nparts; i++)
		b->i_tpl[i] = b->tpl->parts[i].is_column ? obx_rel_column(rel, b->tpl->parts[i].text) : -2;
	for (size_t i = 0; i < c->n_extra_headers; i++)
		b->i_extra[i] = obx_rel_column(rel, c->extra_headers[i].value);
}

/* Fetches column i of the tuple; returns 0, or OBX_EINVAL with errbuf filled. */
static int
datum(const struct obx_pg_tuple *t, int i, const char *colname, const char *role, const struct obx_pg_datum **out,
    char *errbuf, size_t errlen)
{
	if (i < 0) {
		snprintf(errbuf, errlen, "column '%s' (%s) is missing from the outbox table", colname, role);
		return OBX_EINVAL;
	}
	if ((size_t)i >= t->ncols) {
		snprintf(errbuf, errlen, "column '%s' (%s) is not in the row (%u columns)", colname, role,
		    t->ncols);
		return OBX_EINVAL;
	}
	if (t->cols[i].kind == 'u') {
		snprintf(errbuf, errlen, "column '%s' (%s) arrived as an unchanged TOAST value", colname, role);
		return OBX_EINVAL;
	}
	*out = &t->cols[i];
	return 0;
}

static bool
valid_topic(const char *t, size_t len)
{
	if (len == 0 || len > 249 || strcmp(t, ".") == 0 || strcmp(t, "..") == 0)
		return false;
	for (size_t i = 0; i < len; i++)
		if (!isalnum((unsigned char)t[i]) && t[i] != '.' && t[i] != '_' && t[i] != '-')
			return false;
	return true;
}

static int
hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* bytea text output is "\x" followed by hex digits (bytea_output = hex, the default). */
static int
decode_bytea(struct obx_dbuf *out, const uint8_t *s, size_t len)
{
	out->len = 0;
	if (dbuf_reserve(out, len / 2 + 1) != 0)
		return OBX_ENOMEM;
	if (len < 2 || s[0] != '\\' || s[1] != 'x' || (len - 2) % 2 != 0)
		return OBX_EINVAL;
	for (size_t i = 2; i < len; i += 2) {
		int hi = hexval(s[i]), lo = hexval(s[i + 1]);

		if (hi < 0 || lo < 0)
			return OBX_EINVAL;
		out->p[out->len++] = (char)(hi << 4 | lo);
	}
	return 0;
}

static struct obx_header *
add_header(struct obx_event_builder *b, size_t *n, const char *name, const void *v, size_t len)
{
	struct obx_header *h;

	if (*n == b->header_cap) {
		h = reallocarray(b->headers, b->header_cap * 2, sizeof(*h));
		if (h == NULL)
			return NULL;
		b->headers = h;
		b->header_cap *= 2;
	}
	h = &b->headers[(*n)++];
	h->name = name;
	h->value = v;
	h->len = len;
	return h;
}

static int
add_json_headers(struct obx_event_builder *b, size_t *n, const struct obx_pg_datum *d, char *errbuf, size_t errlen)
{
	json_error_t jerr;
	const char *k;
	json_t *v;

	if (d->kind == 'n')
		return 0;
	b->hdr_json = json_loadb((const char *)d->data, d->len, 0, &jerr);
	if (b->hdr_json == NULL || !json_is_object(b->hdr_json)) {
		snprintf(errbuf, errlen, "headers column '%s' is not a JSON object", b->cfg->col_headers);
		return OBX_EINVAL;
	}
	json_object_foreach(b->hdr_json, k, v)
	{
		if (obx_header_is_reserved(k) || (b->table_header && strcmp(k, OBX_TABLE_HEADER) == 0)) {
			snprintf(errbuf, errlen,
			    "headers column '%s' holds header '%.64s', a name outboxd writes "
			    "itself (reserved: " OBX_RESERVED_HEADERS "%s)",
			    b->cfg->col_headers, k, b->table_header ? ", " OBX_TABLE_HEADER : "");
			return OBX_EINVAL;
		}
		if (json_is_string(v)) {
			if (add_header(b, n, k, json_string_value(v), json_string_length(v)) == NULL)
				return OBX_ENOMEM;
		} else if (json_is_null(v)) {
			if (add_header(b, n, k, NULL, 0) == NULL)
				return OBX_ENOMEM;
		} else {
			char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
			char **grown;

			if (s == NULL)
				return OBX_ENOMEM;
			grown = reallocarray(b->hdr_dumps, b->n_dumps + 1, sizeof(*grown));
			if (grown == NULL) {
				free(s);
				return OBX_ENOMEM;
			}
			b->hdr_dumps = grown;
			b->hdr_dumps[b->n_dumps++] = s;
			if (add_header(b, n, k, s, strlen(s)) == NULL)
				return OBX_ENOMEM;
		}
	}
	return 0;
}

void
obx_format_pg_time(int64_t pg_us, char *buf, size_t len)
{
	int64_t unix_us = pg_us + OBX_PG_EPOCH_OFFSET_US;
	time_t secs = (time_t)(unix_us / 1000000);
	long frac = (long)(unix_us % 1000000);
	struct tm tm;

	if (frac < 0) {
		frac += 1000000;
		secs--;
	}
	char tmp[96];

	gmtime_r(&secs, &tm);
	snprintf(tmp, sizeof(tmp), "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", tm.tm_year + 1900, tm.tm_mon + 1,
	    tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, frac);
	strlcpy(buf, tmp, len);
}

static int
digits(const char *s, size_t len, size_t *pos, int n, int *out)
{
	int v = 0;

	for (int i = 0; i < n; i++, (*pos)++) {
		if (*pos >= len || !isdigit((unsigned char)s[*pos]))
			return OBX_EINVAL;
		v = v * 10 + (s[*pos] - '0');
	}
	*out = v;
	return 0;
}

int
obx_parse_pg_timestamp(const char *s, size_t len, int64_t *out_ms)
{
	struct tm tm = { 0 };
	size_t p = 0;
	int y, mo, d, h, mi, sec, ms = 0, offh = 0, offm = 0, offs = 0, sign = 1;
	time_t t;

	if (digits(s, len, &p, 4, &y) || p >= len || s[p++] != '-' || digits(s, len, &p, 2, &mo) || p >= len ||
	    s[p++] != '-' || digits(s, len, &p, 2, &d) || p >= len || (s[p] != ' ' && s[p] != 'T') ||
	    (p++, digits(s, len, &p, 2, &h)) || p >= len || s[p++] != ':' || digits(s, len, &p, 2, &mi) ||
	    p >= len || s[p++] != ':' || digits(s, len, &p, 2, &sec))
		return OBX_EINVAL;
	if (p < len && s[p] == '.') {
		int scale = 100;

		for (p++; p < len && isdigit((unsigned char)s[p]); p++, scale /= 10)
			ms += (s[p] - '0') * scale;
	}
	if (p < len && (s[p] == '+' || s[p] == '-')) {
		sign = s[p++] == '-' ? -1 : 1;
		if (digits(s, len, &p, 2, &offh))
			return OBX_EINVAL;
		if (p < len && s[p] == ':' && (p++, digits(s, len, &p, 2, &offm)))
			return OBX_EINVAL;
		if (p < len && s[p] == ':' && (p++, digits(s, len, &p, 2, &offs)))
			return OBX_EINVAL;
	} else if (p < len && s[p] == 'Z') {
		p++;
	}
	if (p != len)
		return OBX_EINVAL;
	tm.tm_year = y - 1900;
	tm.tm_mon = mo - 1;
	tm.tm_mday = d;
	tm.tm_hour = h;
	tm.tm_min = mi;
	tm.tm_sec = sec;
	t = timegm(&tm);
	t -= sign * (offh * 3600 + offm * 60 + offs);
	*out_ms = (int64_t)t * 1000 + ms;
	return 0;
}

int
obx_event_build(struct obx_event_builder *b, const struct obx_rel *rel, const struct obx_pg_tuple *t,
    const struct obx_txninfo *txn, uint32_t seq, struct obx_event *out, char *errbuf, size_t errlen)
{
	const struct obx_config *c;
	const struct obx_pg_datum *d_id, *d_key, *d_type, *d_payload, *d;
	size_t nh = 0;
	int rc;

	clear_dumps(b);
	resolve(b, rel);
	c = b->cfg; /* the mapping of rel's table: resolve() chose it */
	if ((rc = datum(t, b->i_id, c->col_id, "id", &d_id, errbuf, errlen)) != 0 ||
	    (rc = datum(t, b->i_key, c->col_key, "key", &d_key, errbuf, errlen)) != 0 ||
	    (rc = datum(t, b->i_type, c->col_type, "type", &d_type, errbuf, errlen)) != 0 ||
	    (rc = datum(t, b->i_payload, c->col_payload, "payload", &d_payload, errbuf, errlen)) != 0)
		return rc;
	if (d_id->kind == 'n') {
		snprintf(errbuf, errlen, "id column '%s' is NULL", c->col_id);
		return OBX_EINVAL;
	}
	if (d_key->kind == 'n') {
		snprintf(errbuf, errlen, "key column '%s' is NULL", c->col_key);
		return OBX_EINVAL;
	}
	b->id.len = 0;
	if (dbuf_append(&b->id, d_id->data, d_id->len) != 0)
		return OBX_ENOMEM;
	out->id = b->id.p;

	/* topic */
	b->topic.len = 0;
	if (dbuf_reserve(&b->topic, 1) != 0)
		return OBX_ENOMEM;
	b->topic.p[0] = '\0';
	for (size_t i = 0; i < b->tpl->nparts; i++) {
		const struct obx_template_part *part = &b->tpl->parts[i];

		if (!part->is_column) {
			rc = dbuf_append(&b->topic, part->text, strlen(part->text));
		} else {
			if ((rc = datum(t, b->i_tpl[i], part->text, "topic template", &d, errbuf, errlen)) != 0)
				return rc;
			if (d->kind == 'n') {
				snprintf(errbuf, errlen, "topic column '%s' is NULL", part->text);
				return OBX_EINVAL;
			}
			rc = dbuf_append(&b->topic, d->data, d->len);
		}
		if (rc != 0)
			return rc;
	}
	if (!valid_topic(b->topic.p, b->topic.len)) {
		snprintf(errbuf, errlen, "topic '%.*s' from template '%s' is not a valid Kafka topic name",
		    (int)(b->topic.len > 300 ? 300 : b->topic.len), b->topic.p, c->topic);
		return OBX_EINVAL;
	}
	out->topic = b->topic.p;
	out->key = d_key->data;
	out->keylen = d_key->len;

	/* value: the payload text exactly as sent; bytea as its raw bytes */
	if (d_payload->kind == 'n') {
		out->value = NULL;
		out->len = 0;
	} else if (rel->cols[b->i_payload].type_oid == BYTEA_OID) {
		rc = decode_bytea(&b->value, d_payload->data, d_payload->len);
		if (rc == OBX_EINVAL)
			snprintf(errbuf, errlen, "payload column '%s': bytea not in hex output format",
			    c->col_payload);
		if (rc != 0)
			return rc;
		out->value = b->value.p;
		out->len = b->value.len;
	} else {
		out->value = d_payload->data;
		out->len = d_payload->len;
	}

	/* timestamp: the configured column, else the commit time */
	out->timestamp_ms = (txn->commit_time + OBX_PG_EPOCH_OFFSET_US) / 1000;
	if (b->i_timestamp != -2) {
		if ((rc = datum(t, b->i_timestamp, c->col_timestamp, "timestamp", &d, errbuf, errlen)) != 0)
			return rc;
		if (d->kind != 'n') {
			uint32_t oid = rel->cols[b->i_timestamp].type_oid;
			char num[32];

			if (oid == INT8_OID && d->len < sizeof(num)) {
				memcpy(num, d->data, d->len);
				num[d->len] = '\0';
				const char *bad = NULL;

				out->timestamp_ms = strtonum(num, INT64_MIN, INT64_MAX, &bad);
				if (bad != NULL) {
					snprintf(errbuf, errlen, "timestamp column '%s': '%s' is not an integer",
					    c->col_timestamp, num);
					return OBX_EINVAL;
				}
			} else if (obx_parse_pg_timestamp((const char *)d->data, d->len, &out->timestamp_ms) !=
			    0) {
				snprintf(errbuf, errlen, "timestamp column '%s': '%.*s' is not an ISO timestamp",
				    c->col_timestamp, (int)(d->len > 64 ? 64 : d->len), (const char *)d->data);
				return OBX_EINVAL;
			}
		}
	}

	/* headers */
	snprintf(b->seq, sizeof(b->seq), "%" PRIu32, seq);
	if (!b->txn_fmt_valid || b->txn_fmt.commit_lsn != txn->commit_lsn || b->txn_fmt.xid != txn->xid ||
	    b->txn_fmt.commit_time != txn->commit_time) {
		/* the transaction's headers are formatted once for all its events */
		snprintf(b->xid, sizeof(b->xid), "%" PRIu32, txn->xid);
		obx_lsn_format(txn->commit_lsn, b->lsn, sizeof(b->lsn));
		obx_format_pg_time(txn->commit_time, b->commit_ts, sizeof(b->commit_ts));
		b->txn_fmt = *txn;
		b->txn_fmt_valid = true;
	}
	if (add_header(b, &nh, "id", d_id->data, d_id->len) == NULL ||
	    add_header(b, &nh, "type", d_type->kind == 'n' ? NULL : d_type->data, d_type->len) == NULL ||
	    add_header(b, &nh, "lsn", b->lsn, strlen(b->lsn)) == NULL ||
	    add_header(b, &nh, "seq", b->seq, strlen(b->seq)) == NULL ||
	    add_header(b, &nh, "xid", b->xid, strlen(b->xid)) == NULL ||
	    add_header(b, &nh, "commit_ts", b->commit_ts, strlen(b->commit_ts)) == NULL)
		return OBX_ENOMEM;
	if (b->table_header && !rel->message &&
	    add_header(b, &nh, OBX_TABLE_HEADER, b->table, strlen(b->table)) == NULL)
		return OBX_ENOMEM;
	for (size_t i = 0; i < c->n_extra_headers; i++) {
		if ((rc = datum(t, b->i_extra[i], c->extra_headers[i].value, "header", &d, errbuf, errlen)) != 0)
			return rc;
		if (add_header(b, &nh, c->extra_headers[i].key, d->kind == 'n' ? NULL : d->data, d->len) == NULL)
			return OBX_ENOMEM;
	}
	if (b->i_headers != -2) {
		if ((rc = datum(t, b->i_headers, c->col_headers, "headers", &d, errbuf, errlen)) != 0 ||
		    (rc = add_json_headers(b, &nh, d, errbuf, errlen)) != 0)
			return rc;
	}
	out->headers = b->headers;
	out->nheaders = nh;
	return 0;
}

char *
obx_event_row_json(const struct obx_rel *rel, const struct obx_pg_tuple *t)
{
	json_t *o = json_object();
	char *s;

	if (o == NULL)
		return NULL;
	for (uint16_t i = 0; i < t->ncols && i < rel->natts; i++) {
		const struct obx_pg_datum *d = &t->cols[i];

		json_object_set_new(o, rel->cols[i].name,
		    d->kind == 'n' || d->kind == 'u' ? json_null() : json_stringn((const char *)d->data, d->len));
	}
	s = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	return s;
}
