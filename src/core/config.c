/*
 * config.c - configuration validation (pure): every value is parsed and
 * checked as it is set, from whatever source config_load.c (the file) or
 * the caller (environment, --set) hands over, so that the unit tests can
 * drive every error path.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/config.h"
#include "obx/core/err.h"
#include "obx/core/event.h"
#include "obx/core/template.h"

#define NAMEDATALEN_MAX 64 /* PostgreSQL identifiers: at most 63 bytes */

void
obx_config_fail(char *errbuf, size_t errlen, const char *origin, const char *key, const char *fmt, ...)
{
	char reason[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	if (key != NULL)
		snprintf(errbuf, errlen, "config %s: key '%s': %s", origin, key, reason);
	else
		snprintf(errbuf, errlen, "config %s: %s", origin, reason);
}

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

/* ---- value parsers ---------------------------------------------------- */

int
obx_parse_bool(const char *s, bool *out)
{
	static const char *const yes[] = { "true", "yes", "on", "1" };
	static const char *const no[] = { "false", "no", "off", "0" };

	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (strcasecmp(s, yes[i]) == 0) {
			*out = true;
			return 0;
		}
		if (strcasecmp(s, no[i]) == 0) {
			*out = false;
			return 0;
		}
	}
	return OBX_EINVAL;
}

/* Splits s into a decimal number and a unit suffix; the number must be there. */
static int
split_number(const char *s, long long *num, const char **unit)
{
	char *end;
	long long v;

	if (!isdigit((unsigned char)s[0]))
		return OBX_EINVAL;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno == ERANGE)
		return OBX_ERANGE;
	while (*end == ' ')
		end++;
	*num = v;
	*unit = end;
	return 0;
}

static int
scale(long long v, long long mult, long long min, long long max, long long *out)
{
	if (v > LLONG_MAX / mult)
		return OBX_ERANGE;
	v *= mult;
	if (v < min || v > max)
		return OBX_ERANGE;
	*out = v;
	return 0;
}

struct unit {
	const char *name;
	long long mult;
};

/* A number with one of units' suffixes, scaled and checked against [min, max]. */
static int
parse_with_unit(const char *s, const struct unit *units, size_t n, long long min, long long max,
    long long *out)
{
	const char *unit;
	long long v;
	int r;

	if ((r = split_number(s, &v, &unit)) != 0)
		return r;
	for (size_t i = 0; i < n; i++)
		if (strcmp(unit, units[i].name) == 0)
			return scale(v, units[i].mult, min, max, out);
	return OBX_EINVAL;
}

int
obx_parse_duration_ms(const char *s, long long min, long long max, long long *out)
{
	static const struct unit units[] = {
		{ "ms", 1 }, { "s", 1000 }, { "min", 60000 }, { "m", 60000 }, { "h", 3600000 },
	};

	return parse_with_unit(s, units, sizeof(units) / sizeof(units[0]), min, max, out);
}

int
obx_parse_size(const char *s, long long min, long long max, long long *out)
{
	static const struct unit units[] = {
		{ "", 1 }, { "B", 1 }, { "k", 1024 }, { "K", 1024 }, { "KiB", 1024 }, { "kB", 1024 },
		{ "M", 1 << 20 }, { "MiB", 1 << 20 }, { "MB", 1 << 20 },
		{ "G", 1 << 30 }, { "GiB", 1 << 30 }, { "GB", 1 << 30 },
	};

	return parse_with_unit(s, units, sizeof(units) / sizeof(units[0]), min, max, out);
}

int
obx_parse_int(const char *s, long long min, long long max, long long *out)
{
	const char *errstr = NULL;
	long long v;

	if (s[0] == '\0')
		return OBX_EINVAL;
	v = strtonum(s, min, max, &errstr);
	if (errstr != NULL)
		return strncmp(errstr, "too ", 4) == 0 ? OBX_ERANGE : OBX_EINVAL;
	*out = v;
	return 0;
}

/* ---- secrets ---------------------------------------------------------- */

bool
obx_kafka_prop_is_secret(const char *key)
{
	/* The properties librdkafka itself marks sensitive (CONFIGURATION.md). */
	static const char *const secret[] = {
		"sasl.username", "sasl.password", "ssl.key.password", "ssl.key.pem",
		"ssl_key", "ssl.keystore.password", "sasl.oauthbearer.config",
		"sasl.oauthbearer.client.secret", "ssl.certificate.pem", "ssl_certificate",
	};

	for (size_t i = 0; i < sizeof(secret) / sizeof(secret[0]); i++)
		if (strcmp(key, secret[i]) == 0)
			return true;
	/* Anything that calls itself a password or secret is treated as one. */
	return strstr(key, "password") != NULL || strstr(key, "secret") != NULL;
}

/* ---- per-section setters ---------------------------------------------- */

static int kv_put(struct obx_kv **kv, size_t *n, const char *key, const char *value,
    const char *origin);

struct str_key {
	const char *name;
	size_t off;
	bool nonempty;
};

#define SK(f, ne) { #f, offsetof(struct obx_config, f), ne }

static int
set_str(struct obx_config *cfg, const struct str_key *k, const char *key, const char *value,
    const char *origin, char *errbuf, size_t errlen)
{
	int r;

	if (k->nonempty && value[0] == '\0') {
		obx_config_fail(errbuf, errlen, origin, key, "must not be empty");
		return OBX_ECONFIG;
	}
	r = replace_str((char **)((char *)cfg + k->off), value);
	if (r != 0)
		obx_config_fail(errbuf, errlen, origin, key, "%s", obx_strerror(r));
	return r;
}

/*
 * Splits "schema.table" (either part may be double-quoted) into its parts,
 * as the server reads the same identifiers: Outbox is outbox, "Outbox" is
 * Outbox.
 */
static int
parse_qualified_name(const char *s, char **schema, char **name)
{
	char part[2][NAMEDATALEN_MAX];
	int n = 0;
	size_t len = 0;
	bool quoted = false;

	part[0][0] = part[1][0] = '\0';
	for (const char *p = s;; p++) {
		if (quoted) {
			if (*p == '\0')
				return OBX_EINVAL;
			if (*p == '"') {
				if (p[1] == '"') {
					p++;
				} else {
					quoted = false;
					continue;
				}
			}
		} else if (*p == '"') {
			quoted = true;
			continue;
		} else if (*p == '.' || *p == '\0') {
			if (len == 0 || n == 2)
				return OBX_EINVAL;
			part[n][len] = '\0';
			n++;
			len = 0;
			if (*p == '\0')
				break;
			continue;
		}
		if (n >= 2)
			return OBX_EINVAL;
		if (len + 1 >= NAMEDATALEN_MAX)
			return OBX_ERANGE;
		/* unquoted, the server folds ASCII letters to lower case: so does this */
		part[n][len++] = !quoted && *p >= 'A' && *p <= 'Z' ? (char)(*p - 'A' + 'a') : *p;
	}
	if (n == 1) {
		*schema = strdup("public");
		*name = strdup(part[0]);
	} else {
		*schema = strdup(part[0]);
		*name = strdup(part[1]);
	}
	if (*schema == NULL || *name == NULL)
		return OBX_ENOMEM;
	return 0;
}

