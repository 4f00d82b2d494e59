/*
 * tables.c - which relations are outbox tables and the mapping of each
 * (pure); tables.h says how an entry matches and which mapping wins.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/config_kinds.h"
#include "obx/core/config_table.h"
#include "obx/core/err.h"
#include "obx/core/tables.h"

bool
obx_glob_match(const char *pat, const char *s)
{
	const char *star = NULL, *resume = NULL;

	/* the classic greedy walk with one backtrack point: linear in practice, no recursion */
	while (*s != '\0') {
		if (*pat == '*') {
			star = pat++;
			resume = s;
		} else if (*pat == *s) {
			pat++;
			s++;
		} else if (star != NULL) {
			pat = star + 1;
			s = ++resume;
		} else {
			return false;
		}
	}
	while (*pat == '*')
		pat++;
	return *pat == '\0';
}

int
obx_tables_format(const struct obx_config *cfg, char *out, size_t outlen)
{
	const char *sub;

	return obx_cfg_format(cfg, obx_cfg_find("source", "table", &sub), out, outlen);
}

static bool
part_match(const char *pat, bool wild, const char *s)
{
	return wild ? obx_glob_match(pat, s) : strcmp(pat, s) == 0;
}

bool
obx_table_pat_match(const struct obx_table_pat *p, const char *schema, const char *name)
{
	return part_match(p->schema, p->schema_wild, schema) && part_match(p->name, p->name_wild, name);
}

bool
obx_tables_wild(const struct obx_config *cfg)
{
	for (size_t i = 0; i < cfg->n_tables; i++)
		if (cfg->tables[i].schema_wild || cfg->tables[i].name_wild)
			return true;
	return false;
}

bool
obx_tables_several(const struct obx_config *cfg)
{
	/* an override section too: every path that reads a table's mapping then reads it per table */
	return cfg->n_tables > 1 || obx_tables_wild(cfg) || cfg->n_overrides > 0;
}

bool
obx_tables_may_leave_out(const struct obx_config *cfg, const char *schema, const char *name)
{
	if (!obx_tables_several(cfg))
		return false;
	for (size_t i = 0; i < cfg->n_tables; i++) {
		const struct obx_table_pat *e = &cfg->tables[i];

		if (!e->schema_wild && !e->name_wild && strcmp(e->schema, schema) == 0 &&
		    strcmp(e->name, name) == 0)
			return false;
	}
	return true;
}

enum obx_table_fault
obx_tables_read_fault(const struct obx_config *cfg, const char *schema, const char *name, const char *state)
{
	bool missing, refused;

	if (state == NULL)
		return OBX_TABLE_FAULT_RETRY;
	if (strcmp(state, "55P03") == 0)
		return OBX_TABLE_FAULT_NEXT_TURN;
	missing = strcmp(state, "42P01") == 0 || strcmp(state, "42703") == 0 || strcmp(state, "3F000") == 0;
	/* class 42 (42501 refused, 42883 an operator a column's type lacks, 42804 a type that does
	 * not match, ...): the table's definition or grants, which a later migration fixes */
	refused = strncmp(state, "42", 2) == 0;
	if ((missing || refused) && obx_tables_may_leave_out(cfg, schema, name))
		return OBX_TABLE_FAULT_LEAVE_OUT;
	return missing ? OBX_TABLE_FAULT_STOP : OBX_TABLE_FAULT_RETRY;
}

const struct obx_table_pat *
obx_tables_next_missing(const struct obx_config *cfg, size_t *next,
    bool (*has)(void *ctx, const char *schema, const char *name), void *ctx)
{
	while (*next < cfg->n_tables) {
		const struct obx_table_pat *e = &cfg->tables[(*next)++];

		if (!e->schema_wild && !e->name_wild && !has(ctx, e->schema, e->name))
			return e;
	}
	return NULL;
}

