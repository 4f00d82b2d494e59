#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "harness.h"

int64_t
t_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void
t_stack_load(struct t_stack *st)
{
	const char *path = getenv("OBX_STACK_ENV");
	char line[1024];
	FILE *fp;

	memset(st, 0, sizeof(*st));
	if (path == NULL)
		fail_msg("OBX_STACK_ENV is not set: run the tests through ctest (the stack fixture)");
	fp = fopen(path, "r");
	if (fp == NULL)
		fail_msg("could not open %s: %s (did the pg_stack fixture start?)", path, strerror(errno));
	while (fgets(line, sizeof(line), fp) != NULL) {
		char *eq = strchr(line, '=');
		char *nl = strchr(line, '\n');

		if (eq == NULL)
			continue;
		if (nl != NULL)
			*nl = '\0';
		*eq++ = '\0';
		if (strcmp(line, "OBX_PGHOST") == 0)
			snprintf(st->host, sizeof(st->host), "%s", eq);
		else if (strcmp(line, "OBX_PGPORT") == 0)
			snprintf(st->port, sizeof(st->port), "%s", eq);
		else if (strcmp(line, "OBX_PGUSER") == 0)
			snprintf(st->user, sizeof(st->user), "%s", eq);
		else if (strcmp(line, "OBX_PGDATA") == 0)
			snprintf(st->pgdata, sizeof(st->pgdata), "%s", eq);
		else if (strcmp(line, "OBX_PGBIN") == 0)
			snprintf(st->pgbin, sizeof(st->pgbin), "%s", eq);
		else if (strcmp(line, "OBX_PGROOT") == 0)
			snprintf(st->root, sizeof(st->root), "%s", eq);
		else if (strcmp(line, "OBX_PGMAJOR") == 0)
			st->major = atoi(eq);
	}
	fclose(fp);
	if (st->port[0] == '\0')
		fail_msg("%s has no OBX_PGPORT", path);
}

int
t_pgmajor(void)
{
	static int major;
	struct t_stack st;

	if (major != 0)
		return major;
	t_stack_load(&st);
	if (st.major < 13 || st.major > 18)
		fail_msg("%s: OBX_PGMAJOR is missing or not 13..18 (got %d)", getenv("OBX_STACK_ENV"), st.major);
	major = st.major;
	return major;
}

int
t_pgproto(int major)
{
	if (major <= 13)
		return 1;
	if (major == 14)
		return 2;
	if (major == 15)
		return 3;
	return 4;
}

int
t_pg_has(int min_major, const char *what)
{
	int major = t_pgmajor();

	if (major >= min_major)
		return 1;
	print_message("skipped on PostgreSQL %d: %s (needs %d)\n", major, what, min_major);
	return 0;
}

int
t_run_tests(const struct CMUnitTest *tests, size_t n)
{
	const char *filter = getenv("OBX_TEST_FILTER");
	struct CMUnitTest *run;
	size_t nrun = 0;
	int r;

	if (filter == NULL || filter[0] == '\0')
		return _cmocka_run_group_tests("tests", tests, n, NULL, NULL);
	run = calloc(n, sizeof(*run));
	if (run == NULL) {
		print_error("out of memory\n");
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		char *pats = strdup(filter), *save = NULL;

		if (pats == NULL) {
			print_error("out of memory\n");
			free(run);
			return 1;
		}
		for (char *p = strtok_r(pats, ",", &save); p != NULL; p = strtok_r(NULL, ",", &save)) {
			if (fnmatch(p, tests[i].name, 0) == 0) {
				run[nrun++] = tests[i];
				break;
			}
		}
		free(pats);
	}
	if (nrun == 0) {
		print_error("OBX_TEST_FILTER=%s matches none of the %zu tests\n", filter, n);
		free(run);
		return 1;
	}
	r = _cmocka_run_group_tests("tests", run, nrun, NULL, NULL);
	free(run);
	return r;
}