/* ---- polling mode: [source] mode, the [outbox] bookkeeping columns, [poll] ---- */

static int
set_source_mode(struct obx_config *cfg, const char *key, const char *value, const char *origin,
    char *errbuf, size_t errlen)
{
	if (strcmp(value, "logical") == 0)
		cfg->mode = OBX_SOURCE_LOGICAL;
	else if (strcmp(value, "poll") == 0)
		cfg->mode = OBX_SOURCE_POLL;
	else {
		obx_config_fail(errbuf, errlen, origin, key, "expected logical or poll, got '%s'", value);
		return OBX_ECONFIG;
	}
	return 0;
}

/* Returns OBX_ENOENT when key is not one of the polling columns (the caller goes on). */
static int
set_poll_column(struct obx_config *cfg, const char *key, const char *value, const char *origin,
    char *errbuf, size_t errlen)
{
	static const struct str_key cols[] = {
		SK(col_seq, true), SK(col_published_at, true), SK(col_attempts, true),
		SK(col_last_error, true), SK(col_next_attempt_at, true), SK(col_created_at, false),
	};

	for (size_t i = 0; i < sizeof(cols) / sizeof(cols[0]); i++)
		if (strcmp(key, cols[i].name + 4) == 0) /* the key is the field name without "col_" */
			return set_str(cfg, &cols[i], key, value, origin, errbuf, errlen);
	return OBX_ENOENT;
}

static int
set_poll(struct obx_config *cfg, const char *key, const char *value, const char *origin,
    char *errbuf, size_t errlen)
{
	long long v;
	int r;

	if (strcmp(key, "batch") == 0) {
		r = obx_parse_int(value, 1, 100000, &cfg->poll_batch);
		if (r != 0) {
			obx_config_fail(errbuf, errlen, origin, key, r == OBX_ERANGE ?
			    "'%s' is out of range (1 to 100000)" : "expected an integer, got '%s'", value);
			return OBX_ECONFIG;
		}
		return 0;
	}
	if (strcmp(key, "max_attempts") == 0) {
		r = obx_parse_int(value, 1, 1000000, &cfg->poll_max_attempts);
		if (r != 0) {
			obx_config_fail(errbuf, errlen, origin, key, r == OBX_ERANGE ?
			    "'%s' is out of range (1 to 1000000)" : "expected an integer, got '%s'", value);
			return OBX_ECONFIG;
		}
		return 0;
	}
	if (strcmp(key, "poll_interval") == 0 || strcmp(key, "backoff_min") == 0 ||
	    strcmp(key, "backoff_max") == 0) {
		int *dst = key[0] == 'p' ? &cfg->poll_interval_ms :
		    strcmp(key, "backoff_min") == 0 ? &cfg->poll_backoff_min_ms : &cfg->poll_backoff_max_ms;

		r = obx_parse_duration_ms(value, 1, 24LL * 3600 * 1000, &v);
		if (r != 0) {
			obx_config_fail(errbuf, errlen, origin, key, r == OBX_ERANGE ?
			    "'%s' is out of range (1ms to 24h)" :
			    "expected a duration such as 500ms or 5s, got '%s'", value);
			return OBX_ECONFIG;
		}
		*dst = (int)v;
		return 0;
	}
	if (strcmp(key, "exhausted") == 0) {
		if (strcmp(value, "dead_letter") == 0)
			cfg->poll_exhausted = OBX_POLL_EXHAUSTED_DEAD_LETTER;
		else if (strcmp(value, "mark") == 0)
			cfg->poll_exhausted = OBX_POLL_EXHAUSTED_MARK;
		else {
			obx_config_fail(errbuf, errlen, origin, key,
			    "expected dead_letter or mark, got '%s'", value);
			return OBX_ECONFIG;
		}
		return 0;
	}
	if (strcmp(key, "notify_channel") == 0) {
		static const struct str_key k = SK(poll_notify_channel, false);

		return set_str(cfg, &k, key, value, origin, errbuf, errlen);
	}
	obx_config_fail(errbuf, errlen, origin, key, "unknown key in [poll]");
	return OBX_ECONFIG;
}

