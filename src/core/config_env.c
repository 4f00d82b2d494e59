/*
 * config_env.c - the configuration's sources beside the file (pure): the
 * environment (OUTBOXD_<SECTION>_<KEY>, its _FILE variant, the names a
 * Kubernetes service link sets, which are not configuration) and --set
 * section.key=value, each value then set through obx_config_set().
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
#include "obx/core/err.h"

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
env_key(const char *name, const char *origin, char *section, size_t seclen, char *key, size_t keylen, char *errbuf,
    size_t errlen)
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
apply_env_one(struct obx_config *cfg, char *const *envp, const char *name, const char *value, char *errbuf,
    size_t errlen)
{
	char section[64], key[192], origin[300], plain[256], reason[256];
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
	if (cfg->checks->read_file(value, &secret, reason, sizeof(reason)) != 0) {
		obx_config_fail(errbuf, errlen, origin, NULL, "%s", reason);
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