int
t_pg_ctl(const struct t_stack *st, const char *args)
{
	char cmd[2048];
	int rc;

	snprintf(cmd, sizeof(cmd), "%s %s/pg_ctl -D %s -l %s/server.log -w -t 60 %s >/dev/null 2>&1",
	    getuid() == 0 ? "runuser -u postgres --" : "", st->pgbin, st->pgdata, st->root, args);
	rc = system(cmd);
	return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void
sh_or_fail(const char *what, const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	if (system(cmd) != 0)
		fail_msg("could not %s: %s", what, cmd);
}

long
t_vm_hwm_kb(pid_t pid)
{
	char path[64], line[256];
	long kb = -1;
	FILE *fp;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	fp = fopen(path, "r");
	if (fp == NULL)
		return -1;
	while (fgets(line, sizeof(line), fp) != NULL)
		if (strncmp(line, "VmHWM:", 6) == 0)
			kb = strtol(line + 6, NULL, 10);
	fclose(fp);
	return kb;
}

int
t_run_capture(const char *cmd, char *out, size_t len)
{
	FILE *fp = popen(cmd, "r");
	size_t n;
	int st;

	if (fp == NULL)
		fail_msg("could not run %s", cmd);
	n = fread(out, 1, len - 1, fp);
	out[n] = '\0';
	st = pclose(fp);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void
t_pg_save_data(const struct t_stack *st)
{
	if (t_pg_ctl(st, "stop -m fast") != 0)
		fail_msg("could not stop the server to copy its data directory");
	sh_or_fail("copy the data directory",
	    "rm -rf '%s.saved' && cp -a '%s' '%s.saved' && "
	    "rm -f '%s.saved/postmaster.pid'",
	    st->pgdata, st->pgdata, st->pgdata, st->pgdata);
	if (t_pg_ctl(st, "start") != 0)
		fail_msg("could not start the server after copying its data directory");
}

void
t_pg_restore_data(const struct t_stack *st)
{
	if (t_pg_ctl(st, "stop -m immediate") != 0)
		fail_msg("could not stop the server to restore its data directory");
	sh_or_fail("restore the data directory",
	    "test -d '%s.saved' && rm -rf '%s' && "
	    "mv '%s.saved' '%s'",
	    st->pgdata, st->pgdata, st->pgdata, st->pgdata);
	if (t_pg_ctl(st, "start") != 0)
		fail_msg("could not start the server on its restored data directory");
}

/* Loads statedir/env into st, leaving OBX_STACK_ENV as it was. */
static void
stack_load_from(struct t_stack *st, const char *statedir)
{
	char env[1024];
	const char *saved = getenv("OBX_STACK_ENV");
	char *keep = saved ? strdup(saved) : NULL;

	snprintf(env, sizeof(env), "%s/env", statedir);
	setenv("OBX_STACK_ENV", env, 1);
	t_stack_load(st);
	if (keep != NULL) {
		setenv("OBX_STACK_ENV", keep, 1);
		free(keep);
	} else {
		unsetenv("OBX_STACK_ENV");
	}
}

/* Runs tests/stack/pgstack.sh with args; fails the test with what unless it succeeds. */
static void
pgstack(const char *args, const char *what)
{
	const char *src = getenv("OBX_SOURCE_DIR");
	char cmd[2048];

	snprintf(cmd, sizeof(cmd), "%s/tests/stack/pgstack.sh %s >/dev/null", src ? src : ".", args);
	if (system(cmd) != 0)
		fail_msg("could not %s (pgstack.sh %s)", what, args);
}

void
t_stack_start_extra(struct t_stack *st, const char *statedir, const char *extra_conf_path)
{
	char args[1536];

	snprintf(args, sizeof(args), "start %s %s", statedir, extra_conf_path ? extra_conf_path : "");
	pgstack(args, "start a second cluster");
	stack_load_from(st, statedir);
}

void
t_stack_standby(struct t_stack *st, const char *primary_statedir, const char *statedir)
{
	char args[1536];

	snprintf(args, sizeof(args), "standby %s %s", primary_statedir, statedir);
	pgstack(args, "make a standby");
	stack_load_from(st, statedir);
}

void
t_stack_promote(const char *statedir)
{
	char args[1536];

	snprintf(args, sizeof(args), "promote %s", statedir);
	pgstack(args, "promote the standby");
}

void
t_stack_crash(const char *statedir)
{
	char args[1536];

	snprintf(args, sizeof(args), "stop-immediate %s", statedir);
	pgstack(args, "stop the server");
}

void
t_stack_stop_extra(const char *statedir)
{
	const char *src = getenv("OBX_SOURCE_DIR");
	char cmd[2048];

	snprintf(cmd, sizeof(cmd), "%s/tests/stack/pgstack.sh stop %s >/dev/null 2>&1", src ? src : ".", statedir);
	if (system(cmd) != 0)
		print_error("could not stop the cluster in %s\n", statedir);
}

void
t_conninfo(const struct t_stack *st, const char *db, char *buf, size_t len)
{
	snprintf(buf, len, "host=%s port=%s user=%s dbname=%s", st->host, st->port, st->user, db);
}

PGconn *
t_pg(const struct t_stack *st, const char *db, int repl)
{
	char ci[512];
	PGconn *c;

	t_conninfo(st, db, ci, sizeof(ci));
	if (repl)
		strncat(ci, " replication=database", sizeof(ci) - strlen(ci) - 1);
	c = PQconnectdb(ci);
	if (PQstatus(c) != CONNECTION_OK)
		fail_msg("could not connect to %s: %s", ci, PQerrorMessage(c));
	return c;
}

static PGresult *
vexec(PGconn *c, const char *fmt, va_list ap, char **sqlout)
{
	char *sql = NULL;
	PGresult *r;

	if (vasprintf(&sql, fmt, ap) < 0)
		fail_msg("out of memory");
	r = PQexec(c, sql);
	*sqlout = sql;
	return r;
}

void
t_exec(PGconn *c, const char *fmt, ...)
{
	va_list ap;
	char *sql;
	PGresult *r;

	va_start(ap, fmt);
	r = vexec(c, fmt, ap, &sql);
	va_end(ap);
	if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
		fail_msg("SQL failed: %.300s: %s", sql, PQresultErrorMessage(r));
	free(sql);
	PQclear(r);
}

char *
t_exec_commit_bound(PGconn *c, char **first, const char *fmt, ...)
{
	va_list ap;
	char *sql, *txn, *lsn = NULL;
	PGresult *r;
	int i = 0;

	va_start(ap, fmt);
	if (vasprintf(&sql, fmt, ap) < 0)
		fail_msg("out of memory");
	va_end(ap);
	/* one round trip: the commit record follows the LSN read just before it, and other
	 * databases can write only in the microseconds between the two */
	if (asprintf(&txn, "BEGIN; %s; SELECT pg_current_wal_insert_lsn()::text; COMMIT", sql) < 0)
		fail_msg("out of memory");
	if (!PQsendQuery(c, txn))
		fail_msg("SQL failed: %.300s: %s", sql, PQerrorMessage(c));
	if (first != NULL)
		*first = NULL;
	while ((r = PQgetResult(c)) != NULL) {
		if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
			fail_msg("SQL failed: %.300s: %s", sql, PQresultErrorMessage(r));
		if (i == 1 && first != NULL && PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0)
			*first = strdup(PQgetvalue(r, 0, 0));
		if (i == 2)
			lsn = strdup(PQgetvalue(r, 0, 0));
		PQclear(r);
		i++;
	}
	if (lsn == NULL)
		fail_msg("SQL gave no LSN: %.300s", sql);
	free(sql);
	free(txn);
	return lsn;
}

char *
t_query1(PGconn *c, const char *fmt, ...)
{
	va_list ap;
	char *sql, *v;
	PGresult *r;

	va_start(ap, fmt);
	r = vexec(c, fmt, ap, &sql);
	va_end(ap);
	if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) < 1)
		fail_msg("query failed: %.300s: %s", sql, PQresultErrorMessage(r));
	v = strdup(PQgetisnull(r, 0, 0) ? "" : PQgetvalue(r, 0, 0));
	free(sql);
	PQclear(r);
	return v;
}

void
t_create_db(const struct t_stack *st, const char *prefix, char *name, size_t len)
{
	static int n;
	PGconn *c = t_pg(st, "postgres", 0);

	snprintf(name, len, "%s_%d_%d", prefix, (int)getpid(), n++);
	t_exec(c, "DROP DATABASE IF EXISTS %s", name);
	t_exec(c, "CREATE DATABASE %s", name);
	PQfinish(c);
}

