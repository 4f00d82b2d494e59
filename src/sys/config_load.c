/*
 * config_load.c - the I/O edge of the configuration: the file is read with
 * libinih, connection strings are judged by libpq and properties by
 * librdkafka; every value then goes through the pure obx_config_set().
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ini.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#include "obx/sys/config_load.h"
#include "obx/core/err.h"

/* ---- the checks only libpq and librdkafka can make -------------------- */

static int
check_conninfo(const char *value)
{
	PQconninfoOption *opts;
	char *errmsg = NULL;

	/* libpq's parse error quotes the input, which may hold the password: dropped. */
	opts = PQconninfoParse(value, &errmsg);
	PQfreemem(errmsg);
	if (opts == NULL)
		return OBX_EINVAL;
	PQconninfoFree(opts);
	return 0;
}

static int
check_kafka_property(const char *key, const char *value, char *errbuf, size_t errlen)
{
	rd_kafka_conf_t *conf;
	rd_kafka_conf_res_t res;

	conf = rd_kafka_conf_new();
	if (conf == NULL)
		return OBX_ENOMEM;
	res = rd_kafka_conf_set(conf, key, value, errbuf, errlen);
	rd_kafka_conf_destroy(conf);
	if (res == RD_KAFKA_CONF_UNKNOWN)
		return OBX_ENOENT;
	return res == RD_KAFKA_CONF_OK ? 0 : OBX_EINVAL;
}

#define MAX_SECRET_FILE (1 << 20)

/* A mounted secret: the whole file, one trailing newline removed; never quoted in errors. */
static int
read_secret_file(const char *path, char **value, char *errbuf, size_t errlen)
{
	FILE *f = fopen(path, "re");
	char *buf = NULL;
	size_t n;
	int r = OBX_EIO;

	*value = NULL;
	if (f == NULL) {
		snprintf(errbuf, errlen, "could not open %s: %s", path, strerror(errno));
		return OBX_EIO;
	}
	buf = malloc(MAX_SECRET_FILE + 1);
	if (buf == NULL) {
		snprintf(errbuf, errlen, "out of memory");
		r = OBX_ENOMEM;
		goto out;
	}
	n = fread(buf, 1, MAX_SECRET_FILE + 1, f);
	if (ferror(f)) {
		snprintf(errbuf, errlen, "could not read %s: %s", path, strerror(errno));
		goto out;
	}
	if (n > MAX_SECRET_FILE) {
		snprintf(errbuf, errlen, "%s is larger than %d bytes", path, MAX_SECRET_FILE);
		goto out;
	}
	if (n > 0 && buf[n - 1] == '\n')
		n--;
	if (n > 0 && buf[n - 1] == '\r')
		n--;
	if (memchr(buf, '\0', n) != NULL) {
		snprintf(errbuf, errlen, "%s holds a NUL byte", path);
		goto out;
	}
	buf[n] = '\0';
	*value = buf;
	buf = NULL;
	r = 0;
out:
	if (buf != NULL) {
		explicit_bzero(buf, MAX_SECRET_FILE + 1);
		free(buf);
	}
	fclose(f);
	return r;
}

const struct obx_config_checks obx_config_io_checks = {
	.conninfo = check_conninfo,
	.kafka_property = check_kafka_property,
	.read_file = read_secret_file,
};

int
obx_conninfo_redact(const char *conninfo, char *out, size_t outlen)
{
	PQconninfoOption *opts;
	char *errmsg = NULL;
	size_t used = 0;

	if (outlen == 0)
		return OBX_EINVAL;
	out[0] = '\0';
	opts = PQconninfoParse(conninfo, &errmsg);
	if (opts == NULL) {
		PQfreemem(errmsg);
		strlcpy(out, "(unparsable connection string)", outlen);
		return OBX_EINVAL;
	}
	for (PQconninfoOption *o = opts; o->keyword != NULL; o++) {
		const char *val = o->val;
		int n;

		if (val == NULL)
			continue;
		if (strcmp(o->keyword, "password") == 0 || o->dispchar[0] == '*')
			val = "********";
		n = snprintf(out + used, outlen - used, "%s%s=%s", used ? " " : "", o->keyword, val);
		if (n < 0 || (size_t)n >= outlen - used)
			break;
		used += (size_t)n;
	}
	PQconninfoFree(opts);
	return 0;
}

/* ---- the file --------------------------------------------------------- */

struct file_state {
	struct obx_config *cfg;
	const char *path;
	FILE *fp;
	int lineno;
	size_t line_len; /* characters of line lineno read so far, newline not counted */
	bool in_line;    /* the last character read was not a newline */
	bool line_indented;
	int rc;
	char *errbuf;
	size_t errlen;
};