int
obx_tables_mapping(const struct obx_config *cfg, const char *schema, const char *name)
{
	bool outbox = false;

	for (size_t i = 0; i < cfg->n_tables && !outbox; i++)
		outbox = obx_table_pat_match(&cfg->tables[i], schema, name);
	if (!outbox)
		return -1;
	for (size_t i = 0; i < cfg->n_overrides; i++)
		if (obx_table_pat_match(&cfg->overrides[i].pat, schema, name))
			return (int)i + 1;
	return 0;
}

static void *
field(const struct obx_config *cfg, size_t off)
{
	return (char *)cfg + off;
}

void
obx_tables_view(const struct obx_config *cfg, int mapping, const char *schema, const char *name,
    struct obx_config *view)
{
	const struct obx_config *map = mapping > 0 ? cfg->overrides[mapping - 1].map : NULL;

	*view = *cfg;
	view->table_schema = (char *)schema;
	view->table_name = (char *)name;
	if (map == NULL)
		return;
	for (size_t i = 0; i < obx_cfg_nkeys; i++) {
		const struct obx_cfg_key *k = &obx_cfg_keys[i];

		if (strcmp(k->section, "outbox") != 0)
			continue;
		if (k->type == OBX_CFG_MAP) {
			memcpy(field(view, k->off), field(map, k->off), sizeof(struct obx_kv *));
			memcpy(field(view, k->size), field(map, k->size), sizeof(size_t));
		} else {
			memcpy(field(view, k->off), field(map, k->off), k->size);
		}
	}
}

/* ---- [outbox.<schema>.<table>] sections ---- */

int
obx_tables_override_set(struct obx_config *cfg, const char *section, const char *key, const char *value,
    const char *origin, char *errbuf, size_t errlen)
{
	struct obx_table_override *o = NULL, *grown;
	const char *sub;
	int r;

	for (size_t i = 0; i < cfg->n_overrides && o == NULL; i++)
		if (strcmp(cfg->overrides[i].section, section) == 0)
			o = &cfg->overrides[i];
	if (o == NULL) {
		struct obx_table_pat pat;

		r = obx_table_pat_parse(section + strlen(OBX_TABLE_SECTION), &pat);
		if (r == OBX_ENOMEM)
			return r;
		if (r != 0) {
			obx_config_fail(errbuf, errlen, origin, NULL,
			    "section '%s': expected [outbox.<schema>.<table>] (a name double-quoted or a '*' "
			    "pattern)",
			    section);
			return OBX_ECONFIG;
		}
		/* the same tables under another spelling: the later section would never apply */
		for (size_t i = 0; i < cfg->n_overrides; i++) {
			const struct obx_table_pat *q = &cfg->overrides[i].pat;

			if (strcmp(q->schema, pat.schema) == 0 && strcmp(q->name, pat.name) == 0 &&
			    q->schema_wild == pat.schema_wild && q->name_wild == pat.name_wild) {
				obx_config_fail(errbuf, errlen, origin, NULL,
				    "section '%s' names the tables of [%s] again", section,
				    cfg->overrides[i].section);
				obx_table_pat_reset(&pat);
				return OBX_ECONFIG;
			}
		}
		if ((grown = reallocarray(cfg->overrides, cfg->n_overrides + 1, sizeof(*grown))) == NULL) {
			obx_table_pat_reset(&pat);
			return OBX_ENOMEM;
		}
		cfg->overrides = grown;
		o = &grown[cfg->n_overrides];
		memset(o, 0, sizeof(*o));
		o->pat = pat;
		if ((o->section = strdup(section)) == NULL) {
			obx_table_pat_reset(&o->pat);
			return OBX_ENOMEM;
		}
		cfg->n_overrides++;
	}
	if (obx_cfg_find("outbox", key, &sub) == NULL) {
		obx_config_fail(errbuf, errlen, origin, key, "unknown key in [%s] (it takes [outbox]'s keys)",
		    section);
		return OBX_ECONFIG;
	}
	if (obx_kv_find(o->keys, o->nkeys, key) != NULL) {
		obx_config_fail(errbuf, errlen, origin, key, "set twice in [%s] (first at %s)", section,
		    obx_kv_find(o->keys, o->nkeys, key)->origin);
		return OBX_ECONFIG;
	}
	return obx_kv_put(&o->keys, &o->nkeys, key, value, origin);
}