/* ---- broker ---- */

static int
read_line(int fd, char *buf, size_t len, int timeout_ms)
{
	size_t used = 0;
	int64_t deadline = t_now_ms() + timeout_ms;

	while (used + 1 < len) {
		struct pollfd p = { fd, POLLIN, 0 };
		int left = (int)(deadline - t_now_ms());
		ssize_t n;

		if (left <= 0 || poll(&p, 1, left) <= 0)
			return -1;
		n = read(fd, buf + used, 1);
		if (n <= 0)
			return -1;
		if (buf[used] == '\n') {
			buf[used] = '\0';
			return 0;
		}
		used++;
	}
	return -1;
}

void
t_broker_start(struct t_broker *b, int n)
{
	const char *path = getenv("OBX_TESTBROKER");
	int in[2], out[2];
	char nb[16], line[1024];

	memset(b, 0, sizeof(*b));
	if (path == NULL)
		fail_msg("OBX_TESTBROKER is not set");
	if (pipe(in) != 0 || pipe(out) != 0)
		fail_msg("pipe: %s", strerror(errno));
	snprintf(nb, sizeof(nb), "%d", n);
	b->pid = fork();
	if (b->pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		close(in[1]);
		close(out[0]);
		execl(path, path, "--brokers", nb, (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	b->to_fd = in[1];
	b->from_fd = out[0];
	fcntl(b->to_fd, F_SETFD, FD_CLOEXEC);
	fcntl(b->from_fd, F_SETFD, FD_CLOEXEC);
	if (read_line(b->from_fd, line, sizeof(line), 10000) != 0 || strncmp(line, "bootstrap.servers=", 18) != 0)
		fail_msg("test broker did not start");
	snprintf(b->bootstrap, sizeof(b->bootstrap), "%s", line + 18);
}

int
t_broker_cmd(struct t_broker *b, const char *fmt, ...)
{
	char cmd[512], reply[512];
	va_list ap;
	size_t len;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd) - 1, fmt, ap);
	va_end(ap);
	len = strlen(cmd);
	cmd[len++] = '\n';
	if (write(b->to_fd, cmd, len) != (ssize_t)len)
		fail_msg("broker command write failed");
	if (read_line(b->from_fd, reply, sizeof(reply), 10000) != 0)
		fail_msg("broker did not answer '%.*s'", (int)len - 1, cmd);
	if (strcmp(reply, "ok") != 0) {
		print_error("broker: %s -> %s\n", cmd, reply);
		return -1;
	}
	return 0;
}

void
t_broker_stop(struct t_broker *b)
{
	if (b->pid <= 0)
		return;
	close(b->to_fd); /* end of stdin stops it */
	if (t_wait(b->pid, 10000) == -1) {
		kill(b->pid, SIGKILL);
		waitpid(b->pid, NULL, 0);
	}
	close(b->from_fd);
	b->pid = 0;
}

/* ---- processes ---- */

pid_t
t_spawn(char *const argv[], const char *logpath)
{
	pid_t pid = fork();

	if (pid < 0)
		fail_msg("fork: %s", strerror(errno));
	if (pid == 0) {
		int fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND, 0644);

		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execv(argv[0], argv);
		_exit(127);
	}
	return pid;
}

int
t_wait(pid_t pid, int timeout_ms)
{
	int64_t deadline = t_now_ms() + timeout_ms;
	int status;

	for (;;) {
		pid_t r = waitpid(pid, &status, WNOHANG);

		if (r == pid)
			return status;
		if (r < 0)
			return -2;
		if (t_now_ms() >= deadline)
			return -1;
		usleep(10000);
	}
}

void
t_write_file(char *path, size_t len, const char *text)
{
	int fd;

	snprintf(path, len, "/tmp/obx-test.XXXXXX");
	fd = mkstemp(path);
	if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
		fail_msg("could not write temp file");
	close(fd);
}

/* ---- consumer ---- */

const char *
t_msg_header(const struct t_msg *m, const char *name)
{
	for (size_t i = 0; i < m->nheaders; i++)
		if (strcmp(m->headers[i].name, name) == 0)
			return m->headers[i].value;
	return NULL;
}

static char *
dupmem(const void *p, size_t n)
{
	char *s;

	if (p == NULL)
		return NULL;
	s = malloc(n + 1);
	memcpy(s, p, n);
	s[n] = '\0';
	return s;
}

/* how consume() ends: at want records, at the high watermarks read first, or at the end a
 * read_committed consumer sees on every partition */
enum t_until { T_UNTIL_WANT, T_UNTIL_HWM, T_UNTIL_COMMITTED_END };

static size_t consume(const char *bootstrap, const char *topic, size_t want, int timeout_ms, enum t_until until,
    struct t_msg **out);

size_t
t_consume(const char *bootstrap, const char *topic, size_t want, int timeout_ms, struct t_msg **out)
{
	return consume(bootstrap, topic, want, timeout_ms, T_UNTIL_WANT, out);
}

size_t
t_consume_all(const char *bootstrap, const char *topic, int timeout_ms, struct t_msg **out)
{
	return consume(bootstrap, topic, 0, timeout_ms, T_UNTIL_HWM, out);
}

size_t
t_consume_committed(const char *bootstrap, const char *topic, int timeout_ms, struct t_msg **out)
{
	return consume(bootstrap, topic, 0, timeout_ms, T_UNTIL_COMMITTED_END, out);
}

static size_t
consume(const char *bootstrap, const char *topic, size_t want, int timeout_ms, enum t_until until,
    struct t_msg **out)
{
	int64_t hwm[256] = { 0 }, next[256] = { 0 };
	bool at_end[256] = { false };
	bool to_hwm = until == T_UNTIL_HWM;
	int nparts;
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_topic_partition_list_t *parts;
	const struct rd_kafka_metadata *md = NULL;
	rd_kafka_topic_t *rkt;
	rd_kafka_t *rk;
	char err[512];
	struct t_msg *msgs = NULL;
	size_t n = 0, cap = 0;
	int64_t last;

	rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, err, sizeof(err));
	rd_kafka_conf_set(conf, "group.id", "obx-test", err, sizeof(err));
	rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof(err));
	rd_kafka_conf_set(conf, "log_level", "3", err, sizeof(err));
	/* records up to 128 MiB (the large-value tests) */
	rd_kafka_conf_set(conf, "receive.message.max.bytes", "200000000", err, sizeof(err));
	rd_kafka_conf_set(conf, "fetch.max.bytes", "150000000", err, sizeof(err));
	/* the end of a partition is also where its last offsets are transaction markers, which no
	 * consumer is given: a real broker's exactly-once topics end so */
	rd_kafka_conf_set(conf, "enable.partition.eof", "true", err, sizeof(err));
	if (until == T_UNTIL_COMMITTED_END)
		rd_kafka_conf_set(conf, "isolation.level", "read_committed", err, sizeof(err));
	rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
	if (rk == NULL)
		fail_msg("consumer: %s", err);
	rkt = rd_kafka_topic_new(rk, topic, NULL);
	/* wait for the topic to exist (the relay auto-creates it on first produce) */
	for (int64_t dl = t_now_ms() + timeout_ms;;) {
		rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, rkt, &md, 5000);

		if (e == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1 &&
		    md->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR && md->topics[0].partition_cnt > 0)
			break;
		if (md != NULL)
			rd_kafka_metadata_destroy(md);
		md = NULL;
		if (t_now_ms() > dl) {
			rd_kafka_topic_destroy(rkt);
			rd_kafka_destroy(rk);
			*out = NULL;
			return 0;
		}
		usleep(200000);
	}
	nparts = md->topics[0].partition_cnt;
	if (nparts > 256)
		fail_msg("%s: too many partitions", topic);
	parts = rd_kafka_topic_partition_list_new(md->topics[0].partition_cnt);
	for (int i = 0; i < md->topics[0].partition_cnt; i++) {
		int64_t lo = 0, hi = 0;

		if (rd_kafka_query_watermark_offsets(rk, topic, i, &lo, &hi, 5000) != 0)
			fail_msg("could not read watermarks of %s [%d]", topic, i);
		if (lo > 0)
			fail_msg("%s [%d]: low watermark %lld > 0: the test broker evicted records; "
			         "spread the data over more partitions or topics",
			    topic, i, (long long)lo);
		hwm[i] = hi;
		rd_kafka_topic_partition_list_add(parts, topic, i)->offset = RD_KAFKA_OFFSET_BEGINNING;
	}
	rd_kafka_metadata_destroy(md);
	rd_kafka_topic_destroy(rkt);
	if (rd_kafka_assign(rk, parts) != 0)
		fail_msg("assign failed");
	rd_kafka_topic_partition_list_destroy(parts);

	last = t_now_ms();
	for (;;) {
		if (to_hwm) {
			bool done = true;

			for (int i = 0; i < nparts; i++)
				if (next[i] < hwm[i] && !at_end[i])
					done = false;
			if (done)
				break;
		} else if (until == T_UNTIL_COMMITTED_END) {
			bool done = true;

			for (int i = 0; i < nparts; i++)
				if (!at_end[i])
					done = false;
			if (done)
				break;
		} else if (n >= want && t_now_ms() - last >= 300) {
			break;
		}
		rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
		rd_kafka_headers_t *hdrs = NULL;
		struct t_msg *t;

		if (m == NULL) {
			if (t_now_ms() - last > timeout_ms)
				break;
			continue;
		}
		if (m->err) {
			if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF && m->partition >= 0 &&
			    m->partition < nparts)
				at_end[m->partition] = true;
			rd_kafka_message_destroy(m);
			continue;
		}
		last = t_now_ms();
		if (m->partition >= 0 && m->partition < nparts) {
			next[m->partition] = m->offset + 1;
			at_end[m->partition] = false;
		}
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			msgs = realloc(msgs, cap * sizeof(*msgs));
		}
		t = &msgs[n++];
		memset(t, 0, sizeof(*t));
		t->topic = strdup(rd_kafka_topic_name(m->rkt));
		t->partition = m->partition;
		t->offset = m->offset;
		t->key = dupmem(m->key, m->key_len);
		t->value = dupmem(m->payload, m->len);
		t->len = m->len;
		t->timestamp = rd_kafka_message_timestamp(m, NULL);
		if (rd_kafka_message_headers(m, &hdrs) == 0) {
			size_t cnt = rd_kafka_header_cnt(hdrs);

			t->headers = calloc(cnt ? cnt : 1, sizeof(*t->headers));
			for (size_t i = 0; i < cnt; i++) {
				const char *name;
				const void *val;
				size_t sz;

				rd_kafka_header_get_all(hdrs, i, &name, &val, &sz);
				t->headers[i].name = strdup(name);
				t->headers[i].value = dupmem(val, sz);
			}
			t->nheaders = cnt;
		}
		rd_kafka_message_destroy(m);
	}
	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
	*out = msgs;
	return n;
}

void
t_msgs_free(struct t_msg *m, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(m[i].topic);
		free(m[i].key);
		free(m[i].value);
		for (size_t j = 0; j < m[i].nheaders; j++) {
			free(m[i].headers[j].name);
			free(m[i].headers[j].value);
		}
		free(m[i].headers);
	}
	free(m);
}

static void
msg_free_one(struct t_msg *m)
{
	free(m->topic);
	free(m->key);
	free(m->value);
	for (size_t h = 0; h < m->nheaders; h++) {
		free(m->headers[h].name);
		free(m->headers[h].value);
	}
	free(m->headers);
}

size_t
t_committed_only(const char *bootstrap, const char *slot, struct t_msg *all, size_t *nall)
{
	struct t_msg *p;
	size_t np = t_consume_all(bootstrap, "outboxd.progress", 20000, &p), kept = 0, n = *nall;

	assert_true(np > 0);
	for (size_t i = 0; i < n; i++) {
		const char *txn = t_msg_header(&all[i], "txn");
		bool committed = false;

		if (txn == NULL)
			fail_msg("record without a txn header in exactly-once mode");
		for (size_t j = 0; j < np && !committed; j++)
			committed = p[j].key != NULL && strstr(p[j].key, slot) != NULL &&
			    t_msg_header(&p[j], "txn") != NULL && strcmp(t_msg_header(&p[j], "txn"), txn) == 0;
		if (committed)
			all[kept++] = all[i];
		else
			msg_free_one(&all[i]);
	}
	t_msgs_free(p, np);
	*nall = kept;
	return n - kept;
}

