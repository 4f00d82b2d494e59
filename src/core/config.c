/*
 * config.c - configuration validation (pure): every value is parsed and
 * checked as it is set, from whatever source config_load.c (the file) or
 * the caller (environment, --set) hands over, so that the unit tests can
 * drive every error path.  What each key is (its kind, range, default,
 * field) is config_table.c's; this file applies the table, then the checks
 * across keys (obx_config_finish()).
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/config.h"
#include "obx/core/config_table.h"
#include "obx/core/tables.h"
#include "obx/core/err.h"
#include "obx/core/event.h"
#include "obx/core/template.h"

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

/* ---- secrets ---------------------------------------------------------- */

bool
obx_kafka_prop_is_secret(const char *key)
{
	/* The properties librdkafka itself marks sensitive (CONFIGURATION.md). */
	static const char *const secret[] = {
		"sasl.username",
		"sasl.password",
		"ssl.key.password",
		"ssl.key.pem",
		"ssl_key",
		"ssl.keystore.password",
		"sasl.oauthbearer.config",
		"sasl.oauthbearer.client.secret",
		"ssl.certificate.pem",
		"ssl_certificate",
	};

	for (size_t i = 0; i < sizeof(secret) / sizeof(secret[0]); i++)
		if (strcmp(key, secret[i]) == 0)
			return true;
	/* Anything that calls itself a password or secret is treated as one. */
	return strstr(key, "password") != NULL || strstr(key, "secret") != NULL;
}

/* ---- name = value lists ([kafka], header.*) ---------------------------- */

struct obx_kv *
obx_kv_find(struct obx_kv *kv, size_t n, const char *key)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(kv[i].key, key) == 0)
			return &kv[i];
	return NULL;
}

int
obx_kv_put(struct obx_kv **kv, size_t *n, const char *key, const char *value, const char *origin)
{
	struct obx_kv *e = obx_kv_find(*kv, *n, key);
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

void
obx_kv_free(struct obx_kv *kv, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(kv[i].key);
		free(kv[i].value);
		free(kv[i].origin);
	}
	free(kv);
}

/* ---- setting one value, by the table ------------------------------------ */

static void *
field(const struct obx_config *cfg, size_t off)
{
	return (char *)(uintptr_t)cfg + off;
}

static void
put_int(struct obx_config *cfg, const struct obx_cfg_key *k, long long v)
{
	void *p = field(cfg, k->off);

	if (k->size == sizeof(bool))
		*(bool *)p = v != 0;
	else if (k->size == sizeof(int))
		*(int *)p = (int)v;
	else
		*(long long *)p = v;
}

/* "a, b or c": the choices of k as an error message lists them. */
static void
choice_list(const struct obx_cfg_key *k, char *out, size_t outlen)
{
	size_t used = 0;

	out[0] = '\0';
	for (size_t i = 0; i < k->nchoices && used < outlen; i++) {
		int n = snprintf(out + used, outlen - used, "%s%s",
		    i == 0                   ? "" :
		        i + 1 == k->nchoices ? " or " :
		                               ", ",
		    k->choices[i].name);

		if (n < 0)
			break;
		used += (size_t)n;
	}
}

/* A number of k's kind (INT, DURATION, SIZE) in [k->min, k->max]; 0, OBX_EINVAL or OBX_ERANGE. */
static int
parse_number(const struct obx_cfg_key *k, const char *value, long long *v)
{
	if (k->type == OBX_CFG_INT)
		return obx_parse_int(value, k->min, k->max, v);
	if (k->type == OBX_CFG_SIZE)
		return obx_parse_size(value, k->min, k->max, v);
	if ((k->flags & OBX_CFG_ZERO_NONE) && strcmp(value, "0") == 0) {
		*v = 0;
		return 0;
	}
	return obx_parse_duration_ms(value, k->min, k->max, v);
}

/*
 * Parses value as k says and stores it.  key is the name as given (a MAP's
 * whole "header.x"), sub the part after a MAP's prefix.  given marks a
 * value from a source rather than the default.  Returns 0, OBX_ECONFIG
 * (errbuf filled) or OBX_ENOMEM.
 */
