/*
 * obx-testbroker - a Kafka-protocol test broker on loopback, built on
 * librdkafka's mock cluster, with fault injection driven by commands.
 *
 * Prints "bootstrap.servers=HOST:PORT,..." on stdout once listening, then
 * reads one command per line on stdin and answers each with "ok" or
 * "error: ..." on stdout.  Exits on "quit", on end of stdin (unless
 * --no-stdin), or on SIGTERM/SIGINT.
 *
 * Commands:
 *   down ID | up ID             take broker ID (1..N) down / up
 *   rtt ID MS                   add MS milliseconds of round-trip time
 *   produce-errors CNT ERRNAME  next CNT Produce requests fail with ERRNAME
 *   request-errors API CNT ERR  same for any API key (number)
 *   clear [API]                 drop queued request errors of API (Produce)
 *   topic NAME PARTITIONS       create a topic (replication min(3, N))
 *   topic-error NAME ERRNAME    make the topic report ERRNAME in metadata
 *   bootstrap                   print the bootstrap servers again
 *   quit
 * ERRNAME is a Kafka error name such as NOT_ENOUGH_REPLICAS (with or
 * without the RD_KAFKA_RESP_ERR_ prefix) or NO_ERROR.
 */
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

static volatile sig_atomic_t stop_requested;

static void
on_signal(int sig)
{
	(void)sig;
	stop_requested = 1;
}

static int
err_by_name(const char *name, rd_kafka_resp_err_t *out)
{
	const struct rd_kafka_err_desc *descs;
	size_t cnt;

	if (strncmp(name, "RD_KAFKA_RESP_ERR_", 18) == 0)
		name += 18;
	if (strcmp(name, "NO_ERROR") == 0) {
		*out = RD_KAFKA_RESP_ERR_NO_ERROR;
		return 0;
	}
	rd_kafka_get_err_descs(&descs, &cnt);
	for (size_t i = 0; i < cnt; i++) {
		if (descs[i].name != NULL && strcmp(descs[i].name, name) == 0) {
			*out = descs[i].code;
			return 0;
		}
	}
	return -1;
}