long
t_pending_rows(PGconn *pg)
{
	char *v = t_query1(pg, "SELECT count(*) FROM outbox WHERE published_at IS NULL");
	long n = atol(v);

	free(v);
	return n;
}

/* ---- relay under test ---- */

void
t_exec_file(PGconn *c, const char *relpath)
{
	const char *src = getenv("OBX_SOURCE_DIR");
	char path[1024], *text;
	FILE *fp;
	long len;

	snprintf(path, sizeof(path), "%s/%s", src ? src : ".", relpath);
	fp = fopen(path, "r");
	if (fp == NULL)
		fail_msg("could not open %s", path);
	fseek(fp, 0, SEEK_END);
	len = ftell(fp);
	fseek(fp, 0, SEEK_SET);
	text = calloc(1, (size_t)len + 1);
	if (fread(text, 1, (size_t)len, fp) != (size_t)len)
		fail_msg("could not read %s", path);
	fclose(fp);
	t_exec(c, "%s", text);
	free(text);
}

void
t_kafka_load(struct t_kafka *k)
{
	const char *path = getenv("OBX_KAFKA_ENV");
	static const struct {
		const char *name;
		size_t off, len;
	} keys[] = {
#define K(n, f) { n, offsetof(struct t_kafka, f), sizeof(((struct t_kafka *)0)->f) }
		K("OBX_KAFKA_PLAINTEXT", plaintext),
		K("OBX_KAFKA_SSL", ssl),
		K("OBX_KAFKA_SSL_WRONG_NAME", ssl_wrong_name),
		K("OBX_KAFKA_SASL_SSL", sasl_ssl),
		K("OBX_KAFKA_SASL_PLAINTEXT", sasl_plaintext),
		K("OBX_KAFKA_CA", ca),
		K("OBX_KAFKA_OTHER_CA", other_ca),
		K("OBX_KAFKA_USER", user),
		K("OBX_KAFKA_PASSWORD_FILE", password_file),
		K("OBX_KAFKA_ADMIN", admin),
		K("OBX_KAFKA_ADMIN_PASSWORD_FILE", admin_password_file),
		K("OBX_KAFKA_VERSION", version),
#undef K
	};
	char line[1024];
	FILE *fp;

	memset(k, 0, sizeof(*k));
	if (path == NULL)
		fail_msg("OBX_KAFKA_ENV is not set: run the tests through ctest (the kafka fixture)");
	fp = fopen(path, "r");
	if (fp == NULL)
		fail_msg("could not open %s: %s (did the kafka fixture start?)", path, strerror(errno));
	while (fgets(line, sizeof(line), fp) != NULL) {
		char *eq = strchr(line, '=');

		line[strcspn(line, "\n")] = '\0';
		if (eq == NULL)
			continue;
		*eq++ = '\0';
		for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
			if (strcmp(line, keys[i].name) == 0)
				snprintf((char *)k + keys[i].off, keys[i].len, "%s", eq);
	}
	fclose(fp);
	snprintf(k->statedir, sizeof(k->statedir), "%s", path);
	*strrchr(k->statedir, '/') = '\0';
	if (k->plaintext[0] == '\0' || k->sasl_ssl[0] == '\0' || k->ca[0] == '\0')
		fail_msg("%s lacks the broker's listeners", path);
}

void
t_kafka_ctl(const char *cmd)
{
	struct t_kafka k;
	char sh[1400], out[4096];
	const char *src = getenv("OBX_SOURCE_DIR");
	int64_t t0 = t_now_ms();

	t_kafka_load(&k);
	if (src == NULL)
		fail_msg("OBX_SOURCE_DIR is not set");
	snprintf(sh, sizeof(sh), "bash '%s/tests/stack/kafkastack.sh' %s '%s' 2>&1", src, cmd, k.statedir);
	if (t_run_capture(sh, out, sizeof(out)) != 0)
		fail_msg("kafkastack.sh %s failed: %s", cmd, out);
	fprintf(stderr, "broker: %s took %lld ms\n", cmd, (long long)(t_now_ms() - t0));
}