static int
set_value(struct obx_config *cfg, const struct obx_cfg_key *k, const char *key, const char *sub, const char *value,
    const char *origin, bool given, char *errbuf, size_t errlen)
{
	char reason[512];
	long long v;
	bool b;
	int r = 0;

	switch (k->type) {
	case OBX_CFG_STRING: {
		char **slot = field(cfg, k->off);

		if ((k->flags & OBX_CFG_NONEMPTY) && value[0] == '\0') {
			obx_config_fail(errbuf, errlen, origin, key, "must not be empty");
			return OBX_ECONFIG;
		}
		if (k->check != NULL && (r = k->check(cfg, NULL, value, reason, sizeof(reason))) != 0)
			break;
		if (k->secret == OBX_CFG_SECRET && *slot != NULL)
			explicit_bzero(*slot, strlen(*slot));
		if ((r = replace_str(slot, value)) != 0)
			snprintf(reason, sizeof(reason), "%s", obx_strerror(r));
		break;
	}
	case OBX_CFG_BOOL:
		if (obx_parse_bool(value, &b) != 0) {
			obx_config_fail(errbuf, errlen, origin, key, "expected %s or %s, got '%s'",
			    k->choices[0].name, k->choices[1].name, value);
			return OBX_ECONFIG;
		}
		put_int(cfg, k, b);
		break;
	case OBX_CFG_ENUM:
		for (size_t i = 0; i < k->nchoices; i++)
			if (strcmp(value, k->choices[i].name) == 0) {
				put_int(cfg, k, k->choices[i].value);
				goto given;
			}
		choice_list(k, reason, sizeof(reason));
		obx_config_fail(errbuf, errlen, origin, key, "expected %s, got '%s'", reason, value);
		return OBX_ECONFIG;
	case OBX_CFG_INT:
	case OBX_CFG_DURATION:
	case OBX_CFG_SIZE:
		if ((r = parse_number(k, value, &v)) == OBX_ERANGE) {
			obx_config_fail(errbuf, errlen, origin, key, "'%s' is out of range (%s)", value, k->range);
			return OBX_ECONFIG;
		}
		if (r != 0 && k->type == OBX_CFG_INT) {
			obx_config_fail(errbuf, errlen, origin, key, "expected an integer, got '%s'", value);
			return OBX_ECONFIG;
		}
		if (r != 0) {
			obx_config_fail(errbuf, errlen, origin, key, "expected a %s such as %s, got '%s'",
			    k->type_name, k->example, value);
			return OBX_ECONFIG;
		}
		put_int(cfg, k, v);
		break;
	case OBX_CFG_MAP:
		if ((r = k->check(cfg, sub, value, reason, sizeof(reason))) != 0)
			break;
		if ((r = obx_kv_put(field(cfg, k->off), field(cfg, k->size), sub, value, origin)) != 0)
			snprintf(reason, sizeof(reason), "%s", obx_strerror(r));
		break;
	case OBX_CFG_CUSTOM:
		r = k->custom->set(cfg, key, value, origin, errbuf, errlen);
		break;
	}
	if (r != 0) {
		if (k->type != OBX_CFG_CUSTOM)
			obx_config_fail(errbuf, errlen, origin, key, "%s", reason);
		return r == OBX_ENOMEM ? r : OBX_ECONFIG;
	}
given:
	if (given && k->given_off != 0)
		*(bool *)field(cfg, k->given_off) = true;
	return 0;
}

int
obx_config_set(struct obx_config *cfg, const char *section, const char *key, const char *value, const char *origin,
    bool from_file, char *errbuf, size_t errlen)
{
	const struct obx_cfg_key *k;
	const char *sub;
	char full[512];
	int r;

	if (strncmp(section, OBX_TABLE_SECTION, strlen(OBX_TABLE_SECTION)) == 0) {
		if (key[0] == '\0') {
			obx_config_fail(errbuf, errlen, origin, NULL, "empty key in [%s]", section);
			return OBX_ECONFIG;
		}
		return obx_tables_override_set(cfg, section, key, value, origin, errbuf, errlen);
	}
	if (obx_cfg_section_find(section) == NULL) {
		size_t used = 0;

		if (section[0] == '\0') {
			obx_config_fail(errbuf, errlen, origin, key, "outside of any [section]");
			return OBX_ECONFIG;
		}
		full[0] = '\0';
		for (size_t i = 0; i < obx_cfg_nsections && used < sizeof(full); i++)
			used += (size_t)snprintf(full + used, sizeof(full) - used, "%s%s", i ? ", " : "",
			    obx_cfg_sections[i].name);
		obx_config_fail(errbuf, errlen, origin, NULL, "section '%s': unknown section (known: %s)", section,
		    full);
		return OBX_ECONFIG;
	}
	if (key[0] == '\0') {
		obx_config_fail(errbuf, errlen, origin, NULL, "empty key in [%s]", section);
		return OBX_ECONFIG;
	}
	if (from_file) {
		struct obx_kv *prev;

		snprintf(full, sizeof(full), "%s.%s", section, key);
		prev = obx_kv_find(cfg->seen, cfg->n_seen, full);
		if (prev != NULL) {
			obx_config_fail(errbuf, errlen, origin, key, "set twice in [%s] (first at %s)", section,
			    prev->origin);
			return OBX_ECONFIG;
		}
		if ((r = obx_kv_put(&cfg->seen, &cfg->n_seen, full, "", origin)) != 0)
			return r;
	}
	if ((k = obx_cfg_find(section, key, &sub)) == NULL) {
		obx_config_fail(errbuf, errlen, origin, key, "unknown key in [%s]", section);
		return OBX_ECONFIG;
	}
	return set_value(cfg, k, key, sub, value, origin, true, errbuf, errlen);
}