static int
set_source(struct obx_config *cfg, const char *key, const char *value, const char *origin,
    char *errbuf, size_t errlen)
{
	static const struct str_key strs[] = {
		SK(slot, true), SK(publication, true), SK(message_prefix, true),
		SK(snapshot_filter, false),
	};
	long long ms;
	int r;

	/* one condition inside the snapshot's read-only transaction: a ';' would end the statement
	 * (snapshot.c also sends it as a single statement, which the server holds to) */
	if (strcmp(key, "snapshot_filter") == 0 && strchr(value, ';') != NULL) {
		obx_config_fail(errbuf, errlen, origin, key, "must be one SQL condition, without ';' "
		    "(write chr(59) for the character)");
		return OBX_ECONFIG;
	}
	for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++)
		if (strcmp(key, strs[i].name) == 0)
			return set_str(cfg, &strs[i], key, value, origin, errbuf, errlen);
	if (strcmp(key, "mode") == 0)
		return set_source_mode(cfg, key, value, origin, errbuf, errlen);
	if (strcmp(key, "password") == 0) {
		/* a secret: usually OUTBOXD_SOURCE_PASSWORD_FILE names a mounted file holding it */
		if (strpbrk(value, "\r\n") != NULL) {
			obx_config_fail(errbuf, errlen, origin, key, "holds a line break (value not shown)");
			return OBX_ECONFIG;
		}
		if (cfg->password != NULL)
			explicit_bzero(cfg->password, strlen(cfg->password));
		return replace_str(&cfg->password, value);
	}
	if (strcmp(key, "conninfo") == 0) {
		if (cfg->checks != NULL && cfg->checks->conninfo != NULL &&
		    cfg->checks->conninfo(value) != 0) {
			obx_config_fail(errbuf, errlen, origin, key,
			    "not a valid libpq connection string or URI (value not shown, it may hold a password)");
			return OBX_ECONFIG;
		}
		return replace_str(&cfg->conninfo, value);
	}
	if (strcmp(key, "table") == 0) {
		char *schema = NULL, *name = NULL;

		r = parse_qualified_name(value, &schema, &name);
		if (r != 0) {
			free(schema);
			free(name);
			obx_config_fail(errbuf, errlen, origin, key,
			    "expected [schema.]table, got '%s'", value);
			return r == OBX_ENOMEM ? r : OBX_ECONFIG;
		}
		free(cfg->table_schema);
		free(cfg->table_name);
		cfg->table_schema = schema;
		cfg->table_name = name;
		return 0;
	}
	if (strcmp(key, "streaming") == 0) {
		if (strcmp(value, "on") == 0 || strcmp(value, "off") == 0) {
			cfg->streaming = value[1] == 'n';
			return 0;
		}
		obx_config_fail(errbuf, errlen, origin, key, "expected on or off, got '%s'", value);
		return OBX_ECONFIG;
	}
	if (strcmp(key, "snapshot") == 0) {
		if (strcmp(value, "pending") == 0 || strcmp(value, "none") == 0) {
			cfg->snapshot = value[0] == 'p';
			return 0;
		}
		obx_config_fail(errbuf, errlen, origin, key, "expected pending or none, got '%s'", value);
		return OBX_ECONFIG;
	}
	if (strcmp(key, "failover") == 0) {
		if (obx_parse_bool(value, &cfg->failover) == 0) {
			cfg->failover_set = true;
			return 0;
		}
		obx_config_fail(errbuf, errlen, origin, key, "expected on or off, got '%s'", value);
		return OBX_ECONFIG;
	}
	if (strcmp(key, "messages") == 0) {
		if (obx_parse_bool(value, &cfg->messages) != 0) {
			obx_config_fail(errbuf, errlen, origin, key, "expected true or false, got '%s'", value);
			return OBX_ECONFIG;
		}
		return 0;
	}
	if (strcmp(key, "stream_buffer") == 0) {
		r = obx_parse_size(value, 1024, 1LL << 40, &cfg->stream_buffer_bytes);
		if (r != 0) {
			obx_config_fail(errbuf, errlen, origin, key, r == OBX_ERANGE ?
			    "'%s' is out of range (1KiB to 1TiB)" :
			    "expected a size such as 64MiB or 65536, got '%s'", value);
			return OBX_ECONFIG;
		}
		return 0;
	}
	if (strcmp(key, "create_slot") == 0 || strcmp(key, "create_publication") == 0) {
		bool *dst = key[7] == 's' ? &cfg->create_slot : &cfg->create_publication;

		if (obx_parse_bool(value, dst) != 0) {
			obx_config_fail(errbuf, errlen, origin, key, "expected true or false, got '%s'", value);
			return OBX_ECONFIG;
		}
		return 0;
	}
	if (strcmp(key, "status_interval") == 0) {
		r = obx_parse_duration_ms(value, 100, 3600000, &ms);
		if (r != 0) {
			obx_config_fail(errbuf, errlen, origin, key, r == OBX_ERANGE ?
			    "'%s' is out of range (100ms to 1h)" :
			    "expected a duration such as 10s or 500ms, got '%s'", value);
			return OBX_ECONFIG;
		}
		cfg->status_interval_ms = (int)ms;
		return 0;
	}
	obx_config_fail(errbuf, errlen, origin, key, "unknown key in [source]");
	return OBX_ECONFIG;
}

/* A topic must be a template the event builder can fill: text with ${column} references. */
static int
check_topic(const char *value, char *why, size_t whylen)
{
	struct obx_template t;
	int r;

	r = obx_template_parse(&t, value, why, whylen);
	obx_template_reset(&t);
	if (r == 0 && value[0] == '\0') {
		snprintf(why, whylen, "must not be empty");
		r = OBX_EINVAL;
	}
	return r;
}

static int
set_outbox(struct obx_config *cfg, const char *key, const char *value, const char *origin,
    char *errbuf, size_t errlen)
{
	static const struct {
		const char *name;
		struct str_key k;
	} cols[] = {
		{ "id", { "id", offsetof(struct obx_config, col_id), true } },
		{ "key", { "key", offsetof(struct obx_config, col_key), true } },
		{ "aggregate_type", { "aggregate_type", offsetof(struct obx_config, col_aggregate_type), true } },
		{ "type", { "type", offsetof(struct obx_config, col_type), true } },
		{ "payload", { "payload", offsetof(struct obx_config, col_payload), true } },
		{ "headers", { "headers", offsetof(struct obx_config, col_headers), false } },
		{ "timestamp", { "timestamp", offsetof(struct obx_config, col_timestamp), false } },
	};
	char why[256];
	int pr;

	for (size_t i = 0; i < sizeof(cols) / sizeof(cols[0]); i++)
		if (strcmp(key, cols[i].name) == 0)
			return set_str(cfg, &cols[i].k, key, value, origin, errbuf, errlen);
	if ((pr = set_poll_column(cfg, key, value, origin, errbuf, errlen)) != OBX_ENOENT)
		return pr;
	if (strncmp(key, "header.", 7) == 0) {
		if (key[7] == '\0' || value[0] == '\0') {
			obx_config_fail(errbuf, errlen, origin, key,
			    "expected header.<name> = <column>, e.g. header.eventType = type");
			return OBX_ECONFIG;
		}
		if (obx_header_is_reserved(key + 7)) {
			obx_config_fail(errbuf, errlen, origin, key, "header '%s' is reserved: outboxd writes it "
			    "itself (reserved: " OBX_RESERVED_HEADERS "); choose another name", key + 7);
			return OBX_ECONFIG;
		}
		return kv_put(&cfg->extra_headers, &cfg->n_extra_headers, key + 7, value, origin);
	}
	if (strcmp(key, "topic") == 0) {
		int r = check_topic(value, why, sizeof(why));

		if (r != 0) {
			obx_config_fail(errbuf, errlen, origin, key, "%s", why);
			return r == OBX_ENOMEM ? r : OBX_ECONFIG;
		}
		return replace_str(&cfg->topic, value);
	}
	obx_config_fail(errbuf, errlen, origin, key, "unknown key in [outbox]");
	return OBX_ECONFIG;
}

static struct obx_kv *
kv_find(struct obx_kv *kv, size_t n, const char *key)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(kv[i].key, key) == 0)
			return &kv[i];
	return NULL;
}

static int
kv_put(struct obx_kv **kv, size_t *n, const char *key, const char *value, const char *origin)
{
	struct obx_kv *e = kv_find(*kv, *n, key);
	struct obx_kv *grown;
	char *v, *o;

	v = strdup(value);
	o = strdup(origin);
	if (v == NULL || o == NULL)
		goto nomem;
	if (e != NULL) {
		free(e->value);
		free(e->origin);
		e->value = v;
		e->origin = o;
		return 0;
	}
	grown = reallocarray(*kv, *n + 1, sizeof(**kv));
	if (grown == NULL)
		goto nomem;
	*kv = grown;
	e = &grown[*n];
	e->key = strdup(key);
	if (e->key == NULL)
		goto nomem;
	e->value = v;
	e->origin = o;
	(*n)++;
	return 0;
nomem:
	free(v);
	free(o);
	return OBX_ENOMEM;
}