void
t_kafka_grant(const struct t_kafka *k, const char *principal, const char *op, const char *type, const char *name,
    int prefixed)
{
	static const struct {
		const char *name;
		int v;
	} ops[] = { { "READ", RD_KAFKA_ACL_OPERATION_READ }, { "WRITE", RD_KAFKA_ACL_OPERATION_WRITE },
		{ "CREATE", RD_KAFKA_ACL_OPERATION_CREATE }, { "DESCRIBE", RD_KAFKA_ACL_OPERATION_DESCRIBE },
		{ "DESCRIBE_CONFIGS", RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS },
		{ "IDEMPOTENT_WRITE", RD_KAFKA_ACL_OPERATION_IDEMPOTENT_WRITE } },
	  types[] = { { "TOPIC", RD_KAFKA_RESOURCE_TOPIC }, { "GROUP", RD_KAFKA_RESOURCE_GROUP },
		  { "CLUSTER", RD_KAFKA_RESOURCE_BROKER },
		  { "TRANSACTIONAL_ID", RD_KAFKA_RESOURCE_TRANSACTIONAL_ID } };
	int o = -1, t = -1;
	char err[512];
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_t *rk;
	rd_kafka_AclBinding_t *acl;
	rd_kafka_queue_t *q;
	rd_kafka_event_t *ev;
	const rd_kafka_CreateAcls_result_t *res;
	const rd_kafka_acl_result_t **results;
	size_t nres;

	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		if (strcmp(ops[i].name, op) == 0)
			o = ops[i].v;
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
		if (strcmp(types[i].name, type) == 0)
			t = types[i].v;
	if (o < 0 || t < 0)
		fail_msg("t_kafka_grant: unknown operation %s or resource type %s", op, type);
	rd_kafka_conf_set(conf, "bootstrap.servers", k->plaintext, err, sizeof(err));
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (rk == NULL)
		fail_msg("admin client: %s", err);
	/* the cluster resource is named kafka-cluster */
	acl = rd_kafka_AclBinding_new((rd_kafka_ResourceType_t)t,
	    t == RD_KAFKA_RESOURCE_BROKER ? "kafka-cluster" : name,
	    prefixed ? RD_KAFKA_RESOURCE_PATTERN_PREFIXED : RD_KAFKA_RESOURCE_PATTERN_LITERAL, principal, "*",
	    (rd_kafka_AclOperation_t)o, RD_KAFKA_ACL_PERMISSION_TYPE_ALLOW, err, sizeof(err));
	if (acl == NULL)
		fail_msg("ACL binding: %s", err);
	q = rd_kafka_queue_new(rk);
	rd_kafka_CreateAcls(rk, &acl, 1, NULL, q);
	ev = rd_kafka_queue_poll(q, 20000);
	if (ev == NULL || rd_kafka_event_error(ev) != RD_KAFKA_RESP_ERR_NO_ERROR)
		fail_msg("CreateAcls %s %s %s:%s: %s", principal, op, type, name,
		    ev ? rd_kafka_event_error_string(ev) : "no answer in 20 s");
	res = rd_kafka_event_CreateAcls_result(ev);
	results = rd_kafka_CreateAcls_result_acls(res, &nres);
	for (size_t i = 0; i < nres; i++)
		if (rd_kafka_acl_result_error(results[i]) != NULL)
			fail_msg("CreateAcls %s %s %s:%s: %s", principal, op, type, name,
			    rd_kafka_error_string(rd_kafka_acl_result_error(results[i])));
	rd_kafka_event_destroy(ev);
	rd_kafka_AclBinding_destroy(acl);
	rd_kafka_queue_destroy(q);
	rd_kafka_destroy(rk);
}

void
t_kafka_create_topic(const struct t_kafka *k, const char *topic, int partitions, const char *config)
{
	char err[512], name[256] = "";
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_t *rk;
	rd_kafka_NewTopic_t *nt;
	rd_kafka_queue_t *q;
	rd_kafka_event_t *ev;
	const rd_kafka_topic_result_t **res;
	size_t nres;

	rd_kafka_conf_set(conf, "bootstrap.servers", k->plaintext, err, sizeof(err));
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (rk == NULL)
		fail_msg("admin client: %s", err);
	nt = rd_kafka_NewTopic_new(topic, partitions, 1, err, sizeof(err));
	if (nt == NULL)
		fail_msg("NewTopic %s: %s", topic, err);
	if (config != NULL) {
		const char *eq = strchr(config, '=');

		if (eq == NULL || (size_t)(eq - config) >= sizeof(name))
			fail_msg("topic config '%s' is not name=value", config);
		memcpy(name, config, (size_t)(eq - config));
		if (rd_kafka_NewTopic_set_config(nt, name, eq + 1) != RD_KAFKA_RESP_ERR_NO_ERROR)
			fail_msg("topic config %s", config);
	}
	q = rd_kafka_queue_new(rk);
	rd_kafka_CreateTopics(rk, &nt, 1, NULL, q);
	ev = rd_kafka_queue_poll(q, 20000);
	if (ev == NULL || rd_kafka_event_error(ev) != RD_KAFKA_RESP_ERR_NO_ERROR)
		fail_msg("CreateTopics %s: %s", topic, ev ? rd_kafka_event_error_string(ev) : "no answer in 20 s");
	res = rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &nres);
	for (size_t i = 0; i < nres; i++)
		if (rd_kafka_topic_result_error(res[i]) != RD_KAFKA_RESP_ERR_NO_ERROR)
			fail_msg("CreateTopics %s: %s", topic, rd_kafka_topic_result_error_string(res[i]));
	rd_kafka_event_destroy(ev);
	rd_kafka_NewTopic_destroy(nt);
	rd_kafka_queue_destroy(q);
	/* right after CreateTopics a partition can still lack a leader for a moment */
	for (int64_t dl = t_now_ms() + 20000;;) {
		const struct rd_kafka_metadata *md = NULL;
		rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
		bool ready = false;

		if (rd_kafka_metadata(rk, 0, rkt, &md, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1 &&
		    md->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR && md->topics[0].partition_cnt == partitions) {
			ready = true;
			for (int i = 0; i < partitions; i++)
				if (md->topics[0].partitions[i].leader < 0 || md->topics[0].partitions[i].err != 0)
					ready = false;
		}
		if (md != NULL)
			rd_kafka_metadata_destroy(md);
		rd_kafka_topic_destroy(rkt);
		if (ready)
			break;
		if (t_now_ms() > dl)
			fail_msg("topic %s has no leader for every partition 20 s after its creation", topic);
		usleep(100000);
	}
	rd_kafka_destroy(rk);
}

void
t_relay_setup_kafka(struct t_relay *r, const char *prefix, const char *kafka_conf)
{
	struct t_kafka k;

	t_kafka_load(&k);
	memset(r, 0, sizeof(*r));
	t_stack_load(&r->st);
	t_create_db(&r->st, prefix, r->db, sizeof(r->db));
	snprintf(r->slot, sizeof(r->slot), "%s", r->db);
	r->pg = t_pg(&r->st, r->db, 0);
	t_exec_file(r->pg, "sql/001_outbox.sql");
	snprintf(r->b.bootstrap, sizeof(r->b.bootstrap), "%s", k.plaintext);
	snprintf(r->kafka_conf, sizeof(r->kafka_conf), "%s", kafka_conf);
	snprintf(r->log, sizeof(r->log), "/tmp/obx-test-%s.log", r->db);
	unlink(r->log);
}

void
t_relay_setup(struct t_relay *r, const char *prefix, int bare)
{
	memset(r, 0, sizeof(*r));
	t_stack_load(&r->st);
	t_create_db(&r->st, prefix, r->db, sizeof(r->db));
	snprintf(r->slot, sizeof(r->slot), "%s", r->db);
	r->pg = t_pg(&r->st, r->db, 0);
	if (!bare)
		t_exec_file(r->pg, "sql/001_outbox.sql");
	t_broker_start(&r->b, 3);
	snprintf(r->log, sizeof(r->log), "/tmp/obx-test-%s.log", r->db);
	unlink(r->log);
}

