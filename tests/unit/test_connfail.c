/* Whether a failed connection attempt can heal, from libpq's message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "obx/core/connfail.h"
#include "obx/core/err.h"

/* Refusals no retry heals: someone must change the configuration or the server. */
static void
test_permanent_refusals(void **state)
{
	static const char *const msgs[] = {
		"connection to server at \"127.0.0.1\", port 5432 failed: FATAL:  password "
		"authentication failed for user \"outboxd\"",
		"connection to server on socket \"/tmp/.s.PGSQL.5432\" failed: FATAL:  database "
		"\"nope\" does not exist",
		"FATAL:  no pg_hba.conf entry for replication connection from host \"10.0.0.1\"",
		"FATAL:  must be superuser or replication role to start walsender",
		"FATAL:  permission denied to start WAL sender",
		"FATAL:  must have the REPLICATION attribute to start a WAL sender",
		"SSL error: certificate verify failed",
		"root certificate file \"/root/.postgresql/root.crt\" does not exist",
		"server does not support SSL, but SSL was required",
		"invalid connection option \"bogus\"",
		"invalid sslmode value: \"sometimes\"",
		"SSL error: tlsv1 alert protocol version",
		"invalid integer value \"x\" for connection option \"port\"",
	};

	(void)state;
	for (size_t i = 0; i < sizeof(msgs) / sizeof(msgs[0]); i++)
		assert_int_equal(obx_connfail_class(msgs[i]), OBX_ECONFIG);
}

/* What a restart, a network cut or a name not resolvable yet look like: retried. */
static void
test_transient_failures(void **state)
{
	static const char *const msgs[] = {
		"connection to server at \"127.0.0.1\", port 5432 failed: Connection refused",
		"could not translate host name \"pg.example\" to address: Name or service not known",
		"could not translate host name \"pg\" to address: Temporary failure in name resolution",
		"SSL SYSCALL error: EOF detected",
		"SSL connection has been closed unexpectedly",
		"SSL error: unexpected eof while reading",
		"FATAL:  the database system is starting up",
		"server closed the connection unexpectedly",
		"",
	};

	(void)state;
	for (size_t i = 0; i < sizeof(msgs) / sizeof(msgs[0]); i++)
		assert_int_equal(obx_connfail_class(msgs[i]), OBX_EIO);
}

/* With several hosts libpq joins their messages: a specific refusal anywhere wins. */
static void
test_joined_messages(void **state)
{
	(void)state;
	assert_int_equal(
	    obx_connfail_class(
	        "connection to server at \"a\" failed: Connection refused; "
	        "connection to server at \"b\" failed: FATAL:  password authentication failed for user "
	        "\"outboxd\""),
	    OBX_ECONFIG);
	assert_int_equal(
	    obx_connfail_class("could not translate host name \"a\" to address: "
	                       "Temporary failure in name resolution; connection to server at \"b\" failed: "
	                       "Connection refused"),
	    OBX_EIO);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_permanent_refusals),
		cmocka_unit_test(test_transient_failures),
		cmocka_unit_test(test_joined_messages),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