static int
set_kafka(struct obx_config *cfg, const char *key, const char *value, const char *origin,
    char *errbuf, size_t errlen)
{
	char why[512];
	int r;

	/* Guarantees the relay depends on: a user may tune, not weaken them. */
	if (strcmp(key, "enable.idempotence") == 0) {
		bool b;

		if (obx_parse_bool(value, &b) != 0 || !b) {
			obx_config_fail(errbuf, errlen, origin, key,
			    "must stay true: without idempotence retries can reorder or duplicate events");
			return OBX_ECONFIG;
		}
	}
	if (strcmp(key, "acks") == 0 || strcmp(key, "request.required.acks") == 0) {
		if (strcmp(value, "all") != 0 && strcmp(value, "-1") != 0) {
			obx_config_fail(errbuf, errlen, origin, key,
			    "must stay 'all': an event acknowledged by fewer replicas can be lost");
			return OBX_ECONFIG;
		}
	}
	if (strcmp(key, "partitioner") == 0 && strcmp(value, "random") == 0) {
		obx_config_fail(errbuf, errlen, origin, key,
		    "must not be 'random': it spreads one aggregate's events over partitions and breaks "
		    "their order (keyed partitioners such as murmur2_random keep it)");
		return OBX_ECONFIG;
	}
	if (strcmp(key, "delivery.report.only.error") == 0) {
		bool b;

		if (obx_parse_bool(value, &b) != 0 || b) {
			obx_config_fail(errbuf, errlen, origin, key,
			    "must stay false: outboxd confirms the slot only on delivery reports of success");
			return OBX_ECONFIG;
		}
	}
	if (strcmp(key, "transactional.id") == 0) {
		obx_config_fail(errbuf, errlen, origin, key, "is set by outboxd: use [delivery] exactly_once "
		    "= on, and [delivery] transactional_id to choose the id");
		return OBX_ECONFIG;
	}

	/* Let librdkafka judge the property; it knows every name and range. */
	r = cfg->checks != NULL && cfg->checks->kafka_property != NULL ?
	    cfg->checks->kafka_property(key, value, why, sizeof(why)) : 0;
	if (r == OBX_ENOMEM)
		return r;
	if (r == OBX_ENOENT) {
		obx_config_fail(errbuf, errlen, origin, key, "unknown librdkafka property");
		return OBX_ECONFIG;
	}
	if (r != 0) {
		if (obx_kafka_prop_is_secret(key))
			obx_config_fail(errbuf, errlen, origin, key, "invalid value (not shown: secret)");
		else
			obx_config_fail(errbuf, errlen, origin, key, "%s", why);
		return OBX_ECONFIG;
	}
	r = kv_put(&cfg->kafka, &cfg->n_kafka, key, value, origin);
	if (r != 0)
		obx_config_fail(errbuf, errlen, origin, key, "%s", obx_strerror(r));
	return r;
}

static int
set_delivery(struct obx_config *cfg, const char *key, const char *value, const char *origin,
    char *errbuf, size_t errlen)
{
	int r;

	if (strcmp(key, "max_inflight") == 0) {
		r = obx_parse_int(value, 1, 10000000, &cfg->max_inflight);
		if (r != 0) {
			obx_config_fail(errbuf, errlen, origin, key, r == OBX_ERANGE ?
			    "'%s' is out of range (1 to 10000000)" :
			    "expected an integer, got '%s'", value);
			return OBX_ECONFIG;
		}
		return 0;
	}
	if (strcmp(key, "max_inflight_bytes") == 0) {
		r = obx_parse_size(value, 1024, 1LL << 40, &cfg->max_inflight_bytes);
		if (r != 0) {
			obx_config_fail(errbuf, errlen, origin, key, r == OBX_ERANGE ?
			    "'%s' is out of range (1KiB to 1TiB)" :
			    "expected a size such as 16MiB or 65536, got '%s'", value);
			return OBX_ECONFIG;
		}
		return 0;
	}
	if (strcmp(key, "on_error") == 0) {
		if (strcmp(value, "stop") == 0)
			cfg->on_error = OBX_ON_ERROR_STOP;
		else if (strcmp(value, "dead_letter") == 0)
			cfg->on_error = OBX_ON_ERROR_DEAD_LETTER;
		else {
			obx_config_fail(errbuf, errlen, origin, key,
			    "expected stop or dead_letter, got '%s'", value);
			return OBX_ECONFIG;
		}
		return 0;
	}
	if (strcmp(key, "missing_topic_timeout") == 0) {
		r = obx_parse_duration_ms(value, 0, 7LL * 24 * 3600 * 1000, &cfg->missing_topic_timeout_ms);
		if (r != 0) {
			obx_config_fail(errbuf, errlen, origin, key, r == OBX_ERANGE ?
			    "'%s' is out of range (0 to 7 days)" :
			    "expected a duration such as 5min or 30s, got '%s'", value);
			return OBX_ECONFIG;
		}
		return 0;
	}
	if (strcmp(key, "dedupe") == 0) {
		if (obx_parse_bool(value, &cfg->dedupe) != 0) {
			obx_config_fail(errbuf, errlen, origin, key, "expected on or off, got '%s'", value);
			return OBX_ECONFIG;
		}
		return 0;
	}
	if (strcmp(key, "exactly_once") == 0) {
		if (obx_parse_bool(value, &cfg->exactly_once) != 0) {
			obx_config_fail(errbuf, errlen, origin, key, "expected on or off, got '%s'", value);
			return OBX_ECONFIG;
		}
		return 0;
	}
	if (strcmp(key, "transaction_max_events") == 0) {
		r = obx_parse_int(value, 1, 10000000, &cfg->txn_max_events);
		if (r != 0) {
			obx_config_fail(errbuf, errlen, origin, key, r == OBX_ERANGE ?
			    "'%s' is out of range (1 to 10000000)" :
			    "expected an integer, got '%s'", value);
			return OBX_ECONFIG;
		}
		return 0;
	}
	if (strcmp(key, "transaction_max_bytes") == 0) {
		r = obx_parse_size(value, 1024, 1LL << 40, &cfg->txn_max_bytes);
		if (r != 0) {
			obx_config_fail(errbuf, errlen, origin, key, r == OBX_ERANGE ?
			    "'%s' is out of range (1KiB to 1TiB)" :
			    "expected a size such as 16MiB or 65536, got '%s'", value);
			return OBX_ECONFIG;
		}
		return 0;
	}
	if (strcmp(key, "transaction_max_time") == 0) {
		r = obx_parse_duration_ms(value, 0, 60000, &cfg->txn_max_ms);
		if (r != 0) {
			obx_config_fail(errbuf, errlen, origin, key, r == OBX_ERANGE ?
			    "'%s' is out of range (0 to 60s)" :
			    "expected a duration such as 100ms or 1s, got '%s'", value);
			return OBX_ECONFIG;
		}
		return 0;
	}
	if (strcmp(key, "dead_letter_topic") == 0) {
		static const struct str_key k = SK(dead_letter_topic, true);

		return set_str(cfg, &k, key, value, origin, errbuf, errlen);
	}
	if (strcmp(key, "progress_topic") == 0) {
		static const struct str_key k = SK(progress_topic, true);

		return set_str(cfg, &k, key, value, origin, errbuf, errlen);
	}
	if (strcmp(key, "transactional_id") == 0) {
		static const struct str_key k = SK(transactional_id, false);

		return set_str(cfg, &k, key, value, origin, errbuf, errlen);
	}
	obx_config_fail(errbuf, errlen, origin, key, "unknown key in [delivery]");
	return OBX_ECONFIG;
}