static int
parse_int(const char *s, long min, long max, long *out)
{
	char *end;
	long v;

	if (s == NULL)
		return -1;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || *end != '\0' || end == s || v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

/* Runs one command line; writes the reply to out (one line, no newline). */
static int
run_command(rd_kafka_mock_cluster_t *mc, int nbrokers, char *line, char *out, size_t outlen)
{
	char *argv[8];
	int argc = 0;
	long id, v, cnt;
	rd_kafka_resp_err_t err;
	rd_kafka_resp_err_t res;

	for (char *tok = strtok(line, " \t\r\n"); tok != NULL && argc < 8; tok = strtok(NULL, " \t\r\n"))
		argv[argc++] = tok;
	if (argc == 0) {
		snprintf(out, outlen, "error: empty command");
		return 0;
	}
	if ((strcmp(argv[0], "down") == 0 || strcmp(argv[0], "up") == 0) && argc == 2) {
		if (parse_int(argv[1], 1, nbrokers, &id) != 0)
			goto bad_broker;
		res = argv[0][0] == 'd' ? rd_kafka_mock_broker_set_down(mc, (int32_t)id) :
		                          rd_kafka_mock_broker_set_up(mc, (int32_t)id);
		goto result;
	}
	if (strcmp(argv[0], "rtt") == 0 && argc == 3) {
		if (parse_int(argv[1], 1, nbrokers, &id) != 0)
			goto bad_broker;
		if (parse_int(argv[2], 0, 3600000, &v) != 0) {
			snprintf(out, outlen, "error: rtt: bad milliseconds '%s'", argv[2]);
			return 0;
		}
		res = rd_kafka_mock_broker_set_rtt(mc, (int32_t)id, (int)v);
		goto result;
	}
	if ((strcmp(argv[0], "produce-errors") == 0 && argc == 3) ||
	    (strcmp(argv[0], "request-errors") == 0 && argc == 4)) {
		bool produce = argv[0][0] == 'p';
		long api = 0;
		rd_kafka_resp_err_t *errs;

		if (!produce && parse_int(argv[1], 0, 100, &api) != 0) {
			snprintf(out, outlen, "error: bad API key '%s'", argv[1]);
			return 0;
		}
		if (parse_int(argv[produce ? 1 : 2], 1, 100000, &cnt) != 0) {
			snprintf(out, outlen, "error: bad count '%s'", argv[produce ? 1 : 2]);
			return 0;
		}
		if (err_by_name(argv[produce ? 2 : 3], &err) != 0) {
			snprintf(out, outlen, "error: unknown error name '%s'", argv[produce ? 2 : 3]);
			return 0;
		}
		errs = calloc((size_t)cnt, sizeof(*errs));
		if (errs == NULL) {
			snprintf(out, outlen, "error: out of memory");
			return 0;
		}
		for (long i = 0; i < cnt; i++)
			errs[i] = err;
		rd_kafka_mock_push_request_errors_array(mc, (int16_t)api, (size_t)cnt, errs);
		free(errs);
		snprintf(out, outlen, "ok");
		return 0;
	}
	if (strcmp(argv[0], "clear") == 0 && argc <= 2) {
		long api = 0; /* Produce */

		if (argc == 2 && parse_int(argv[1], 0, 100, &api) != 0) {
			snprintf(out, outlen, "error: bad API key '%s'", argv[1]);
			return 0;
		}
		rd_kafka_mock_clear_request_errors(mc, (int16_t)api);
		snprintf(out, outlen, "ok");
		return 0;
	}
	if (strcmp(argv[0], "topic") == 0 && argc == 3) {
		if (parse_int(argv[2], 1, 1000, &v) != 0) {
			snprintf(out, outlen, "error: bad partition count '%s'", argv[2]);
			return 0;
		}
		res = rd_kafka_mock_topic_create(mc, argv[1], (int)v, nbrokers < 3 ? nbrokers : 3);
		goto result;
	}
	if (strcmp(argv[0], "topic-error") == 0 && argc == 3) {
		if (err_by_name(argv[2], &err) != 0) {
			snprintf(out, outlen, "error: unknown error name '%s'", argv[2]);
			return 0;
		}
		rd_kafka_mock_topic_set_error(mc, argv[1], err);
		snprintf(out, outlen, "ok");
		return 0;
	}
	if (strcmp(argv[0], "bootstrap") == 0 && argc == 1) {
		snprintf(out, outlen, "bootstrap.servers=%s", rd_kafka_mock_cluster_bootstraps(mc));
		return 0;
	}
	if (strcmp(argv[0], "quit") == 0 && argc == 1) {
		snprintf(out, outlen, "ok");
		return 1;
	}
	snprintf(out, outlen, "error: unknown command or wrong arguments: %s", argv[0]);
	return 0;
bad_broker:
	snprintf(out, outlen, "error: broker id must be 1..%d", nbrokers);
	return 0;
result:
	if (res != RD_KAFKA_RESP_ERR_NO_ERROR)
		snprintf(out, outlen, "error: %s", rd_kafka_err2str(res));
	else
		snprintf(out, outlen, "ok");
	return 0;
}

int
main(int argc, char **argv)
{
	int nbrokers = 3;
	bool use_stdin = true;
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;
	rd_kafka_mock_cluster_t *mc;
	char errstr[512];
	char line[4096];
	size_t used = 0;
	struct sigaction sa;

	for (int i = 1; i < argc; i++) {
		long v;

		if (strcmp(argv[i], "--brokers") == 0 && i + 1 < argc && parse_int(argv[i + 1], 1, 16, &v) == 0) {
			nbrokers = (int)v;
			i++;
		} else if (strcmp(argv[i], "--no-stdin") == 0) {
			use_stdin = false;
		} else {
			fprintf(stderr, "usage: obx-testbroker [--brokers N] [--no-stdin]\n");
			return 2;
		}
	}

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	conf = rd_kafka_conf_new();
	rd_kafka_conf_set(conf, "log_level", "3", errstr, sizeof(errstr));
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (rk == NULL) {
		fprintf(stderr, "obx-testbroker: could not create handle: %s\n", errstr);
		return 1;
	}
	mc = rd_kafka_mock_cluster_new(rk, nbrokers);
	if (mc == NULL) {
		fprintf(stderr, "obx-testbroker: could not create mock cluster\n");
		rd_kafka_destroy(rk);
		return 1;
	}
	printf("bootstrap.servers=%s\n", rd_kafka_mock_cluster_bootstraps(mc));
	fflush(stdout);

	while (!stop_requested) {
		struct pollfd pfd = { STDIN_FILENO, POLLIN, 0 };
		ssize_t n;
		char *nl;

		if (!use_stdin) {
			pause();
			continue;
		}
		if (poll(&pfd, 1, 500) <= 0)
			continue;
		n = read(STDIN_FILENO, line + used, sizeof(line) - 1 - used);
		if (n <= 0) {
			if (n < 0 && errno == EINTR)
				continue;
			break; /* end of stdin: the driver is gone */
		}
		used += (size_t)n;
		line[used] = '\0';
		while ((nl = strchr(line, '\n')) != NULL) {
			char reply[1024];
			int quit;

			*nl = '\0';
			quit = run_command(mc, nbrokers, line, reply, sizeof(reply));
			printf("%s\n", reply);
			fflush(stdout);
			used -= (size_t)(nl + 1 - line);
			memmove(line, nl + 1, used + 1);
			if (quit)
				stop_requested = 1;
		}
		if (used == sizeof(line) - 1)
			used = 0; /* overlong line: drop it */
	}
	rd_kafka_mock_cluster_destroy(mc);
	rd_kafka_destroy(rk);
	return 0;
}