/* ---- defaults and lifetime ------------------------------------------- */

int
obx_config_init(struct obx_config *cfg)
{
	char errbuf[512];
	int r = 0;

	memset(cfg, 0, sizeof(*cfg));
	for (size_t i = 0; i < obx_cfg_nkeys; i++) {
		const struct obx_cfg_key *k = &obx_cfg_keys[i];

		/* every default is valid (test_config_table checks), so only memory can run out */
		if (k->def != NULL &&
		    set_value(cfg, k, k->name, NULL, k->def, "default", false, errbuf, sizeof(errbuf)) != 0)
			r = OBX_ENOMEM;
	}
	return r;
}

void
obx_config_reset(struct obx_config *cfg)
{
	for (size_t i = 0; i < obx_cfg_nkeys; i++) {
		const struct obx_cfg_key *k = &obx_cfg_keys[i];

		if (k->type == OBX_CFG_STRING) {
			char **slot = field(cfg, k->off);

			if (*slot != NULL && k->secret == OBX_CFG_SECRET)
				explicit_bzero(*slot, strlen(*slot));
			free(*slot);
		} else if (k->type == OBX_CFG_MAP) {
			obx_kv_free(*(struct obx_kv **)field(cfg, k->off), *(size_t *)field(cfg, k->size));
		} else if (k->type == OBX_CFG_CUSTOM) {
			k->custom->reset(cfg);
		}
	}
	obx_tables_overrides_reset(cfg);
	obx_kv_free(cfg->seen, cfg->n_seen);
	memset(cfg, 0, sizeof(*cfg));
}

const char *
obx_config_kafka_get(const struct obx_config *cfg, const char *key)
{
	struct obx_kv *e = obx_kv_find(cfg->kafka, cfg->n_kafka, key);

	return e != NULL ? e->value : NULL;
}

int
obx_config_mapped_columns(const struct obx_config *cfg, struct obx_names *out)
{
	const char *fixed[] = { cfg->col_id, cfg->col_key, cfg->col_type, cfg->col_payload, cfg->col_headers,
		cfg->col_timestamp };
	struct obx_template tpl;
	char reason[256];
	int r;

	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
		if (fixed[i][0] != '\0' && (r = obx_names_add(out, fixed[i])) != 0)
			return r;
	for (size_t i = 0; i < cfg->n_extra_headers; i++)
		if ((r = obx_names_add(out, cfg->extra_headers[i].value)) != 0)
			return r;
	if ((r = obx_template_parse(&tpl, cfg->topic, reason, sizeof(reason))) != 0)
		return r;
	r = obx_template_columns(&tpl, out);
	obx_template_reset(&tpl);
	return r;
}

/* ---- what only the whole configuration can tell ------------------------ */

/*
 * Several tables: the overrides' mappings, an exact override that names
 * no table of [source] table, and what works with one table only so far.
 */
static int
finish_tables(struct obx_config *cfg, char *errbuf, size_t errlen)
{
	int r;

	if ((r = obx_tables_overrides_finish(cfg, errbuf, errlen)) != 0)
		return r;
	for (size_t i = 0; i < cfg->n_overrides; i++) {
		const struct obx_table_override *o = &cfg->overrides[i];

		if (!o->pat.schema_wild && !o->pat.name_wild &&
		    obx_tables_mapping(cfg, o->pat.schema, o->pat.name) == -1) {
			obx_config_fail(errbuf, errlen, o->keys[0].origin, NULL,
			    "section [%s]: %s.%s is not a table of [source] table", o->section, o->pat.schema,
			    o->pat.name);
			return OBX_ECONFIG;
		}
	}
	if (!obx_tables_several(cfg))
		return 0;
	/* with several tables each event says its table: a header of that name would shadow it */
	for (size_t i = 0; i <= cfg->n_overrides; i++) {
		const struct obx_config *m = i == 0 ? cfg : cfg->overrides[i - 1].map;
		const struct obx_kv *h = obx_kv_find(m->extra_headers, m->n_extra_headers, OBX_TABLE_HEADER);

		if (h != NULL) {
			obx_config_fail(errbuf, errlen, h->origin, "header." OBX_TABLE_HEADER,
			    "header '" OBX_TABLE_HEADER "' is reserved with several tables: outboxd writes the "
			    "event's table in it; choose another name");
			return OBX_ECONFIG;
		}
	}
	return 0;
}