static int
set_metrics(struct obx_config *cfg, const char *key, const char *value, const char *origin,
    char *errbuf, size_t errlen)
{
	const char *colon;
	char host[256];
	long long port;

	if (strcmp(key, "detailed_health") == 0) {
		if (obx_parse_bool(value, &cfg->detailed_health) != 0) {
			obx_config_fail(errbuf, errlen, origin, key, "expected on or off, got '%s'", value);
			return OBX_ECONFIG;
		}
		return 0;
	}
	if (strcmp(key, "listen") != 0) {
		obx_config_fail(errbuf, errlen, origin, key, "unknown key in [metrics]");
		return OBX_ECONFIG;
	}
	colon = strrchr(value, ':');
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
set_log(struct obx_config *cfg, const char *key, const char *value, const char *origin,
    char *errbuf, size_t errlen)
{
	static const char *const levels[] = { "error", "warn", "info", "debug" };

	if (strcmp(key, "level") == 0) {
		for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++) {
			if (strcmp(value, levels[i]) == 0) {
				cfg->log_level = (enum obx_log_level)i;
				return 0;
			}
		}
		obx_config_fail(errbuf, errlen, origin, key,
		    "expected error, warn, info or debug, got '%s'", value);
		return OBX_ECONFIG;
	}
	if (strcmp(key, "format") == 0) {
		if (strcmp(value, "json") == 0)
			cfg->log_format = OBX_LOG_FORMAT_JSON;
		else if (strcmp(value, "text") == 0)
			cfg->log_format = OBX_LOG_FORMAT_TEXT;
		else {
			obx_config_fail(errbuf, errlen, origin, key, "expected json or text, got '%s'", value);
			return OBX_ECONFIG;
		}
		return 0;
	}
	if (strcmp(key, "progress_interval") == 0) {
		long long ms;
		int r = strcmp(value, "0") == 0 ? (ms = 0, 0) : obx_parse_duration_ms(value, 1000, 86400000, &ms);

		if (r != 0) {
			obx_config_fail(errbuf, errlen, origin, key, r == OBX_ERANGE ?
			    "'%s' is out of range (1s to 24h, or 0 for none)" :
			    "expected a duration such as 60s, or 0 for none, got '%s'", value);
			return OBX_ECONFIG;
		}
		cfg->progress_interval_ms = (int)ms;
		return 0;
	}
	obx_config_fail(errbuf, errlen, origin, key, "unknown key in [log]");
	return OBX_ECONFIG;
}

typedef int (*section_setter)(struct obx_config *, const char *, const char *, const char *,
    char *, size_t);

static const struct {
	const char *name;
	section_setter set;
} sections[] = {
	{ "source", set_source }, { "outbox", set_outbox }, { "kafka", set_kafka },
	{ "delivery", set_delivery }, { "metrics", set_metrics }, { "log", set_log },
	{ "poll", set_poll },
};

int
obx_config_set(struct obx_config *cfg, const char *section, const char *key, const char *value,
    const char *origin, bool from_file, char *errbuf, size_t errlen)
{
	char full[512];
	int r;

	for (size_t i = 0; i < sizeof(sections) / sizeof(sections[0]); i++) {
		if (strcmp(section, sections[i].name) != 0)
			continue;
		if (key[0] == '\0') {
			obx_config_fail(errbuf, errlen, origin, NULL, "empty key in [%s]", section);
			return OBX_ECONFIG;
		}
		if (from_file) {
			struct obx_kv *prev;

			snprintf(full, sizeof(full), "%s.%s", section, key);
			prev = kv_find(cfg->seen, cfg->n_seen, full);
			if (prev != NULL) {
				obx_config_fail(errbuf, errlen, origin, key, "set twice in [%s] (first at %s)",
				    section, prev->origin);
				return OBX_ECONFIG;
			}
			if ((r = kv_put(&cfg->seen, &cfg->n_seen, full, "", origin)) != 0)
				return r;
		}
		return sections[i].set(cfg, key, value, origin, errbuf, errlen);
	}
	if (section[0] == '\0')
		obx_config_fail(errbuf, errlen, origin, key, "outside of any [section]");
	else
		obx_config_fail(errbuf, errlen, origin, NULL, "section '%s': unknown section "
		    "(known: source, outbox, kafka, delivery, metrics, log, poll)", section);
	return OBX_ECONFIG;
}

/* ---- defaults and lifetime ------------------------------------------- */

