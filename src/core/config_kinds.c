/*
 * config_kinds.c - what the configuration table (config_table.c) calls for
 * a key beyond its common kind (pure): the checks of single values
 * (conninfo, password, snapshot filter, topic template, headers, [kafka]
 * properties) and the keys with functions of their own ([source] table,
 * [metrics] listen).  config_kinds.h declares them.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/config_kinds.h"
#include "obx/core/config_table.h"
#include "obx/core/err.h"
#include "obx/core/event.h"
#include "obx/core/template.h"

#define NAMEDATALEN_MAX 64 /* PostgreSQL identifiers: at most 63 bytes */

static int
replace_str(char **dst, const char *src)
{
	char *copy = strdup(src);

	if (copy == NULL)
		return OBX_ENOMEM;
	free(*dst);
	*dst = copy;
	return 0;
}

/* ---- checks of single values ------------------------------------------ */

int
obx_cfg_check_conninfo(const struct obx_config *cfg, const char *sub, const char *value, char *errbuf,
    size_t errlen)
{
	(void)sub;
	if (cfg->checks != NULL && cfg->checks->conninfo != NULL && cfg->checks->conninfo(value) != 0) {
		snprintf(errbuf, errlen,
		    "not a valid libpq connection string or URI (value not shown, it "
		    "may hold a password)");
		return OBX_ECONFIG;
	}
	return 0;
}

int
obx_cfg_check_password(const struct obx_config *cfg, const char *sub, const char *value, char *errbuf,
    size_t errlen)
{
	(void)cfg;
	(void)sub;
	/* a secret: usually OUTBOXD_SOURCE_PASSWORD_FILE names a mounted file holding it */
	if (strpbrk(value, "\r\n") != NULL) {
		snprintf(errbuf, errlen, "holds a line break (value not shown)");
		return OBX_ECONFIG;
	}
	return 0;
}

int
obx_cfg_check_snapshot_filter(const struct obx_config *cfg, const char *sub, const char *value, char *errbuf,
    size_t errlen)
{
	(void)cfg;
	(void)sub;
	/* one condition inside the snapshot's read-only transaction: a ';' would end the statement
	 * (snapshot.c also sends it as a single statement, which the server holds to) */
	if (strchr(value, ';') != NULL) {
		snprintf(errbuf, errlen,
		    "must be one SQL condition, without ';' (write chr(59) for the "
		    "character)");
		return OBX_ECONFIG;
	}
	return 0;
}

/* A topic must be a template the event builder can fill: text with ${column} references. */
int
obx_cfg_check_topic(const struct obx_config *cfg, const char *sub, const char *value, char *errbuf, size_t errlen)
{
	struct obx_template t;
	int r;

	(void)cfg;
	(void)sub;
	r = obx_template_parse(&t, value, errbuf, errlen);
	obx_template_reset(&t);
	if (r == 0 && value[0] == '\0') {
		snprintf(errbuf, errlen, "must not be empty");
		r = OBX_EINVAL;
	}
	return r == 0 || r == OBX_ENOMEM ? r : OBX_ECONFIG;
}

/* [outbox] header.<sub> = column */
int
obx_cfg_check_header(const struct obx_config *cfg, const char *sub, const char *value, char *errbuf, size_t errlen)
{
	(void)cfg;
	if (sub[0] == '\0' || value[0] == '\0') {
		snprintf(errbuf, errlen, "expected header.<name> = <column>, e.g. header.eventType = type");
		return OBX_ECONFIG;
	}
	if (obx_header_is_reserved(sub)) {
		snprintf(errbuf, errlen,
		    "header '%s' is reserved: outboxd writes it itself (reserved: " OBX_RESERVED_HEADERS
		    "); choose another name",
		    sub);
		return OBX_ECONFIG;
	}
	return 0;
}

