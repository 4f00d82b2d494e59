/*
 * The configuration table (config_table.c): complete, in section order,
 * every default valid and printed as written, every key compared on SIGHUP,
 * printed values read back to the same value.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "obx/core/config.h"
#include "obx/core/config_table.h"
#include "obx/core/err.h"

static char errbuf[1024];

/* Each key once, its section known, the sections' keys together and in the sections' order. */
static void
test_table_shape(void **state)
{
	size_t sec = 0;

	(void)state;
	for (size_t i = 0; i < obx_cfg_nkeys; i++) {
		const struct obx_cfg_key *k = &obx_cfg_keys[i];
		const char *sub;

		assert_non_null(obx_cfg_section_find(k->section));
		while (sec < obx_cfg_nsections && strcmp(obx_cfg_sections[sec].name, k->section) != 0)
			sec++;
		if (sec == obx_cfg_nsections)
			fail_msg("[%s] %s is out of its section's place", k->section, k->name);
		for (size_t j = 0; j < i; j++)
			if (strcmp(obx_cfg_keys[j].section, k->section) == 0 &&
			    strcmp(obx_cfg_keys[j].name, k->name) == 0)
				fail_msg("[%s] %s is in the table twice", k->section, k->name);
		assert_non_null(k->desc);
		assert_non_null(k->type_name);
		assert_true((k->def == NULL) == (k->type == OBX_CFG_MAP));
		if (k->type == OBX_CFG_INT || k->type == OBX_CFG_DURATION || k->type == OBX_CFG_SIZE)
			assert_non_null(k->range);
		if (k->type == OBX_CFG_DURATION || k->type == OBX_CFG_SIZE)
			assert_non_null(k->example);
		if (k->type == OBX_CFG_BOOL)
			assert_int_equal(k->nchoices, 2);
		if (k->type != OBX_CFG_MAP)
			assert_ptr_equal(obx_cfg_find(k->section, k->name, &sub), k);
	}
}

/* Each default is printed exactly as the table writes it. */
static void
test_defaults_print_as_written(void **state)
{
	struct obx_config cfg;
	char out[256];

	(void)state;
	assert_int_equal(obx_config_init(&cfg), 0);
	for (size_t i = 0; i < obx_cfg_nkeys; i++) {
		const struct obx_cfg_key *k = &obx_cfg_keys[i];

		if (k->type == OBX_CFG_MAP) {
			assert_int_equal(obx_cfg_format(&cfg, k, out, sizeof(out)), OBX_EINVAL);
			continue;
		}
		assert_int_equal(obx_cfg_format(&cfg, k, out, sizeof(out)), 0);
		if (strcmp(out, k->def) != 0)
			fail_msg("[%s] %s: default '%s' prints as '%s'", k->section, k->name, k->def, out);
	}
	assert_false(cfg.failover_set); /* a default is not "given" */
	obx_config_reset(&cfg);
}

/* A value other than the default, for each kind. */
static const char *
other_value(const struct obx_cfg_key *k, char *buf, size_t len)
{
	switch (k->type) {
	case OBX_CFG_BOOL:
	case OBX_CFG_ENUM:
		for (size_t i = 0; i < k->nchoices; i++)
			if (strcmp(k->choices[i].name, k->def) != 0)
				return k->choices[i].name;
		return NULL;
	case OBX_CFG_INT:
		snprintf(buf, len, "%lld", k->max);
		return buf;
	case OBX_CFG_DURATION:
		snprintf(buf, len, "%lldms", k->max - 1);
		return buf;
	case OBX_CFG_SIZE:
		snprintf(buf, len, "%lld", k->max - 1);
		return buf;
	case OBX_CFG_CUSTOM:
		return strcmp(k->name, "table") == 0 ? "\"Sales\".\"Out \"\"Box\"" : "[::1]:9000";
	default:
		snprintf(buf, len, "%s_other", k->def);
		return buf;
	}
}

/*
 * Each key changed alone: SIGHUP names it (or its group) and nothing else,
 * and its printed value reads back to the same configuration.
 */