void
obx_config_init(struct obx_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->conninfo = strdup("");
	cfg->password = strdup("");
	cfg->slot = strdup("outboxd");
	cfg->publication = strdup("outboxd");
	cfg->table_schema = strdup("public");
	cfg->table_name = strdup("outbox");
	cfg->create_slot = true;
	cfg->create_publication = true;
	cfg->status_interval_ms = 10000;
	cfg->streaming = false;
	cfg->stream_buffer_bytes = 64LL << 20;
	cfg->messages = false;
	cfg->message_prefix = strdup("outboxd");
	/* losing the slot on failover is the worst day an outbox relay can have; on 17+ a
	 * failover-enabled slot costs nothing until a standby synchronizes it (README, "Failover
	 * and standbys": synchronized_standby_slots makes it wait for that standby) */
	cfg->failover = true;
	cfg->col_id = strdup("id");
	cfg->col_key = strdup("aggregateid");
	cfg->col_aggregate_type = strdup("aggregatetype");
	cfg->col_type = strdup("type");
	cfg->col_payload = strdup("payload");
	cfg->topic = strdup("outbox.event.${aggregatetype}");
	cfg->col_headers = strdup("");
	cfg->col_timestamp = strdup("");
	cfg->max_inflight = 4000;
	cfg->max_inflight_bytes = 4LL << 20;
	cfg->missing_topic_timeout_ms = 5LL * 60 * 1000;
	cfg->on_error = OBX_ON_ERROR_STOP;
	cfg->dedupe = true;
	cfg->exactly_once = false;
	cfg->transactional_id = strdup("");
	cfg->progress_topic = strdup("outboxd.progress");
	cfg->txn_max_events = 10000;
	cfg->txn_max_bytes = 16LL << 20;
	cfg->txn_max_ms = 100;
	cfg->dead_letter_topic = strdup("outbox.dead_letter");
	cfg->metrics_host = strdup("0.0.0.0");
	cfg->metrics_port = 9898;
	cfg->detailed_health = false;
	cfg->log_level = OBX_LOG_INFO;
	cfg->log_format = OBX_LOG_FORMAT_JSON;
	cfg->progress_interval_ms = 60000;
	cfg->snapshot_filter = strdup("");
	/* polling mode (docs/internals/design.md, "Polling mode") */
	cfg->mode = OBX_SOURCE_LOGICAL;
	cfg->col_seq = strdup("seq");
	cfg->col_published_at = strdup("published_at");
	cfg->col_attempts = strdup("attempts");
	cfg->col_last_error = strdup("last_error");
	cfg->col_next_attempt_at = strdup("next_attempt_at");
	cfg->col_created_at = strdup("created_at");
	cfg->poll_batch = 10000;
	cfg->poll_interval_ms = 1000;
	cfg->poll_max_attempts = 10;
	cfg->poll_backoff_min_ms = 1000;
	cfg->poll_backoff_max_ms = 300000;
	cfg->poll_exhausted = OBX_POLL_EXHAUSTED_DEAD_LETTER;
	cfg->poll_notify_channel = strdup("outboxd");
}

static void
kv_free(struct obx_kv *kv, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(kv[i].key);
		free(kv[i].value);
		free(kv[i].origin);
	}
	free(kv);
}

void
obx_config_reset(struct obx_config *cfg)
{
	char **strs[] = {
		&cfg->conninfo, &cfg->slot, &cfg->publication, &cfg->table_schema,
		&cfg->table_name, &cfg->col_id, &cfg->col_key, &cfg->col_aggregate_type,
		&cfg->col_type, &cfg->col_payload, &cfg->topic, &cfg->col_headers,
		&cfg->col_timestamp, &cfg->dead_letter_topic, &cfg->metrics_host, &cfg->message_prefix,
		&cfg->transactional_id, &cfg->progress_topic, &cfg->snapshot_filter,
		/* polling mode */
		&cfg->col_seq, &cfg->col_published_at, &cfg->col_attempts, &cfg->col_last_error,
		&cfg->col_next_attempt_at, &cfg->col_created_at, &cfg->poll_notify_channel,
	};

	if (cfg->password != NULL) {
		explicit_bzero(cfg->password, strlen(cfg->password));
		free(cfg->password);
	}
	for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++)
		free(*strs[i]);
	kv_free(cfg->kafka, cfg->n_kafka);
	kv_free(cfg->extra_headers, cfg->n_extra_headers);
	kv_free(cfg->seen, cfg->n_seen);
	memset(cfg, 0, sizeof(*cfg));
}

const char *
obx_config_kafka_get(const struct obx_config *cfg, const char *key)
{
	struct obx_kv *e = kv_find(cfg->kafka, cfg->n_kafka, key);

	return e != NULL ? e->value : NULL;
}

int
obx_config_mapped_columns(const struct obx_config *cfg, struct obx_names *out)
{
	const char *fixed[] = { cfg->col_id, cfg->col_key, cfg->col_type, cfg->col_payload,
		cfg->col_headers, cfg->col_timestamp };
	struct obx_template tpl;
	char why[256];
	int r;

	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
		if (fixed[i][0] != '\0' && (r = obx_names_add(out, fixed[i])) != 0)
			return r;
	for (size_t i = 0; i < cfg->n_extra_headers; i++)
		if ((r = obx_names_add(out, cfg->extra_headers[i].value)) != 0)
			return r;
	if ((r = obx_template_parse(&tpl, cfg->topic, why, sizeof(why))) != 0)
		return r;
	r = obx_template_columns(&tpl, out);
	obx_template_reset(&tpl);
	return r;
}

/* ---- environment and --set ------------------------------------------- */

static bool
ends_with(const char *s, size_t len, const char *suffix)
{
	size_t n = strlen(suffix);

	return len >= n && memcmp(s + len - n, suffix, n) == 0;
}

static bool
all_of(const char *v, const char *set)
{
	return v[0] != '\0' && strspn(v, set) == strlen(v);
}

/* The value shapes the kubelet writes: an address, a port, a proto, or proto://addr:port. */
static bool
looks_like(const char *value, char kind)
{
	switch (kind) {
	case 'a':
		return all_of(value, "0123456789abcdefABCDEF.:");
	case 'n':
		return all_of(value, "0123456789");
	case 'p':
		return strcmp(value, "tcp") == 0 || strcmp(value, "udp") == 0 || strcmp(value, "sctp") == 0;
	default:
		return strncmp(value, "tcp://", 6) == 0 || strncmp(value, "udp://", 6) == 0 ||
		    strncmp(value, "sctp://", 7) == 0;
	}
}

bool
obx_config_is_service_link(const char *name, const char *value)
{
	size_t len = strlen(name);
	const char *p;

	if (ends_with(name, len, "_SERVICE_HOST"))
		return looks_like(value, 'a');
	if (ends_with(name, len, "_SERVICE_PORT") || strstr(name, "_SERVICE_PORT_") != NULL)
		return looks_like(value, 'n');
	/* <SVC>_PORT_<n>_<TCP|UDP|SCTP>[_PROTO|_PORT|_ADDR] */
	for (p = strstr(name, "_PORT_"); p != NULL; p = strstr(p + 1, "_PORT_")) {
		const char *q = p + 6;

		if (!isdigit((unsigned char)*q))
			continue;
		while (isdigit((unsigned char)*q))
			q++;
		if (strncmp(q, "_TCP", 4) == 0 || strncmp(q, "_UDP", 4) == 0)
			q += 4;
		else if (strncmp(q, "_SCTP", 5) == 0)
			q += 5;
		else
			continue;
		if (*q == '\0')
			return looks_like(value, 'u');
		if (strcmp(q, "_PROTO") == 0)
			return looks_like(value, 'p');
		if (strcmp(q, "_PORT") == 0)
			return looks_like(value, 'n');
		if (strcmp(q, "_ADDR") == 0)
			return looks_like(value, 'a');
	}
	return ends_with(name, len, "_PORT") && looks_like(value, 'u');
}