/* [kafka] property = value: the relay's guarantees first, then librdkafka's judgement. */
int
obx_cfg_check_kafka(const struct obx_config *cfg, const char *key, const char *value, char *errbuf, size_t errlen)
{
	char reason[512];
	bool b;
	int r;

	/* Guarantees the relay depends on: a user may tune, not weaken them. */
	if (strcmp(key, "enable.idempotence") == 0 && (obx_parse_bool(value, &b) != 0 || !b)) {
		snprintf(errbuf, errlen,
		    "must stay true: without idempotence retries can reorder or duplicate events");
		return OBX_ECONFIG;
	}
	if ((strcmp(key, "acks") == 0 || strcmp(key, "request.required.acks") == 0) && strcmp(value, "all") != 0 &&
	    strcmp(value, "-1") != 0) {
		snprintf(errbuf, errlen, "must stay 'all': an event acknowledged by fewer replicas can be lost");
		return OBX_ECONFIG;
	}
	if (strcmp(key, "partitioner") == 0 && strcmp(value, "random") == 0) {
		snprintf(errbuf, errlen,
		    "must not be 'random': it spreads one aggregate's events over "
		    "partitions and breaks their order (keyed partitioners such as murmur2_random keep it)");
		return OBX_ECONFIG;
	}
	if (strcmp(key, "delivery.report.only.error") == 0 && (obx_parse_bool(value, &b) != 0 || b)) {
		snprintf(errbuf, errlen,
		    "must stay false: outboxd confirms the slot only on delivery reports of success");
		return OBX_ECONFIG;
	}
	if (strcmp(key, "transactional.id") == 0) {
		snprintf(errbuf, errlen,
		    "is set by outboxd: use [delivery] exactly_once = on, and "
		    "[delivery] transactional_id to choose the id");
		return OBX_ECONFIG;
	}

	/* Let librdkafka judge the property; it knows every name and range. */
	r = cfg->checks != NULL && cfg->checks->kafka_property != NULL ?
	    cfg->checks->kafka_property(key, value, reason, sizeof(reason)) :
	    0;
	if (r == 0 || r == OBX_ENOMEM)
		return r;
	if (r == OBX_ENOENT)
		snprintf(errbuf, errlen, "unknown librdkafka property");
	else if (obx_kafka_prop_is_secret(key))
		snprintf(errbuf, errlen, "invalid value (not shown: secret)");
	else
		snprintf(errbuf, errlen, "%s", reason);
	return OBX_ECONFIG;
}

/* ---- [source] table: "schema.table, ...", a part double-quoted or a '*' pattern ---- */

void
obx_table_pat_reset(struct obx_table_pat *p)
{
	free(p->schema);
	free(p->name);
	memset(p, 0, sizeof(*p));
}

/*
 * Reads one [schema.]table from *sp up to a ',' outside quotes or the end,
 * as the server reads the same identifiers (Outbox is outbox, "Outbox" is
 * Outbox); an unquoted '*' makes its part a pattern.  Leaves *sp after the
 * entry (on the ',' or the NUL).  Returns 0, OBX_EINVAL, OBX_ERANGE (a
 * part longer than PostgreSQL's names) or OBX_ENOMEM.
 */
static int
parse_table_entry(const char **sp, struct obx_table_pat *out)
{
	char part[2][NAMEDATALEN_MAX];
	bool wild[2] = { false, false };
	int n = 0;
	size_t len = 0;
	bool quoted = false;
	const char *p = *sp;

	while (*p == ' ' || *p == '\t')
		p++;
	part[0][0] = part[1][0] = '\0';
	for (;; p++) {
		if (quoted) {
			if (*p == '\0')
				return OBX_EINVAL;
			if (*p == '"') {
				if (p[1] == '"') {
					p++;
				} else {
					quoted = false;
					/* a quoted name ends the part, as the server reads it ("a"b is an error) */
					if (p[1] != '.' && p[1] != ',' && p[1] != ' ' && p[1] != '\t' &&
					    p[1] != '\0')
						return OBX_EINVAL;
					continue;
				}
			}
		} else if (*p == '"') {
			if (len != 0)
				return OBX_EINVAL; /* a quote inside a name */
			quoted = true;
			continue;
		} else if (*p == ' ' || *p == '\t') {
			const char *q = p;

			while (*q == ' ' || *q == '\t')
				q++;
			if (*q != ',' && *q != '\0')
				return OBX_EINVAL;
			p = q - 1;
			continue;
		} else if (*p == '.' || *p == ',' || *p == '\0') {
			if (len == 0 || n == 2)
				return OBX_EINVAL;
			part[n][len] = '\0';
			n++;
			len = 0;
			if (*p != '.')
				break;
			continue;
		} else if (*p == '*') {
			wild[n < 2 ? n : 1] = true;
		}
		if (n >= 2)
			return OBX_EINVAL;
		if (len + 1 >= NAMEDATALEN_MAX)
			return OBX_ERANGE;
		/* unquoted, the server folds ASCII letters to lower case: so does this */
		part[n][len++] = !quoted && *p >= 'A' && *p <= 'Z' ? (char)(*p - 'A' + 'a') : *p;
	}
	*sp = p;
	out->schema = strdup(n == 1 ? "public" : part[0]);
	out->name = strdup(n == 1 ? part[0] : part[1]);
	out->schema_wild = n == 2 && wild[0];
	out->name_wild = n == 1 ? wild[0] : wild[1];
	if (out->schema == NULL || out->name == NULL)
		return OBX_ENOMEM;
	return 0;
}