/* Sets map's [outbox] keys to cfg's.  Returns 0, OBX_ENOMEM or OBX_ECONFIG (not expected: cfg's are checked). */
static int
copy_outbox(struct obx_config *map, const struct obx_config *cfg, char *errbuf, size_t errlen)
{
	char value[4096], name[512];
	int r = 0;

	for (size_t i = 0; i < obx_cfg_nkeys && r == 0; i++) {
		const struct obx_cfg_key *k = &obx_cfg_keys[i];

		if (strcmp(k->section, "outbox") != 0)
			continue;
		if (k->type == OBX_CFG_MAP) {
			const struct obx_kv *kv = *(struct obx_kv **)field(cfg, k->off);
			size_t n = *(size_t *)field(cfg, k->size);

			for (size_t j = 0; j < n && r == 0; j++) {
				snprintf(name, sizeof(name), "%.*s%s", (int)(strlen(k->name) - 1), k->name,
				    kv[j].key);
				r = obx_config_set(map, "outbox", name, kv[j].value, kv[j].origin, false, errbuf,
				    errlen);
			}
		} else if ((r = obx_cfg_format(cfg, k, value, sizeof(value))) == 0) {
			r = obx_config_set(map, "outbox", k->name, value, "[outbox]", false, errbuf, errlen);
		} else {
			obx_config_fail(errbuf, errlen, "[outbox]", k->name, "value too long to copy");
			r = OBX_ECONFIG;
		}
	}
	return r;
}

int
obx_tables_overrides_finish(struct obx_config *cfg, char *errbuf, size_t errlen)
{
	int r = 0;

	for (size_t i = 0; i < cfg->n_overrides && r == 0; i++) {
		struct obx_table_override *o = &cfg->overrides[i];

		if (o->map != NULL) {
			obx_config_reset(o->map);
			free(o->map);
		}
		if ((o->map = malloc(sizeof(*o->map))) == NULL)
			return OBX_ENOMEM;
		if ((r = obx_config_init(o->map)) != 0)
			break;
		o->map->checks = cfg->checks;
		r = copy_outbox(o->map, cfg, errbuf, errlen);
		for (size_t j = 0; j < o->nkeys && r == 0; j++)
			r = obx_config_set(o->map, "outbox", o->keys[j].key, o->keys[j].value, o->keys[j].origin,
			    false, errbuf, errlen);
	}
	return r;
}

void
obx_tables_overrides_reset(struct obx_config *cfg)
{
	for (size_t i = 0; i < cfg->n_overrides; i++) {
		struct obx_table_override *o = &cfg->overrides[i];

		obx_table_pat_reset(&o->pat);
		free(o->section);
		obx_kv_free(o->keys, o->nkeys);
		if (o->map != NULL) {
			obx_config_reset(o->map);
			free(o->map);
		}
	}
	free(cfg->overrides);
	cfg->overrides = NULL;
	cfg->n_overrides = 0;
}

bool
obx_tables_overrides_differ(const struct obx_config *a, const struct obx_config *b)
{
	if (a->n_overrides != b->n_overrides)
		return true;
	for (size_t i = 0; i < a->n_overrides; i++) {
		const struct obx_table_override *x = &a->overrides[i], *y = &b->overrides[i];

		if (strcmp(x->section, y->section) != 0 || x->nkeys != y->nkeys)
			return true;
		for (size_t j = 0; j < x->nkeys; j++)
			if (strcmp(x->keys[j].key, y->keys[j].key) != 0 ||
			    strcmp(x->keys[j].value, y->keys[j].value) != 0)
				return true;
	}
	return false;
}
