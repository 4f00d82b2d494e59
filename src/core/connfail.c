/* core/connfail.c - whether a failed connection attempt can heal (see connfail.h). */
#include <string.h>

#include "obx/core/connfail.h"
#include "obx/core/err.h"

int
obx_connfail_class(const char *msg)
{
	/* specific refusals first: with several hosts libpq joins every host's message */
	static const char *const permanent[] = {
		"password authentication failed",
		"does not exist",
		"no pg_hba.conf entry",
		"must be superuser or replication role",
		"permission denied",
		"must have the REPLICATION",
		"certificate",
		"root certificate file",
		"server does not support SSL",
		"invalid connection option",
		"invalid sslmode",
	};
	/* then what a restart, a DNS hiccup or a Service not created yet look like */
	static const char *const transient[] = {
		"could not translate host name",
		"Temporary failure in name resolution",
		"SSL SYSCALL error",
		"SSL connection has been closed unexpectedly",
		"unexpected eof",
	};
	/* last, the broad ones: any other TLS failure or invalid value is configuration */
	static const char *const broad[] = { "SSL error", "invalid" };

	for (size_t i = 0; i < sizeof(permanent) / sizeof(permanent[0]); i++)
		if (strstr(msg, permanent[i]) != NULL)
			return OBX_ECONFIG;
	for (size_t i = 0; i < sizeof(transient) / sizeof(transient[0]); i++)
		if (strstr(msg, transient[i]) != NULL)
			return OBX_EIO;
	for (size_t i = 0; i < sizeof(broad) / sizeof(broad[0]); i++)
		if (strstr(msg, broad[i]) != NULL)
			return OBX_ECONFIG;
	return OBX_EIO;
}