int
obx_table_pat_parse(const char *s, struct obx_table_pat *out)
{
	int r;

	memset(out, 0, sizeof(*out));
	r = parse_table_entry(&s, out);
	if (r == 0 && *s != '\0')
		r = OBX_EINVAL;
	if (r != 0)
		obx_table_pat_reset(out);
	return r;
}

static void
tables_free(struct obx_table_pat *t, size_t n)
{
	for (size_t i = 0; i < n; i++)
		obx_table_pat_reset(&t[i]);
	free(t);
}

static int
table_set(struct obx_config *cfg, const char *key, const char *value, const char *origin, char *errbuf,
    size_t errlen)
{
	struct obx_table_pat *t = NULL, *grown;
	size_t n = 0;
	const char *p = value;
	char *schema, *name;
	int r = 0;

	for (;;) {
		if ((grown = reallocarray(t, n + 1, sizeof(*t))) == NULL) {
			r = OBX_ENOMEM;
			break;
		}
		t = grown;
		memset(&t[n], 0, sizeof(t[n]));
		r = parse_table_entry(&p, &t[n]);
		n++;
		if (r != 0 || *p == '\0')
			break;
		p++; /* the ',' */
	}
	for (size_t i = 0; r == 0 && i < n; i++)
		for (size_t j = 0; j < i; j++)
			if (strcmp(t[i].schema, t[j].schema) == 0 && strcmp(t[i].name, t[j].name) == 0 &&
			    t[i].schema_wild == t[j].schema_wild && t[i].name_wild == t[j].name_wild) {
				obx_config_fail(errbuf, errlen, origin, key, "'%s' names %s.%s twice", value,
				    t[i].schema, t[i].name);
				tables_free(t, n);
				return OBX_ECONFIG;
			}
	if (r != 0) {
		tables_free(t, n);
		if (r == OBX_ENOMEM)
			return r;
		obx_config_fail(errbuf, errlen, origin, key,
		    "expected [schema.]table, or several separated by commas ('*' matches any run of "
		    "characters), got '%s'",
		    value);
		return OBX_ECONFIG;
	}
	schema = strdup(t[0].schema);
	name = strdup(t[0].name);
	if (schema == NULL || name == NULL) {
		free(schema);
		free(name);
		tables_free(t, n);
		return OBX_ENOMEM;
	}
	tables_free(cfg->tables, cfg->n_tables);
	free(cfg->table_schema);
	free(cfg->table_name);
	cfg->tables = t;
	cfg->n_tables = n;
	cfg->table_schema = schema;
	cfg->table_name = name;
	return 0;
}