void
t_relay_config(struct t_relay *r, const char *extra)
{
	char text[8192], ci[512], kafka[2100];

	t_conninfo(&r->st, r->db, ci, sizeof(ci));
	if (r->kafka_conf[0] != '\0')
		snprintf(kafka, sizeof(kafka), "%s", r->kafka_conf);
	else
		snprintf(kafka, sizeof(kafka), "bootstrap.servers = %s", r->b.bootstrap);
	/* an ephemeral metrics port, so instances and parallel runs never collide */
	snprintf(text, sizeof(text),
	    "[source]\nconninfo = %s\nslot = %s\nstatus_interval = 1s\n"
	    "[kafka]\n%s\n"
	    "[log]\n%slevel = debug\n%s%s",
	    ci, r->slot, kafka, extra != NULL && strstr(extra, "format = ") != NULL ? "" : "format = text\n",
	    extra != NULL && strstr(extra, "[metrics]") != NULL ? "" : "[metrics]\nlisten = 127.0.0.1:0\n",
	    extra ? extra : "");
	if (r->conf[0] != '\0')
		unlink(r->conf);
	t_write_file(r->conf, sizeof(r->conf), text);
}

void
t_relay_start(struct t_relay *r, const char *arg, int wait)
{
	const char *bin = r->bin ? r->bin : getenv("OBX_OUTBOXD");
	char *argv[6];
	int n = 0;
	/* creating a slot waits for the server's next running-transactions record, up to 15 s and
	 * sometimes twice on a server other programs keep busy */
	int64_t deadline = t_now_ms() + 60000;

	if (bin == NULL)
		fail_msg("OBX_OUTBOXD is not set");
	argv[n++] = (char *)bin;
	argv[n++] = "run";
	argv[n++] = "-c";
	argv[n++] = r->conf;
	if (arg != NULL)
		argv[n++] = (char *)arg;
	argv[n] = NULL;
	{
		int before = t_log_count(r, "streaming from slot");

		r->pid = t_spawn(argv, r->log);
		while (wait && t_log_count(r, "streaming from slot") == before) {
			if (t_now_ms() > deadline || waitpid(r->pid, NULL, WNOHANG) == r->pid) {
				t_log_dump(r);
				fail_msg("outboxd did not start streaming");
			}
			usleep(20000);
		}
	}
}

void
t_relay_twin(const struct t_relay *r, struct t_relay *twin, const char *tag)
{
	*twin = *r;
	twin->pid = 0;
	snprintf(twin->log, sizeof(twin->log), "/tmp/obx-test-%s.%s.log", r->db, tag);
	unlink(twin->log);
}

void
t_relay_twin_stop(struct t_relay *twin)
{
	if (twin->pid > 0) {
		kill(twin->pid, SIGKILL);
		waitpid(twin->pid, NULL, 0);
		twin->pid = 0;
	}
	unlink(twin->log);
}

int
t_relay_signal(struct t_relay *r, int sig, int timeout_ms)
{
	int st;

	if (r->pid <= 0)
		return -1;
	kill(r->pid, sig);
	st = t_wait(r->pid, timeout_ms);
	if (st != -1)
		r->pid = 0;
	return st;
}

void
t_relay_teardown(struct t_relay *r)
{
	if (r->pid > 0) {
		kill(r->pid, SIGKILL);
		waitpid(r->pid, NULL, 0);
		r->pid = 0;
	}
	t_broker_stop(&r->b);
	if (r->pg != NULL)
		PQfinish(r->pg);
	r->pg = NULL;
	/* the cluster is shared by the whole run: give back the slot and the database */
	if (r->db[0] != '\0' && r->st.port[0] != '\0') {
		char ci[512];
		PGconn *c;

		t_conninfo(&r->st, "postgres", ci, sizeof(ci));
		c = PQconnectdb(ci);
		for (int i = 0; i < 100 && PQstatus(c) == CONNECTION_OK; i++) {
			char sql[256];
			PGresult *res;
			int busy;

			snprintf(sql, sizeof(sql),
			    "SELECT count(*) FROM pg_replication_slots WHERE database = '%s' "
			    "AND active",
			    r->db);
			res = PQexec(c, sql);
			busy = PQresultStatus(res) == PGRES_TUPLES_OK && atoi(PQgetvalue(res, 0, 0)) > 0;
			PQclear(res);
			if (!busy)
				break;
			usleep(100000);
		}
		if (PQstatus(c) == CONNECTION_OK) {
			char sql[512];

			snprintf(sql, sizeof(sql),
			    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
			    "WHERE database = '%s' AND NOT active",
			    r->db);
			PQclear(PQexec(c, sql));
			snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s WITH (FORCE)", r->db);
			PQclear(PQexec(c, sql));
		}
		PQfinish(c);
		r->db[0] = '\0';
	}
	if (r->conf[0] != '\0')
		unlink(r->conf);
	unlink(r->log);
}

int
t_log_count(const struct t_relay *r, const char *needle)
{
	FILE *fp = fopen(r->log, "r");
	char line[4096];
	int n = 0;

	if (fp == NULL)
		return 0;
	while (fgets(line, sizeof(line), fp) != NULL)
		if (strstr(line, needle) != NULL)
			n++;
	fclose(fp);
	return n;
}

void
t_log_dump(const struct t_relay *r)
{
	FILE *fp = fopen(r->log, "r");
	char line[4096];

	if (fp == NULL)
		return;
	while (fgets(line, sizeof(line), fp) != NULL)
		if (strstr(line, " kafka ") == NULL)
			print_error("outboxd| %s", line);
	fclose(fp);
}

uint64_t
t_lsn(const char *s)
{
	unsigned hi = 0, lo = 0;

	if (s == NULL || sscanf(s, "%X/%X", &hi, &lo) != 2)
		return 0;
	return ((uint64_t)hi << 32) | lo;
}