/* The polling mode's combinations: its own block, so [delivery]'s checks stay apart. */

/*
 * The checks across keys, one key constraining another: the only place
 * they are made, after every source has been applied.
 */
int
obx_config_finish(struct obx_config *cfg, const char *path, char *errbuf, size_t errlen)
{
	const char *bs = obx_config_kafka_get(cfg, "bootstrap.servers");

	if (bs == NULL)
		bs = obx_config_kafka_get(cfg, "metadata.broker.list");
	if (bs == NULL || bs[0] == '\0') {
		obx_config_fail(errbuf, errlen, path, "bootstrap.servers",
		    "required in [kafka] (or OUTBOXD_KAFKA_BOOTSTRAP_SERVERS)");
		return OBX_ECONFIG;
	}
	/* polling mode's own combinations */
	if (cfg->mode == OBX_SOURCE_POLL && cfg->poll_backoff_min_ms > cfg->poll_backoff_max_ms) {
		obx_config_fail(errbuf, errlen, path, "backoff_min",
		    "[poll] backoff_min (%d ms) is above backoff_max (%d ms)", cfg->poll_backoff_min_ms,
		    cfg->poll_backoff_max_ms);
		return OBX_ECONFIG;
	}
	if (cfg->mode == OBX_SOURCE_POLL && cfg->poll_exhausted == OBX_POLL_EXHAUSTED_DEAD_LETTER &&
	    cfg->dead_letter_topic[0] == '\0') {
		obx_config_fail(errbuf, errlen, path, "dead_letter_topic",
		    "required in [delivery] when [poll] exhausted = dead_letter");
		return OBX_ECONFIG;
	}
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
		obx_config_fail(errbuf, errlen, path, "dead_letter_topic", "required when on_error = dead_letter");
		return OBX_ECONFIG;
	}
	return finish_tables(cfg, errbuf, errlen);
}

/* ---- SIGHUP: what changed ------------------------------------------------ */

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

static bool
key_differs(const struct obx_config *a, const struct obx_config *b, const struct obx_cfg_key *k)
{
	switch (k->type) {
	case OBX_CFG_STRING: {
		const char *sa = *(char **)field(a, k->off), *sb = *(char **)field(b, k->off);

		return strcmp(sa != NULL ? sa : "", sb != NULL ? sb : "") != 0;
	}
	case OBX_CFG_MAP:
		return kv_differs(*(struct obx_kv **)field(a, k->off), *(size_t *)field(a, k->size),
		    *(struct obx_kv **)field(b, k->off), *(size_t *)field(b, k->size));
	case OBX_CFG_CUSTOM:
		return k->custom->differs(a, b);
	default:
		return memcmp(field(a, k->off), field(b, k->off), k->size) != 0;
	}
}

static bool
applies_live(const struct obx_cfg_key *k, enum obx_source_mode mode)
{
	return k->reload == OBX_CFG_SIGHUP || (k->reload == OBX_CFG_SIGHUP_LOGICAL && mode == OBX_SOURCE_LOGICAL);
}

static size_t
diff(const struct obx_config *a, const struct obx_config *b, const enum obx_source_mode *later_in,
    const char **names, size_t max)
{
	size_t n = 0;

	for (size_t i = 0; i < obx_cfg_nkeys; i++) {
		const struct obx_cfg_key *k = &obx_cfg_keys[i];
		const char *name = k->group != NULL ? k->group : k->diff_name;
		bool named = false;

		if (!key_differs(a, b, k) || (later_in != NULL && applies_live(k, *later_in)))
			continue;
		for (size_t j = 0; j < n && !named; j++)
			named = strcmp(names[j], name) == 0;
		if (!named && n < max)
			names[n++] = name;
	}
	if (obx_tables_overrides_differ(a, b) && n < max)
		names[n++] = "[outbox.<schema>.<table>]";
	return n;
}

size_t
obx_config_diff(const struct obx_config *a, const struct obx_config *b, const char **names, size_t max)
{
	return diff(a, b, NULL, names, max);
}

size_t
obx_config_diff_restart(const struct obx_config *running, const struct obx_config *fresh, const char **names,
    size_t max)
{
	return diff(running, fresh, &running->mode, names, max);
}