/* Appends identifier id as parse_table_entry() reads it back: quoted unless plain lower case (or a pattern). */
static int
put_ident(char *out, size_t outlen, size_t *used, const char *id, bool wild)
{
	/* a pattern is unquoted by definition (it was read so, folded to lower case) */
	bool plain = wild || (id[0] != '\0' && strspn(id, "abcdefghijklmnopqrstuvwxyz0123456789_$") == strlen(id));

#define PUT(c)                                                                                                    \
	do {                                                                                                      \
		if (*used + 1 >= outlen)                                                                          \
			return OBX_ERANGE;                                                                        \
		out[(*used)++] = (c);                                                                             \
	} while (0)
	if (!plain)
		PUT('"');
	for (const char *p = id; *p != '\0'; p++) {
		if (!plain && *p == '"')
			PUT('"');
		PUT(*p);
	}
	if (!plain)
		PUT('"');
#undef PUT
	out[*used] = '\0';
	return 0;
}

static int
table_format(const struct obx_config *cfg, char *out, size_t outlen)
{
	size_t used = 0;
	int r;

	if (outlen == 0)
		return OBX_ERANGE;
	out[0] = '\0';
	for (size_t i = 0; i < cfg->n_tables; i++) {
		const struct obx_table_pat *t = &cfg->tables[i];

		if (i > 0) {
			if (used + 3 >= outlen)
				return OBX_ERANGE;
			out[used++] = ',';
			out[used++] = ' ';
			out[used] = '\0';
		}
		if ((r = put_ident(out, outlen, &used, t->schema, t->schema_wild)) != 0)
			return r;
		if (used + 2 >= outlen)
			return OBX_ERANGE;
		out[used++] = '.';
		out[used] = '\0';
		if ((r = put_ident(out, outlen, &used, t->name, t->name_wild)) != 0)
			return r;
	}
	return 0;
}

static bool
str_differs(const char *a, const char *b)
{
	return strcmp(a != NULL ? a : "", b != NULL ? b : "") != 0;
}

static bool
table_differs(const struct obx_config *a, const struct obx_config *b)
{
	if (a->n_tables != b->n_tables)
		return true;
	for (size_t i = 0; i < a->n_tables; i++) {
		const struct obx_table_pat *x = &a->tables[i], *y = &b->tables[i];

		if (str_differs(x->schema, y->schema) || str_differs(x->name, y->name) ||
		    x->schema_wild != y->schema_wild || x->name_wild != y->name_wild)
			return true;
	}
	return false;
}

static void
table_reset(struct obx_config *cfg)
{
	tables_free(cfg->tables, cfg->n_tables);
	cfg->tables = NULL;
	cfg->n_tables = 0;
	free(cfg->table_schema);
	free(cfg->table_name);
	cfg->table_schema = cfg->table_name = NULL;
}

const struct obx_cfg_custom obx_cfg_table_fns = { table_set, table_format, table_differs, table_reset };

/* ---- [metrics] listen: host:port --------------------------------------- */

static int
listen_set(struct obx_config *cfg, const char *key, const char *value, const char *origin, char *errbuf,
    size_t errlen)
{
	const char *colon = strrchr(value, ':');
	char host[256];
	long long port;

	if (colon == NULL || colon == value || (size_t)(colon - value) >= sizeof(host) ||
	    obx_parse_int(colon + 1, 0, 65535, &port) != 0) {
		obx_config_fail(errbuf, errlen, origin, key,
		    "expected host:port with a port from 0 to 65535, got '%s'", value);
		return OBX_ECONFIG;
	}
	memcpy(host, value, (size_t)(colon - value));
	host[colon - value] = '\0';
	cfg->metrics_port = (int)port;
	return replace_str(&cfg->metrics_host, host);
}

static int
listen_format(const struct obx_config *cfg, char *out, size_t outlen)
{
	int n = snprintf(out, outlen, "%s:%d", cfg->metrics_host, cfg->metrics_port);

	return n < 0 || (size_t)n >= outlen ? OBX_ERANGE : 0;
}

static bool
listen_differs(const struct obx_config *a, const struct obx_config *b)
{
	return str_differs(a->metrics_host, b->metrics_host) || a->metrics_port != b->metrics_port;
}

static void
listen_reset(struct obx_config *cfg)
{
	free(cfg->metrics_host);
	cfg->metrics_host = NULL;
}

const struct obx_cfg_custom obx_cfg_listen_fns = { listen_set, listen_format, listen_differs, listen_reset };
