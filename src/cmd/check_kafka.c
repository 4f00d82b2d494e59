/*
 * cmd/check_kafka.c - what "outboxd check" says of the broker: reachable,
 * the topics a sample of the outbox's rows map to, and exactly-once's
 * progress topic (see cmd/check_int.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "obx/cmd/check_int.h"
#include "obx/core/err.h"
#include "obx/core/template.h"
#include "obx/kafka/producer.h"

/*
 * The topic template as an SQL expression over the outbox's columns.
 * Returns 0 with *out set (the caller frees it), OBX_ENOMEM, or the code of
 * a template that does not parse (the configuration's loader refuses it
 * first); *out is NULL unless 0 is returned.
 */
static int
template_sql(PGconn *conn, const char *topic, char **out)
{
	struct obx_template tpl;
	char errbuf[256];
	size_t len = 0;
	FILE *fp;
	int r;

	*out = NULL;
	if ((r = obx_template_parse(&tpl, topic, errbuf, sizeof(errbuf))) != 0)
		return r;
	fp = open_memstream(out, &len);
	if (fp == NULL) {
		obx_template_reset(&tpl);
		*out = NULL;
		return OBX_ENOMEM;
	}
	fputs("''", fp);
	for (size_t i = 0; i < tpl.nparts; i++) {
		const struct obx_template_part *part = &tpl.parts[i];
		char *e;

		if (part->is_column) {
			e = PQescapeIdentifier(conn, part->text, strlen(part->text));
			fprintf(fp, " || %s::text", e ? e : "NULL");
		} else {
			e = PQescapeLiteral(conn, part->text, strlen(part->text));
			fprintf(fp, " || %s", e ? e : "''");
		}
		PQfreemem(e);
	}
	fclose(fp);
	obx_template_reset(&tpl);
	return *out != NULL ? 0 : OBX_ENOMEM;
}

/* The first login the broker refused, from the error callback. */
struct refused {
	bool seen;
	char reason[512];
};

static void
check_error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	struct refused *rf = opaque;

	(void)rk;
	if (err == RD_KAFKA_RESP_ERR__AUTHENTICATION && !rf->seen) {
		rf->seen = true;
		snprintf(rf->reason, sizeof(rf->reason), "%s", reason);
	}
}

void
obx_check_kafka(struct obx_check *cx, PGconn *conn, const struct obx_config *cfg, bool has_table)
{
	const struct rd_kafka_metadata *md = NULL;
	struct refused rf = { false, "" };
	rd_kafka_conf_t *conf;
	rd_kafka_resp_err_t e;
	rd_kafka_t *rk;
	char err[512], login[200];

	conf = obx_kafka_conf(cfg, err, sizeof(err));
	if (conf == NULL) {
		obx_check_report(cx, "FAIL", "broker: %s", err);
		return;
	}
	rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
	obx_kafka_describe_login(conf, login, sizeof(login));
	rd_kafka_conf_set_error_cb(conf, check_error_cb);
	rd_kafka_conf_set_opaque(conf, &rf);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (rk == NULL) {
		rd_kafka_conf_destroy(conf);
		obx_check_report(cx, "FAIL", "broker: could not create a producer: %s", err);
		return;
	}
	e = rd_kafka_metadata(rk, 1, NULL, &md, 10000);
	if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
		rd_kafka_poll(rk, 0); /* the error callback: a refused login */
	if (e != RD_KAFKA_RESP_ERR_NO_ERROR && rf.seen) {
		obx_check_report(cx, "FAIL", "broker: %s refused the login (%s): %s",
		    obx_config_kafka_get(cfg, "bootstrap.servers"), login, rf.reason);
		rd_kafka_destroy(rk);
		return;
	}
	if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
		obx_check_report(cx, "FAIL", "broker: could not reach %s: %s",
		    obx_config_kafka_get(cfg, "bootstrap.servers"), rd_kafka_err2str(e));
		rd_kafka_destroy(rk);
		return;
	}
	obx_check_report(cx, "ok", "broker: reachable, %d broker(s), %d topic(s)", md->broker_cnt, md->topic_cnt);
	if (has_table) {
		char *expr = NULL, *tq = NULL, *sql = NULL;
		int missing = 0, total = 0;
		PGresult *r = NULL;

		(void)template_sql(conn, cfg->topic, &expr); /* expr NULL: "out of memory" below */
		tq = PQescapeIdentifier(conn, cfg->table_name, strlen(cfg->table_name));
		if (expr != NULL && tq != NULL) {
			char *sq = PQescapeIdentifier(conn, cfg->table_schema, strlen(cfg->table_schema));

			/* a sample, never the whole outbox (which may hold millions of kept rows) */
			if (sq != NULL &&
			    asprintf(&sql,
			        "SELECT DISTINCT %s FROM (SELECT * FROM %s.%s LIMIT 10000) s "
			        "LIMIT 1000",
			        expr, sq, tq) > 0)
				r = PQexec(conn, sql);
			PQfreemem(sq);
		}
		if (r != NULL && PQresultStatus(r) == PGRES_TUPLES_OK) {
			for (int i = 0; i < PQntuples(r); i++) {
				const char *t = PQgetvalue(r, i, 0);
				int found = 0;

				if (PQgetisnull(r, i, 0))
					continue;
				total++;
				for (int j = 0; j < md->topic_cnt && !found; j++)
					found = strcmp(md->topics[j].topic, t) == 0;
				if (!found) {
					obx_check_report(cx, "WARN",
					    "topic: %s does not exist (create it, or allow auto-creation)", t);
					missing++;
				}
			}
			if (total == 0)
				obx_check_report(cx, "ok",
				    "topics: the outbox is empty; topic names come from '%s' at run time",
				    cfg->topic);
			else if (missing == 0)
				obx_check_report(cx, "ok",
				    "topics: all %d topic(s) the outbox's rows map to exist", total);
		} else {
			obx_check_report(cx, "FAIL", "topics: template '%s' does not fit the outbox's columns: %s",
			    cfg->topic, r ? PQresultErrorMessage(r) : "out of memory");
		}
		PQclear(r);
		free(sql);
		free(expr);
		PQfreemem(tq);
	}
	if (cfg->exactly_once) {
		int parts = -1;

		for (int j = 0; j < md->topic_cnt && parts < 0; j++)
			if (strcmp(md->topics[j].topic, cfg->progress_topic) == 0)
				parts = md->topics[j].partition_cnt;
		if (parts >= 0)
			obx_check_report(cx, "ok", "exactly-once: progress topic %s exists (%d partition(s))",
			    cfg->progress_topic, parts);
		else
			obx_check_report(cx, "WARN",
			    "exactly-once: progress topic %s does not exist (create it with "
			    "cleanup.policy=compact, or allow auto-creation)",
			    cfg->progress_topic);
	}
	rd_kafka_metadata_destroy(md);
	rd_kafka_destroy(rk);
}
