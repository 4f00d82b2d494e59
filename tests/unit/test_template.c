/* The topic template parser and the distinct-name list. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "obx/core/err.h"
#include "obx/core/template.h"

/* Parses text and compares its parts with want: "=lit" for literals, "$col" for columns. */
static void
expect_parts(const char *text, const char *const *want, size_t n)
{
	struct obx_template t;
	char errbuf[256] = "";

	if (obx_template_parse(&t, text, errbuf, sizeof(errbuf)) != 0)
		fail_msg("template '%s' refused: %s", text, errbuf);
	if (t.nparts != n)
		fail_msg("template '%s': want %zu parts, got %zu", text, n, t.nparts);
	for (size_t i = 0; i < n; i++) {
		assert_int_equal(t.parts[i].is_column, want[i][0] == '$');
		assert_string_equal(t.parts[i].text, want[i] + 1);
	}
	obx_template_reset(&t);
	assert_null(t.parts);
	assert_int_equal(t.nparts, 0);
}

/* Expects text to be refused with a reason containing want. */
static void
expect_refused(const char *text, const char *want)
{
	struct obx_template t;
	char errbuf[256] = "";

	assert_int_equal(obx_template_parse(&t, text, errbuf, sizeof(errbuf)), OBX_EINVAL);
	if (strstr(errbuf, want) == NULL)
		fail_msg("template '%s': want a reason containing \"%s\", got \"%s\"", text, want, errbuf);
	/* nothing is left to free after a refusal */
	assert_null(t.parts);
	assert_int_equal(t.nparts, 0);
	obx_template_reset(&t);
}

static void
test_parts(void **state)
{
	(void)state;
	expect_parts("outbox.event.${aggregatetype}", (const char *[]){ "=outbox.event.", "$aggregatetype" }, 2);
	expect_parts("${tipo}.v1", (const char *[]){ "$tipo", "=.v1" }, 2);
	expect_parts("${a}${b}", (const char *[]){ "$a", "$b" }, 2);
	expect_parts("fixed", (const char *[]){ "=fixed" }, 1);
	expect_parts("", NULL, 0);
	/* a name is everything up to the first '}', as PostgreSQL allows quoted names */
	expect_parts("${Event Type}", (const char *[]){ "$Event Type" }, 1);
	expect_parts("${a${b}", (const char *[]){ "$a${b" }, 1);
	expect_parts("${x.${}", (const char *[]){ "$x.${" }, 1);
}

static void
test_literal_dollars_and_braces(void **state)
{
	(void)state;
	expect_parts("$${x}", (const char *[]){ "=$", "$x" }, 2);
	expect_parts("price$", (const char *[]){ "=price$" }, 1);
	expect_parts("$x.{y}", (const char *[]){ "=$x.{y}" }, 1);
	expect_parts("${a}}", (const char *[]){ "$a", "=}" }, 2);
	expect_parts("a}b${c}d", (const char *[]){ "=a}b", "$c", "=d" }, 3);
}

static void
test_refusals(void **state)
{
	(void)state;
	/* the texts the configuration has always given (tests/unit/test_config.c) */
	expect_refused("events.${type", "unclosed '${' in topic template 'events.${type'");
	expect_refused("events.${}", "empty '${}' in topic template 'events.${}'");
	expect_refused("${", "unclosed '${'");
	expect_refused("a.${b}.${", "unclosed '${'");
	/* the first fault from the left is the one named */
	expect_refused("${}.${x", "empty '${}'");
}

static void
test_columns_distinct_in_order(void **state)
{
	struct obx_template t;
	struct obx_names names = { 0 };
	char errbuf[64];

	(void)state;
	assert_int_equal(obx_template_parse(&t, "${b}.${a}-${b}.x.${c}${a}", errbuf, sizeof(errbuf)), 0);
	assert_int_equal(obx_names_add(&names, "a"), 0); /* already there: not added again */
	assert_int_equal(obx_template_columns(&t, &names), 0);
	assert_int_equal(names.n, 3);
	assert_string_equal(names.v[0], "a");
	assert_string_equal(names.v[1], "b");
	assert_string_equal(names.v[2], "c");
	obx_template_reset(&t);
	/* the names are copies: they outlive the template */
	assert_true(obx_names_has(&names, "c"));
	assert_false(obx_names_has(&names, "d"));
	obx_names_reset(&names);
	assert_null(names.v);
	assert_int_equal(names.n, 0);
	obx_names_reset(&names);
}

static void
test_many_columns(void **state)
{
	struct obx_template t;
	struct obx_names names = { 0 };
	char text[2048], errbuf[64];
	size_t o = 0;

	(void)state;
	for (int i = 0; i < 40; i++)
		o += (size_t)snprintf(text + o, sizeof(text) - o, "%s${column_%02d}", i ? "." : "", i);
	assert_int_equal(obx_template_parse(&t, text, errbuf, sizeof(errbuf)), 0);
	assert_int_equal(t.nparts, 79);
	assert_int_equal(obx_template_columns(&t, &names), 0);
	assert_int_equal(names.n, 40);
	for (int i = 0; i < 40; i++) {
		char want[16];

		snprintf(want, sizeof(want), "column_%02d", i);
		assert_string_equal(names.v[i], want);
	}
	obx_names_reset(&names);
	obx_template_reset(&t);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parts),
		cmocka_unit_test(test_literal_dollars_and_braces),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_columns_distinct_in_order),
		cmocka_unit_test(test_many_columns),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