/*
 * libinih reader, as fgets(): at most num - 1 characters, up to and including
 * a newline.  libinih calls it again, with its buffer grown, for the rest of a
 * long line, so lineno counts physical lines and matches libinih's.  A line
 * longer than OBX_CONFIG_MAX_LINE ends the parse with an error naming it
 * (libinih would cut it and read the rest as a line of its own).
 */
static char *
file_reader(char *str, int num, void *stream)
{
	struct file_state *st = stream;
	int c;
	int n = 0;

	if (st->rc != 0)
		return NULL;
	while (n < num - 1 && (c = fgetc(st->fp)) != EOF) {
		if (!st->in_line) {
			st->lineno++;
			st->line_len = 0;
			st->line_indented = c == ' ' || c == '\t';
			st->in_line = true;
		}
		if (c == '\n') {
			str[n++] = (char)c;
			st->in_line = false;
			break;
		}
		if (c != '\r' && st->line_len == OBX_CONFIG_MAX_LINE) {
			char origin[PATH_MAX + 16];

			snprintf(origin, sizeof(origin), "%s:%d", st->path, st->lineno);
			obx_config_fail(st->errbuf, st->errlen, origin, NULL, "line longer than %d characters",
			    OBX_CONFIG_MAX_LINE);
			st->rc = OBX_ECONFIG;
			return NULL;
		}
		str[n++] = (char)c;
		if (c != '\r')
			st->line_len++; /* a CRLF file's CR is the line's end, not its content */
	}
	if (n == 0)
		return NULL;
	str[n] = '\0';
	return str;
}

static int
file_handler(void *user, const char *section, const char *name, const char *value)
{
	struct file_state *st = user;
	char origin[PATH_MAX + 16];

	if (st->rc != 0)
		return 0;
	snprintf(origin, sizeof(origin), "%s:%d", st->path, st->lineno);
	if (st->line_indented) {
		obx_config_fail(st->errbuf, st->errlen, origin, name,
		    "indented line (continuation lines are not supported)");
		st->rc = OBX_ECONFIG;
		return 0;
	}
	st->rc = obx_config_set(st->cfg, section, name, value, origin, true, st->errbuf, st->errlen);
	return st->rc == 0;
}

static int
load_file(struct obx_config *cfg, const char *path, char *errbuf, size_t errlen)
{
	struct file_state st = { cfg, path, NULL, 0, 0, false, false, 0, errbuf, errlen };
	char origin[PATH_MAX + 16];
	int line;

	st.fp = fopen(path, "r");
	if (st.fp == NULL) {
		obx_config_fail(errbuf, errlen, path, NULL, "could not open: %s", strerror(errno));
		return OBX_ECONFIG;
	}
	/*
	 * libinih's line buffer: on the heap, grown as a line needs, up to the
	 * longest line plus CR, LF and NUL.  Debian's libinih takes these at run
	 * time (upstream only at its own compile time; CMakeLists.txt checks).
	 */
	ini_use_stack = false;
	ini_allow_realloc = true;
	ini_max_line = OBX_CONFIG_MAX_LINE + 3;
	line = ini_parse_stream(file_reader, &st, file_handler, &st);
	fclose(st.fp);
	if (st.rc != 0)
		return st.rc;
	if (line == -2) {
		obx_config_fail(errbuf, errlen, path, NULL, "out of memory");
		return OBX_ENOMEM;
	}
	if (line != 0) {
		snprintf(origin, sizeof(origin), "%s:%d", path, line);
		obx_config_fail(errbuf, errlen, origin, NULL,
		    "syntax error (expected [section], key = value or a comment)");
		return OBX_ECONFIG;
	}
	return 0;
}

int
obx_config_load(struct obx_config *cfg, const char *path, char *const *envp, const char *const *sets, size_t nsets,
    char *errbuf, size_t errlen)
{
	int r;

	if ((r = obx_config_init(cfg)) != 0) {
		obx_config_fail(errbuf, errlen, path != NULL ? path : "defaults", NULL, "out of memory");
		return r;
	}
	cfg->checks = &obx_config_io_checks;
	if (path != NULL && (r = load_file(cfg, path, errbuf, errlen)) != 0)
		return r;
	if ((r = obx_config_apply_env(cfg, envp, errbuf, errlen)) != 0)
		return r;
	for (size_t i = 0; i < nsets; i++)
		if ((r = obx_config_apply_set(cfg, sets[i], errbuf, errlen)) != 0)
			return r;
	return obx_config_finish(cfg, path != NULL ? path : "(no file)", errbuf, errlen);
}