static void
test_every_key_compared_and_read_back(void **state)
{
	struct obx_config a, b, c;
	const char *names[64];
	char buf[128], out[256];

	(void)state;
	assert_int_equal(obx_config_init(&a), 0);
	for (size_t i = 0; i < obx_cfg_nkeys; i++) {
		const struct obx_cfg_key *k = &obx_cfg_keys[i];
		const char *v;

		if (k->type == OBX_CFG_MAP)
			continue;
		v = other_value(k, buf, sizeof(buf));
		assert_non_null(v);
		assert_int_equal(obx_config_init(&b), 0);
		if (obx_config_set(&b, k->section, k->name, v, "test", false, errbuf, sizeof(errbuf)) != 0)
			fail_msg("[%s] %s = %s: %s", k->section, k->name, v, errbuf);
		assert_int_equal(obx_config_diff(&a, &b, names, 64), 1);
		assert_string_equal(names[0], k->group != NULL ? k->group : k->diff_name);
		assert_int_equal(obx_cfg_format(&b, k, out, sizeof(out)), 0);
		assert_int_equal(obx_config_init(&c), 0);
		assert_int_equal(
		    obx_config_set(&c, k->section, k->name, out, "test", false, errbuf, sizeof(errbuf)), 0);
		if (obx_config_diff(&b, &c, names, 64) != 0)
			fail_msg("[%s] %s = %s prints as '%s', which reads back otherwise", k->section, k->name, v,
			    out);
		obx_config_reset(&c);
		obx_config_reset(&b);
	}
	obx_config_reset(&a);
}

/* The maps: header.<name> by its prefix, any [kafka] property; both compared. */
static void
test_maps(void **state)
{
	struct obx_config a, b;
	const char *names[8], *sub;
	const struct obx_cfg_key *k;

	(void)state;
	k = obx_cfg_find("outbox", "header.eventType", &sub);
	assert_non_null(k);
	assert_int_equal(k->type, OBX_CFG_MAP);
	assert_string_equal(sub, "eventType");
	k = obx_cfg_find("kafka", "linger.ms", &sub);
	assert_non_null(k);
	assert_string_equal(sub, "linger.ms");
	assert_null(obx_cfg_find("outbox", "nosuch", &sub));
	assert_int_equal(obx_config_init(&a), 0);
	assert_int_equal(obx_config_init(&b), 0);
	assert_int_equal(
	    obx_config_set(&b, "outbox", "header.eventType", "type", "test", false, errbuf, sizeof(errbuf)), 0);
	assert_int_equal(obx_config_set(&b, "kafka", "linger.ms", "5", "test", false, errbuf, sizeof(errbuf)), 0);
	assert_int_equal(obx_config_diff(&a, &b, names, 8), 2);
	assert_string_equal(names[0], "[outbox] header.*");
	assert_string_equal(names[1], "[kafka]");
	obx_config_reset(&a);
	obx_config_reset(&b);
}

/* The environment's names, as obx_config_apply_env() reads them. */
static void
test_env_names(void **state)
{
	char name[128];
	const char *sub;

	(void)state;
	assert_int_equal(obx_cfg_env_name(obx_cfg_find("source", "status_interval", &sub), name, sizeof(name)), 0);
	assert_string_equal(name, "OUTBOXD_SOURCE_STATUS_INTERVAL");
	assert_int_equal(obx_cfg_env_name(obx_cfg_find("kafka", "x", &sub), name, sizeof(name)), 0);
	assert_string_equal(name, "OUTBOXD_KAFKA_<NAME>");
	assert_int_equal(obx_cfg_env_name(obx_cfg_find("outbox", "header.x", &sub), name, sizeof(name)),
	    OBX_ENOENT);
	assert_int_equal(obx_cfg_env_name(obx_cfg_find("source", "slot", &sub), name, 8), OBX_ERANGE);
	/* every name the table gives is one the environment sets */
	for (size_t i = 0; i < obx_cfg_nkeys; i++) {
		const struct obx_cfg_key *k = &obx_cfg_keys[i];
		struct obx_config cfg;
		char var[300], buf[128];
		char *env[] = { var, NULL };
		const char *names[4];
		struct obx_config def;

		if (k->type == OBX_CFG_MAP)
			continue;
		assert_int_equal(obx_cfg_env_name(k, name, sizeof(name)), 0);
		snprintf(var, sizeof(var), "%s=%s", name, other_value(k, buf, sizeof(buf)));
		assert_int_equal(obx_config_init(&cfg), 0);
		assert_int_equal(obx_config_init(&def), 0);
		if (obx_config_apply_env(&cfg, env, errbuf, sizeof(errbuf)) != 0)
			fail_msg("%s: %s", var, errbuf);
		assert_int_equal(obx_config_diff(&def, &cfg, names, 4), 1);
		obx_config_reset(&def);
		obx_config_reset(&cfg);
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table_shape),
		cmocka_unit_test(test_defaults_print_as_written),
		cmocka_unit_test(test_every_key_compared_and_read_back),
		cmocka_unit_test(test_maps),
		cmocka_unit_test(test_env_names),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