uint64_t
t_slot_confirmed(struct t_relay *r)
{
	char *v = t_query1(r->pg,
	    "SELECT coalesce((SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
	    "WHERE slot_name = '%s'), '0/0')",
	    r->slot);
	uint64_t l = t_lsn(v);

	free(v);
	return l;
}

void
t_slot_wait_inactive(struct t_relay *r, int timeout_ms)
{
	int64_t deadline = t_now_ms() + timeout_ms;

	for (;;) {
		char *v = t_query1(r->pg,
		    "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '%s' "
		    "AND active",
		    r->slot);
		int active = atoi(v);

		free(v);
		if (!active)
			return;
		if (t_now_ms() > deadline)
			fail_msg("slot %s still active", r->slot);
		usleep(50000);
	}
}

int
t_wait_confirmed_current(struct t_relay *r, int timeout_ms)
{
	char *end = t_query1(r->pg, "SELECT pg_current_wal_lsn()");
	uint64_t want = t_lsn(end);
	int64_t deadline = t_now_ms() + timeout_ms;

	free(end);
	while (t_slot_confirmed(r) < want && t_now_ms() < deadline)
		usleep(50000);
	return t_slot_confirmed(r) >= want;
}

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

int
t_http_get(int port, const char *path, char *body, size_t len)
{
	struct sockaddr_in a;
	char req[512];
	static char buf[1 << 20];
	size_t used = 0;
	ssize_t n;
	int fd, status = -1;
	char *sep;

	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n", path);
	if (write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
		close(fd);
		return -1;
	}
	while (used + 1 < sizeof(buf) && (n = read(fd, buf + used, sizeof(buf) - 1 - used)) > 0)
		used += (size_t)n;
	close(fd);
	buf[used] = '\0';
	if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1)
		return -1;
	sep = strstr(buf, "\r\n\r\n");
	snprintf(body, len, "%s", sep ? sep + 4 : "");
	return status;
}

int
t_metrics_port(const struct t_relay *r)
{
	int64_t deadline = t_now_ms() + 10000;

	while (t_now_ms() < deadline) {
		FILE *fp = fopen(r->log, "r");
		char line[4096];
		int port = -1;

		while (fp != NULL && fgets(line, sizeof(line), fp) != NULL) {
			char *p = strstr(line, "metrics and health on ");

			if (p != NULL && (p = strchr(p + 22, ':')) != NULL)
				port = atoi(p + 1);
		}
		if (fp != NULL)
			fclose(fp);
		if (port > 0)
			return port;
		usleep(50000);
	}
	fail_msg("outboxd did not log its metrics port");
	return -1;
}

double
t_metric(const char *body, const char *name)
{
	size_t len = strlen(name);

	for (const char *p = body; p != NULL && *p != '\0'; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
		if (strncmp(p, name, len) == 0 && p[len] == ' ')
			return atof(p + len + 1);
	}
	return -1;
}

/* ---- helpers several test programs share ---- */

void
t_insert_events(struct t_relay *r, const char *agg, int from, int to)
{
	for (int i = from; i < to; i++)
		t_exec(r->pg,
		    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
		    "VALUES ('%s', 'k%d', 'E', '{\"i\": %d}')",
		    agg, i % 11, i);
}

size_t
t_expect_all_published(struct t_relay *r, const char *agg, int timeout_ms)
{
	char topic[128];
	struct t_msg *m;
	size_t n;
	PGresult *res;

	snprintf(topic, sizeof(topic), "outbox.event.%s", agg);
	/* once the slot confirmed everything, the topic holds every event */
	if (!t_wait_confirmed_current(r, timeout_ms)) {
		t_log_dump(r);
		fail_msg("outboxd did not confirm up to the server's WAL position");
	}
	n = t_consume_all(r->b.bootstrap, topic, 20000, &m);
	res = PQexec(r->pg, "SELECT id::text FROM outbox");
	for (int i = 0; i < PQntuples(res); i++) {
		size_t c = 0;

		for (size_t j = 0; j < n; j++)
			if (strcmp(t_msg_header(&m[j], "id"), PQgetvalue(res, i, 0)) == 0)
				c++;
		if (c == 0) {
			t_log_dump(r);
			fail_msg("committed event %s never published (%zu records read)", PQgetvalue(res, i, 0),
			    n);
		}
	}
	PQclear(res);
	t_msgs_free(m, n);
	return n;
}

void
t_insert_txn(struct t_relay *r, const char *agg, int n, int nkeys)
{
	t_exec(r->pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT '%s', 'k' || (g %% %d), 'T', jsonb_build_object('i', g) FROM generate_series(0, %d) g",
	    agg, nkeys, n - 1);
}

void
t_run_until_killed_after_acks(struct t_relay *r, int n, const char *agg, int nkeys)
{
	char v[32];
	int st;

	snprintf(v, sizeof(v), "%d", n);
	setenv("OBX_TEST_KILL_AFTER_ACKS", v, 1);
	t_relay_start(r, NULL, 1);
	unsetenv("OBX_TEST_KILL_AFTER_ACKS");
	if (agg != NULL)
		t_insert_txn(r, agg, n, nkeys);
	st = t_wait(r->pid, 60000);
	if (st == -1 || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
		t_log_dump(r);
		fail_msg("outboxd did not kill itself after %d acknowledgements", n);
	}
	r->pid = 0;
	t_slot_wait_inactive(r, 15000);
}

size_t
t_count_id(const struct t_msg *m, size_t n, const char *id)
{
	size_t c = 0;

	for (size_t i = 0; i < n; i++) {
		const char *v = t_msg_header(&m[i], "id");

		if (v != NULL && strcmp(v, id) == 0)
			c++;
	}
	return c;
}

double
t_relay_metric(struct t_relay *r, const char *name)
{
	static char body[1 << 16];

	if (t_http_get(t_metrics_port(r), "/metrics", body, sizeof(body)) != 200)
		fail_msg("could not read /metrics");
	return t_metric(body, name);
}

int
t_cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

size_t
t_count_header(const struct t_msg *m, size_t n, const char *header, const char *value)
{
	size_t c = 0;

	for (size_t i = 0; i < n; i++) {
		const char *v = t_msg_header(&m[i], header);

		if (v != NULL && strcmp(v, value) == 0)
			c++;
	}
	return c;
}