/* The environment entry with exactly name, or NULL. */
static const char *
env_value(char *const *envp, const char *name)
{
	size_t n = strlen(name);

	for (; envp != NULL && *envp != NULL; envp++)
		if (strncmp(*envp, name, n) == 0 && (*envp)[n] == '=')
			return *envp + n + 1;
	return NULL;
}

/* Splits OUTBOXD_<SECTION>_<KEY> into lowercase section and key ('_' -> '.' in [kafka]). */
static int
env_key(const char *name, const char *origin, char *section, size_t seclen, char *key, size_t keylen,
    char *errbuf, size_t errlen)
{
	const char *rest = name + strlen("OUTBOXD_");
	const char *under = strchr(rest, '_');
	size_t i, slen;

	if (under == NULL || under[1] == '\0') {
		obx_config_fail(errbuf, errlen, origin, NULL, "expected OUTBOXD_<SECTION>_<KEY>");
		return OBX_ECONFIG;
	}
	slen = (size_t)(under - rest);
	if (slen >= seclen)
		slen = seclen - 1;
	for (i = 0; i < slen; i++)
		section[i] = (char)tolower((unsigned char)rest[i]);
	section[slen] = '\0';
	for (i = 0; under[1 + i] != '\0' && i + 1 < keylen; i++) {
		char c = (char)tolower((unsigned char)under[1 + i]);

		key[i] = (c == '_' && strcmp(section, "kafka") == 0) ? '.' : c;
	}
	key[i] = '\0';
	return 0;
}

/* Applies one OUTBOXD_ variable; name is without "=value". */
static int
apply_env_one(struct obx_config *cfg, char *const *envp, const char *name, const char *value,
    char *errbuf, size_t errlen)
{
	char section[64], key[192], origin[300], plain[256], why[256];
	size_t len = strlen(name);
	char *secret = NULL;
	int r;

	snprintf(origin, sizeof(origin), "environment %s", name);
	if (!ends_with(name, len, "_FILE")) {
		if ((r = env_key(name, origin, section, sizeof(section), key, sizeof(key), errbuf, errlen)) != 0)
			return r;
		return obx_config_set(cfg, section, key, value, origin, false, errbuf, errlen);
	}
	/* OUTBOXD_<SECTION>_<KEY>_FILE=path: the value is the file's content */
	snprintf(plain, sizeof(plain), "%.*s", (int)(len - 5), name);
	if (env_value(envp, plain) != NULL) {
		obx_config_fail(errbuf, errlen, origin, NULL, "%s is set too: set one of them", plain);
		return OBX_ECONFIG;
	}
	if ((r = env_key(plain, origin, section, sizeof(section), key, sizeof(key), errbuf, errlen)) != 0)
		return r;
	if (cfg->checks == NULL || cfg->checks->read_file == NULL) {
		obx_config_fail(errbuf, errlen, origin, NULL, "values from files are not available here");
		return OBX_ECONFIG;
	}
	if (cfg->checks->read_file(value, &secret, why, sizeof(why)) != 0) {
		obx_config_fail(errbuf, errlen, origin, NULL, "%s", why);
		return OBX_ECONFIG;
	}
	r = obx_config_set(cfg, section, key, secret, origin, false, errbuf, errlen);
	explicit_bzero(secret, strlen(secret));
	free(secret);
	return r;
}

int
obx_config_apply_env(struct obx_config *cfg, char *const *envp, char *errbuf, size_t errlen)
{
	static const char prefix[] = "OUTBOXD_";

	for (char *const *e = envp; e != NULL && *e != NULL; e++) {
		const char *eq = strchr(*e, '=');
		char name[256];
		int r;

		if (strncmp(*e, prefix, sizeof(prefix) - 1) != 0 || eq == NULL)
			continue;
		if ((size_t)(eq - *e) >= sizeof(name)) {
			obx_config_fail(errbuf, errlen, "environment", NULL, "variable name too long");
			return OBX_ECONFIG;
		}
		memcpy(name, *e, (size_t)(eq - *e));
		name[eq - *e] = '\0';
		if (obx_config_is_service_link(name, eq + 1))
			continue; /* the kubelet's, for a Service named outboxd-...: not ours */
		if ((r = apply_env_one(cfg, envp, name, eq + 1, errbuf, errlen)) != 0)
			return r;
	}
	return 0;
}

int
obx_config_apply_set(struct obx_config *cfg, const char *assignment, char *errbuf, size_t errlen)
{
	const char *dot = strchr(assignment, '.');
	const char *eq = strchr(assignment, '=');
	char section[64], key[192], origin[300];
	size_t slen, klen;

	if (dot == NULL || eq == NULL || dot > eq || dot == assignment || eq == dot + 1) {
		/* Do not echo the argument: it may carry a secret value. */
		obx_config_fail(errbuf, errlen, "--set", NULL, "expected section.key=value");
		return OBX_ECONFIG;
	}
	slen = (size_t)(dot - assignment);
	klen = (size_t)(eq - dot - 1);
	if (slen >= sizeof(section) || klen >= sizeof(key)) {
		obx_config_fail(errbuf, errlen, "--set", NULL, "section or key name too long");
		return OBX_ECONFIG;
	}
	memcpy(section, assignment, slen);
	section[slen] = '\0';
	memcpy(key, dot + 1, klen);
	key[klen] = '\0';
	snprintf(origin, sizeof(origin), "--set %s.%s", section, key);
	return obx_config_set(cfg, section, key, eq + 1, origin, false, errbuf, errlen);
}

/* The polling mode's combinations: its own block, so [delivery]'s checks stay apart. */
static int
poll_finish(const struct obx_config *cfg, const char *path, char *errbuf, size_t errlen)
{
	if (cfg->mode != OBX_SOURCE_POLL)
		return 0;
	if (cfg->poll_backoff_min_ms > cfg->poll_backoff_max_ms) {
		obx_config_fail(errbuf, errlen, path, "backoff_min",
		    "[poll] backoff_min (%d ms) is above backoff_max (%d ms)", cfg->poll_backoff_min_ms,
		    cfg->poll_backoff_max_ms);
		return OBX_ECONFIG;
	}
	if (cfg->poll_exhausted == OBX_POLL_EXHAUSTED_DEAD_LETTER && cfg->dead_letter_topic[0] == '\0') {
		obx_config_fail(errbuf, errlen, path, "dead_letter_topic",
		    "required in [delivery] when [poll] exhausted = dead_letter");
		return OBX_ECONFIG;
	}
	return 0;
}

