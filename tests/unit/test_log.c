/*
 * log.c's lines: JSON carries the context's slot and mode and a line's
 * fields after msg, escaped, and leaves out what is empty; text prints the
 * sentence alone, as it always did.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "obx/sys/log.h"

#define TS "2024-05-01T12:00:00.000Z"

static json_t *
parse(char *line)
{
	json_error_t err;
	json_t *o;

	assert_non_null(line);
	o = json_loads(line, 0, &err);
	if (o == NULL)
		fail_msg("not JSON: %s: %s", line, err.text);
	free(line);
	return o;
}

static const char *
str(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_string(v))
		fail_msg("%s is not a string member", key);
	return json_string_value(v);
}

/* Every field present: rendered after msg, in order, lsn as X/X and xid as a number. */
static void
test_json_fields_present(void **state)
{
	struct obx_logfields f = { .lsn = 0x16B3F20,
		.xid = 771,
		.event_id = "7f0c-1",
		.topic = "outbox.event.order" };
	char *line;
	json_t *o;

	(void)state;
	line = obx_log_render(OBX_LOG_FORMAT_JSON, TS, OBX_LOG_WARN, "outboxd", "logical", &f,
	    "event id=7f0c-1 cannot be published");
	assert_string_equal(line,
	    "{\"ts\":\"" TS "\",\"level\":\"warn\",\"msg\":\"event id=7f0c-1 "
	    "cannot be published\",\"slot\":\"outboxd\",\"mode\":\"logical\",\"lsn\":\"0/16B3F20\","
	    "\"xid\":771,\"event_id\":\"7f0c-1\",\"topic\":\"outbox.event.order\"}");
	o = parse(line);
	assert_int_equal(json_integer_value(json_object_get(o, "xid")), 771);
	json_decref(o);
}

/* Quotes, backslashes, control characters and non-ASCII are escaped; the line stays one line. */
static void
test_json_escaped(void **state)
{
	struct obx_logfields f = { .event_id = "a\"b\\c\nd", .topic = "t\tü" };
	char *line;
	json_t *o;

	(void)state;
	line = obx_log_render(OBX_LOG_FORMAT_JSON, TS, OBX_LOG_INFO, "slot \"x\"", NULL, &f,
	    "line\nbreak \"quoted\"");
	assert_null(strchr(line, '\n'));
	assert_non_null(strstr(line, "\"event_id\":\"a\\\"b\\\\c\\nd\""));
	assert_non_null(strstr(line, "\"topic\":\"t\\t\\u00FC\""));
	o = parse(line);
	assert_string_equal(str(o, "msg"), "line\nbreak \"quoted\"");
	assert_string_equal(str(o, "slot"), "slot \"x\"");
	assert_string_equal(str(o, "event_id"), "a\"b\\c\nd");
	assert_string_equal(str(o, "topic"), "t\tü");
	json_decref(o);
}

/* Empty fields are absent: lsn 0/0, xid 0, NULL and "" strings, no context, no fields. */
static void
test_json_absent_when_empty(void **state)
{
	struct obx_logfields f = { .event_id = "", .topic = NULL };
	char *line;
	json_t *o;

	(void)state;
	line = obx_log_render(OBX_LOG_FORMAT_JSON, TS, OBX_LOG_INFO, "", NULL, &f, "plain");
	assert_string_equal(line, "{\"ts\":\"" TS "\",\"level\":\"info\",\"msg\":\"plain\"}");
	free(line);
	line = obx_log_render(OBX_LOG_FORMAT_JSON, TS, OBX_LOG_INFO, NULL, NULL, NULL, "plain");
	assert_string_equal(line, "{\"ts\":\"" TS "\",\"level\":\"info\",\"msg\":\"plain\"}");
	free(line);
	o = parse(obx_log_render(OBX_LOG_FORMAT_JSON, TS, OBX_LOG_INFO, "s", "poll", NULL, "m"));
	assert_int_equal(json_object_size(o), 5);
	assert_string_equal(str(o, "slot"), "s");
	assert_string_equal(str(o, "mode"), "poll");
	json_decref(o);
}

/* A line's own slot overrides the context's; a field that is not UTF-8 is left out, the line kept. */
static void
test_json_override_and_bad_utf8(void **state)
{
	struct obx_logfields f = { .slot = "other", .topic = "t\xff", .lsn = 1 };
	json_t *o;

	(void)state;
	o = parse(obx_log_render(OBX_LOG_FORMAT_JSON, TS, OBX_LOG_INFO, "outboxd", "logical", &f, "m"));
	assert_string_equal(str(o, "slot"), "other");
	assert_string_equal(str(o, "lsn"), "0/1");
	assert_null(json_object_get(o, "topic"));
	json_decref(o);
}

/* The text format is the sentence alone, whatever the fields; a msg not UTF-8 falls back to it. */
static void
test_text_unchanged(void **state)
{
	struct obx_logfields f = { .lsn = 0x16B3F20, .xid = 771, .event_id = "e", .topic = "t" };
	char *line;

	(void)state;
	line = obx_log_render(OBX_LOG_FORMAT_TEXT, TS, OBX_LOG_ERROR, "outboxd", "logical", &f,
	    "could not connect: refused");
	assert_string_equal(line, TS " error could not connect: refused");
	free(line);
	line = obx_log_render(OBX_LOG_FORMAT_JSON, TS, OBX_LOG_WARN, "outboxd", NULL, &f, "bad \xff");
	assert_string_equal(line, TS " warn bad \xff");
	free(line);
}

/* obx_log_f() writes what obx_log_render() renders, with the context, to stderr. */
static void
test_log_f_writes_the_context(void **state)
{
	char path[] = "/tmp/obx-test-log.XXXXXX", buf[1024];
	int fd = mkstemp(path), saved = dup(2);
	FILE *fp;
	json_t *o;

	(void)state;
	assert_true(fd >= 0 && saved >= 0);
	fflush(stderr);
	dup2(fd, 2);
	obx_log_setup(OBX_LOG_INFO, OBX_LOG_FORMAT_JSON);
	obx_log_context("outboxd", "logical");
	obx_log_f(OBX_LOG_INFO, &(struct obx_logfields){ .lsn = 0x10 }, "confirmed %s", "0/10");
	obx_log_debug("not written");
	obx_log_context(NULL, NULL);
	obx_log_info("no context");
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	fp = fdopen(fd, "r");
	assert_non_null(fp);
	rewind(fp);
	assert_non_null(fgets(buf, sizeof(buf), fp));
	o = json_loads(buf, 0, NULL);
	assert_non_null(o);
	assert_string_equal(str(o, "msg"), "confirmed 0/10");
	assert_string_equal(str(o, "slot"), "outboxd");
	assert_string_equal(str(o, "mode"), "logical");
	assert_string_equal(str(o, "lsn"), "0/10");
	json_decref(o);
	assert_non_null(fgets(buf, sizeof(buf), fp));
	o = json_loads(buf, 0, NULL);
	assert_non_null(o);
	assert_string_equal(str(o, "msg"), "no context");
	assert_null(json_object_get(o, "slot"));
	json_decref(o);
	assert_null(fgets(buf, sizeof(buf), fp));
	fclose(fp);
	unlink(path);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_json_fields_present),
		cmocka_unit_test(test_json_escaped),
		cmocka_unit_test(test_json_absent_when_empty),
		cmocka_unit_test(test_json_override_and_bad_utf8),
		cmocka_unit_test(test_text_unchanged),
		cmocka_unit_test(test_log_f_writes_the_context),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