int
obx_config_finish(struct obx_config *cfg, const char *path, char *errbuf, size_t errlen)
{
	int r;
	const char *bs = obx_config_kafka_get(cfg, "bootstrap.servers");

	if (bs == NULL)
		bs = obx_config_kafka_get(cfg, "metadata.broker.list");
	if (bs == NULL || bs[0] == '\0') {
		obx_config_fail(errbuf, errlen, path, "bootstrap.servers",
		    "required in [kafka] (or OUTBOXD_KAFKA_BOOTSTRAP_SERVERS)");
		return OBX_ECONFIG;
	}
	if ((r = poll_finish(cfg, path, errbuf, errlen)) != 0)
		return r;
	if (cfg->exactly_once && cfg->mode == OBX_SOURCE_POLL) {
		obx_config_fail(errbuf, errlen, path, "exactly_once",
		    "works with [source] mode = logical only (polling mode marks rows published instead)");
		return OBX_ECONFIG;
	}
	if (cfg->snapshot && cfg->mode == OBX_SOURCE_POLL) {
		obx_config_fail(errbuf, errlen, path, "snapshot",
		    "snapshot = pending works with [source] mode = logical only (polling mode publishes "
		    "every pending row anyway)");
		return OBX_ECONFIG;
	}
	if (cfg->snapshot && cfg->exactly_once) {
		obx_config_fail(errbuf, errlen, path, "snapshot",
		    "snapshot = pending does not work with [delivery] exactly_once = on yet: start once "
		    "without exactly-once until the snapshot is done (the log says so), then turn it on");
		return OBX_ECONFIG;
	}
	if (cfg->on_error == OBX_ON_ERROR_DEAD_LETTER && cfg->dead_letter_topic[0] == '\0') {
		obx_config_fail(errbuf, errlen, path, "dead_letter_topic",
		    "required when on_error = dead_letter");
		return OBX_ECONFIG;
	}
	return 0;
}

/* ---- SIGHUP: what changed ------------------------------------------------ */

static bool
str_differs(const char *a, const char *b)
{
	return strcmp(a != NULL ? a : "", b != NULL ? b : "") != 0;
}

static bool
kv_differs(const struct obx_kv *a, size_t na, const struct obx_kv *b, size_t nb)
{
	if (na != nb)
		return true;
	for (size_t i = 0; i < na; i++)
		if (strcmp(a[i].key, b[i].key) != 0 || strcmp(a[i].value, b[i].value) != 0)
			return true;
	return false;
}

size_t
obx_config_diff(const struct obx_config *a, const struct obx_config *b, const char **names,
    size_t max)
{
	const struct {
		const char *name;
		bool differs;
	} items[] = {
		{ "[source] conninfo", str_differs(a->conninfo, b->conninfo) },
		{ "[source] password", str_differs(a->password, b->password) },
		{ "[source] slot", str_differs(a->slot, b->slot) },
		{ "[source] publication", str_differs(a->publication, b->publication) },
		{ "[source] table", str_differs(a->table_schema, b->table_schema) ||
		    str_differs(a->table_name, b->table_name) },
		{ "[source] create_slot", a->create_slot != b->create_slot },
		{ "[source] create_publication", a->create_publication != b->create_publication },
		{ "[source] status_interval", a->status_interval_ms != b->status_interval_ms },
		{ "[source] streaming", a->streaming != b->streaming },
		{ "[source] stream_buffer", a->stream_buffer_bytes != b->stream_buffer_bytes },
		{ "[source] messages", a->messages != b->messages },
		{ "[source] message_prefix", str_differs(a->message_prefix, b->message_prefix) },
		{ "[source] failover", a->failover != b->failover },
		{ "[source] snapshot", a->snapshot != b->snapshot ||
		    str_differs(a->snapshot_filter, b->snapshot_filter) },
		{ "[outbox] columns", str_differs(a->col_id, b->col_id) || str_differs(a->col_key, b->col_key) ||
		    str_differs(a->col_aggregate_type, b->col_aggregate_type) ||
		    str_differs(a->col_type, b->col_type) || str_differs(a->col_payload, b->col_payload) ||
		    str_differs(a->col_headers, b->col_headers) ||
		    str_differs(a->col_timestamp, b->col_timestamp) },
		{ "[outbox] topic", str_differs(a->topic, b->topic) },
		{ "[outbox] header.*", kv_differs(a->extra_headers, a->n_extra_headers, b->extra_headers,
		    b->n_extra_headers) },
		{ "[kafka]", kv_differs(a->kafka, a->n_kafka, b->kafka, b->n_kafka) },
		{ "[delivery] max_inflight", a->max_inflight != b->max_inflight },
		{ "[delivery] max_inflight_bytes", a->max_inflight_bytes != b->max_inflight_bytes },
		{ "[delivery] on_error", a->on_error != b->on_error },
		{ "[delivery] dead_letter_topic", str_differs(a->dead_letter_topic, b->dead_letter_topic) },
		{ "[delivery] missing_topic_timeout", a->missing_topic_timeout_ms != b->missing_topic_timeout_ms },
		{ "[delivery] dedupe", a->dedupe != b->dedupe },
		{ "[delivery] exactly_once", a->exactly_once != b->exactly_once },
		{ "[delivery] transactional_id", str_differs(a->transactional_id, b->transactional_id) },
		{ "[delivery] progress_topic", str_differs(a->progress_topic, b->progress_topic) },
		{ "[delivery] transaction_max_*", a->txn_max_events != b->txn_max_events ||
		    a->txn_max_bytes != b->txn_max_bytes || a->txn_max_ms != b->txn_max_ms },
		{ "[metrics] listen", str_differs(a->metrics_host, b->metrics_host) ||
		    a->metrics_port != b->metrics_port },
		{ "[metrics] detailed_health", a->detailed_health != b->detailed_health },
		{ "[log] level", a->log_level != b->log_level },
		{ "[log] format", a->log_format != b->log_format },
		{ "[log] progress_interval", a->progress_interval_ms != b->progress_interval_ms },
		/* polling mode */
		{ "[source] mode", a->mode != b->mode },
		{ "[outbox] polling columns", str_differs(a->col_seq, b->col_seq) ||
		    str_differs(a->col_published_at, b->col_published_at) ||
		    str_differs(a->col_attempts, b->col_attempts) ||
		    str_differs(a->col_last_error, b->col_last_error) ||
		    str_differs(a->col_next_attempt_at, b->col_next_attempt_at) ||
		    str_differs(a->col_created_at, b->col_created_at) },
		{ "[poll]", a->poll_batch != b->poll_batch || a->poll_interval_ms != b->poll_interval_ms ||
		    a->poll_max_attempts != b->poll_max_attempts ||
		    a->poll_backoff_min_ms != b->poll_backoff_min_ms ||
		    a->poll_backoff_max_ms != b->poll_backoff_max_ms ||
		    a->poll_exhausted != b->poll_exhausted ||
		    str_differs(a->poll_notify_channel, b->poll_notify_channel) },
	};
	size_t n = 0;

	for (size_t i = 0; i < sizeof(items) / sizeof(items[0]); i++)
		if (items[i].differs && n < max)
			names[n++] = items[i].name;
	return n;
}
