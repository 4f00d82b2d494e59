#!/usr/bin/env python3
"""End-to-end benchmarks of outboxd against the limits measured in the same run.

    python3 bench/run.py [--runs 3] [--scale 1.0] [--latency-seconds 20] [--shapes abc]

Builds outboxd without sanitizers (build-bench/), starts the tests' PostgreSQL
15 (tuned like a production server, fsync on) and Kafka test broker, then for
each workload shape creates the slots first, loads the events with pgbench (8
clients) and measures on that very WAL:

  1. bench_repl, a minimal replication client in C: the same slot kind,
     publication and pgoutput protocol as outboxd, acknowledging as it goes
     and doing nothing else: the server's own send rate (the reference);
  2. pg_recvlogical with pgoutput (same protocol and publication) to
     /dev/null up to the end LSN: a second reference;
  3. bench_kafka produce: the same number and size of records with
     outboxd's producer settings: the broker's limit;
  4. outboxd from process start until every event is acknowledged and the
     slot's confirmed_flush_lsn reached the end LSN: events/s, peak RSS, CPU
     seconds per 1,000 events, start-up time (process start to the first
     CopyData message, which carries the first event of the backlog).

Then polling mode ([source] mode = poll) on the same rows, for the shapes of
--poll-shapes (a by default): sql/008_polling.sql is applied, every row is
made pending again before each run, and outboxd runs in polling mode from
process start until no row is pending: events/s beside the log-based
source's from this run (target: at least half).

Then the cost of restart de-duplication's read-backs ([delivery] dedupe): the
same backlog over 8 topics, whose partitions already hold older outboxd
records, published by outboxd with dedupe on and off on copies of one slot:
start to the first acknowledged event and to the end of the backlog, as
ratios on / off (--dedupe-events 0 skips it).

Then the delivery modes (--delivery-events 0 skips it): the same backlog of
1-event transactions drained at-least-once (dedupe off), with restart
de-duplication (dedupe on) and exactly-once, and commit-to-visible latency
at --delivery-rate for each, as ratios and differences to at-least-once.

Then latency: pgbench --rate commits 1-event transactions at 1,000 and 5,000
events/s while a consumer records commit-to-receive time (commit_ts header);
the floor is a bare producer (librdkafka's defaults except acks=all,
idempotence and linger.ms=0) sending at the same rate straight to the broker,
and pg_recvlogical with commit timestamps shows the server's own share.
Every figure is the median of the runs, with min and max.  The targets are
ratios to references of the same run; each prints PASS or MISS.  Results:
bench/results/<time>.md and .json (git-ignored).

Then several tables (--tables, '' skips it): for 1, 10, 100 and 1,000 tenant
tables (schema t<i>, table outbox) one outboxd with `table = t*.outbox` (a
publication FOR ALL TABLES) drains a backlog spread over all of them: events/s,
peak RSS, CPU seconds per 1,000 events, start-up (process start to the first
replication message) and restart (SIGTERM, then start to streaming); beside it,
where slots allow (--per-table-max, 10), one outboxd per table, each with its
slot and a publication of its table, on the same backlog: the sum of their
RSS and CPU and the rate of the whole.

--outboxd-kafka KEY=VALUE (repeatable) adds producer settings to outboxd's
configuration, to compare a setting with the default in the same way.
"""
import argparse
import datetime
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build-bench")
PGBIN = os.environ.get("OBX_PGBIN", "/usr/lib/postgresql/15/bin")

SHAPES = {
    # name: (events, events per transaction, payload bytes, description)
    "a": (50000, 1, 300, "1 event/txn, 300 B"),
    "b": (200000, 100, 300, "100 events/txn, 300 B"),
    "c": (20000, 1, 16384, "1 event/txn, 16 KiB incompressible (TOASTed)"),
    # the memory bound with the largest events the target covers
    "d": (1000, 1, 1048576, "1 event/txn, 1 MiB (memory bound)"),
}
# outboxd / the minimal replication client, per shape
TARGETS = {"a": 0.95, "b": 0.95, "c": 0.95, "d": 0.95}
RSS_TARGET_MIB = 20.0      # peak RSS on shapes a, b and c
RSS_SHAPES = "abc"
STARTUP_TARGET_MS = 50.0   # process start to the first event
POLL_TARGET = 0.5          # polling mode / the log-based source, same rows, same run
P99_TARGETS_MS = {1000: 1.0, 5000: 3.0}  # p99 above the bare producer's, by rate
FLOOR_SANE_P50_MS = 50.0   # a bare producer slower than this at its median (beside the load: also p99) is no floor

PG_TUNING = """
shared_buffers = 512MB
max_wal_size = 8GB
min_wal_size = 1GB
checkpoint_timeout = 30min
wal_buffers = 64MB
max_connections = 100
wal_sender_timeout = 60s
"""


def log(msg):
    print("bench: " + msg, file=sys.stderr, flush=True)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


class Stack:
    """The tests' PostgreSQL (tests/stack/pgstack.sh) and one broker: the test broker, or with
    broker="kafka" a single-node Apache Kafka (tests/stack/kafkastack.sh)."""

    def __init__(self, broker="test"):
        self.kind = broker
        self.dir = tempfile.mkdtemp(prefix="obx-bench.")
        os.chmod(self.dir, 0o755)
        conf = os.path.join(self.dir, "tuning.conf")
        with open(conf, "w") as f:
            f.write(PG_TUNING)
        os.chmod(conf, 0o644)
        run([os.path.join(ROOT, "tests/stack/pgstack.sh"), "start", os.path.join(self.dir, "pg"), conf])
        self.env = {}
        with open(os.path.join(self.dir, "pg", "env")) as f:
            for line in f:
                k, _, v = line.strip().partition("=")
                self.env[k] = v
        self.host, self.port = self.env["OBX_PGHOST"], self.env["OBX_PGPORT"]
        if broker == "kafka":
            run([os.path.join(ROOT, "tests/stack/kafkastack.sh"), "start", os.path.join(self.dir, "kafka")])
            with open(os.path.join(self.dir, "kafka", "env")) as f:
                kenv = dict(line.strip().partition("=")[::2] for line in f if "=" in line)
            self.bootstrap = kenv["OBX_KAFKA_PLAINTEXT"]
            self.broker = None
            return
        self.broker = subprocess.Popen([os.path.join(BUILD, "tests", "obx-testbroker"), "--brokers", "1"],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.broker.stdout.readline().strip()
        if not line.startswith("bootstrap.servers="):
            raise SystemExit("bench: the test broker did not start: %r" % line)
        self.bootstrap = line.split("=", 1)[1]

    def broker_cmd(self, cmd):
        if self.broker is None:
            # the real broker: only "topic NAME PARTITIONS" is asked of it, through the admin API
            word, name, parts = cmd.split()
            if word != "topic":
                raise SystemExit("bench: %r is the test broker's alone" % cmd)
            run([os.path.join(BUILD, "bench_kafka"), "topic", self.bootstrap, name, parts])
            return
        self.broker.stdin.write(cmd + "\n")
        self.broker.stdin.flush()
        answer = self.broker.stdout.readline().strip()
        if answer != "ok":
            raise SystemExit("bench: broker command %r: %s" % (cmd, answer))

    def psql(self, db, sql):
        return run([os.path.join(PGBIN, "psql"), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1",
                    "-h", self.host, "-p", self.port, "-U", "postgres", "-d", db, "-c", sql]).stdout.strip()

    def proto(self):
        """The pgoutput protocol outboxd asks this server for (src/core/pgversion.c)."""
        v = int(self.psql("postgres", "SHOW server_version_num"))
        return 4 if v >= 160000 else 3 if v >= 150000 else 2 if v >= 140000 else 1

    def conninfo(self, db):
        return "host=%s port=%s user=postgres dbname=%s" % (self.host, self.port, db)

    def close(self):
        if self.broker is None:
            subprocess.run([os.path.join(ROOT, "tests/stack/kafkastack.sh"), "stop", os.path.join(self.dir, "kafka")])
        else:
            try:
                self.broker.stdin.close()
                self.broker.wait(timeout=10)
            except Exception:
                self.broker.kill()
        subprocess.run([os.path.join(ROOT, "tests/stack/pgstack.sh"), "stop", os.path.join(self.dir, "pg")])
        shutil.rmtree(self.dir, ignore_errors=True)


def lsn(text):
    hi, lo = text.split("/")
    return int(hi, 16) << 32 | int(lo, 16)


def payload_sql(size):
    """A JSON payload of about size bytes; md5 hex is incompressible enough for pglz."""
    chunks = max(1, (size - 40) // 32)
    return ("jsonb_build_object('n', :n, 'blob', (SELECT string_agg(md5(random()::text), '') "
            "FROM generate_series(1, %d)))" % chunks)


def pgbench_script(path, per_txn, size, aggtype):
    with open(path, "w") as f:
        f.write("\\set n random(1, 1000000000)\n\\set agg random(1, 1000)\n")
        if per_txn == 1:
            f.write("INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES "
                    "('%s', 'agg-' || :agg, 'created', %s);\n" % (aggtype, payload_sql(size)))
        else:
            f.write("INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
                    "SELECT '%s', 'agg-' || ((:agg + i) %% 1000), 'created', %s "
                    "FROM generate_series(1, %d) i;\n" % (aggtype, payload_sql(size).replace(":n", "i"), per_txn))
    os.chmod(path, 0o644)


def pgbench(stack, db, script, args):
    out = run([os.path.join(PGBIN, "pgbench"), "-n", "-h", stack.host, "-p", stack.port, "-U", "postgres",
               "-f", script] + args + [db]).stdout
    m = re.search(r"tps = ([0-9.]+)", out)
    return float(m.group(1)) if m else 0.0


class Outboxd:
    kafka_extra = ""  # [kafka] lines from --outboxd-kafka

    def __init__(self, stack, db, slot, topic, workdir, extra=""):
        self.log = os.path.join(workdir, "outboxd-%s.log" % slot)
        conf = os.path.join(workdir, "outboxd-%s.conf" % slot)
        with open(conf, "w") as f:
            f.write("[source]\nconninfo = %s\nslot = %s\npublication = bench\ncreate_slot = false\nstatus_interval = 3s\n"
                    "[outbox]\ntopic = %s\n[kafka]\nbootstrap.servers = %s\n"
                    "[metrics]\nlisten = 127.0.0.1:0\n[log]\nformat = text\nprogress_interval = 0\n%s"
                    % (stack.conninfo(db), slot, topic, stack.bootstrap + "\n" + Outboxd.kafka_extra, extra))
        self.start_wall = time.time()
        self.start = time.monotonic()
        # OBX_BENCH_OUTBOXD: another build of outboxd (a before/after comparison)
        cmd = [os.environ.get("OBX_BENCH_OUTBOXD", os.path.join(BUILD, "outboxd")), "run", "-c", conf]
        if os.environ.get("OBX_BENCH_PERF"):
            # profile: perf record -g into OBX_BENCH_PERF.<slot> (RSS and CPU then include perf)
            # (OBX_BENCH_PERF_CALLGRAPH=dwarf unwinds through libraries built without frame pointers)
            cg = os.environ.get("OBX_BENCH_PERF_CALLGRAPH", "fp")
            cmd = ["perf", "record", "-q", "--call-graph", cg, "-o", "%s.%s" % (os.environ["OBX_BENCH_PERF"], slot),
                   "--"] + cmd
        self.proc = subprocess.Popen(cmd,
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        self.port = None

    def logged(self, needle):
        with open(self.log) as f:
            for line in f:
                if needle in line:
                    return line
        return None

    def metrics(self):
        if self.port is None:
            line = self.logged("metrics and health on")
            if line is None:
                return None
            self.port = int(re.search(r":(\d+) \(", line).group(1))
        try:
            body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.port, timeout=2).read().decode()
        except Exception:
            return None
        out = {}
        for line in body.splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                out[k] = float(v)
        return out

    def startup_ms(self):
        line = self.logged("first replication message received")
        if line is None:
            return None
        ts = datetime.datetime.strptime(line.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ")
        ts = ts.replace(tzinfo=datetime.timezone.utc).timestamp()
        return (ts - self.start_wall) * 1000.0

    def usage(self):
        """Peak RSS (MiB) and CPU seconds (user + system) so far."""
        with open("/proc/%d/status" % self.proc.pid) as f:
            hwm = int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) / 1024.0
        with open("/proc/%d/stat" % self.proc.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return hwm, cpu

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def median(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def shape_run(stack, name, args, workdir):
    events, per_txn, size, desc = SHAPES[name]
    events = max(per_txn * 8, int(events * args.scale) // (per_txn * 8) * per_txn * 8)
    db = "bench_%s" % name
    stack.psql("postgres", "DROP DATABASE IF EXISTS %s" % db)
    stack.psql("postgres", "CREATE DATABASE %s" % db)
    stack.psql(db, open(os.path.join(ROOT, "sql/001_outbox.sql")).read())
    stack.psql(db, "CREATE PUBLICATION bench FOR TABLE outbox WITH (publish = 'insert')")
    # the slots first: everything loaded after this is decoded by each of them
    stack.psql(db, "SELECT 1 FROM pg_create_logical_replication_slot('base_%s', 'pgoutput')" % name)
    for r in range(args.runs):
        stack.psql(db, "SELECT 1 FROM pg_copy_logical_replication_slot('base_%s', 'rl_%s_%d')" % (name, name, r))
        stack.psql(db, "SELECT 1 FROM pg_copy_logical_replication_slot('base_%s', 'mc_%s_%d')" % (name, name, r))
        stack.psql(db, "SELECT 1 FROM pg_copy_logical_replication_slot('base_%s', 'ob_%s_%d')" % (name, name, r))
    script = os.path.join(workdir, "load_%s.sql" % name)
    pgbench_script(script, per_txn, size, "bench")
    t0 = time.monotonic()
    txns = events // per_txn
    tps = pgbench(stack, db, script, ["-c", "8", "-j", "2", "-t", str(txns // 8)])
    load_s = time.monotonic() - t0
    end = stack.psql(db, "SELECT pg_current_wal_lsn()")
    count = int(stack.psql(db, "SELECT count(*) FROM outbox"))
    value_size = int(float(stack.psql(db, "SELECT avg(length(payload::text)) FROM outbox")))
    wal = lsn(end) - lsn(stack.psql(db, "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'base_%s'" % name))
    log("shape %s: %d events in %d transactions loaded in %.1f s (%.0f tps), %.1f MiB of WAL, end %s"
        % (name, count, txns, load_s, tps, wal / 1048576.0, end))
    res = {"description": desc, "events": count, "transactions": txns, "value_bytes": value_size,
           "wal_bytes": wal, "end_lsn": end}
    proto = stack.proto()
    rl, mc, kp, ob, rss, cpu, start = [], [], [], [], [], [], []
    for r in range(args.runs):
        t0 = time.monotonic()
        run([os.path.join(BUILD, "bench_repl"), stack.conninfo(db), "mc_%s_%d" % (name, r), "bench",
             str(proto), str(count)])
        mc.append(count / (time.monotonic() - t0))

        t0 = time.monotonic()
        run([os.path.join(PGBIN, "pg_recvlogical"), "-h", stack.host, "-p", stack.port, "-U", "postgres",
             "-d", db, "--slot", "rl_%s_%d" % (name, r), "--start", "--no-loop", "-E", end,
             "-o", "proto_version=%d" % proto, "-o", "publication_names=bench", "-f", "/dev/null"])
        rl.append(count / (time.monotonic() - t0))

        stack.broker_cmd("topic direct.%s.%d 4" % (name, r))
        big = value_size > 900000  # records above librdkafka's 1 MB default: both raise the limit
        env = dict(os.environ, BENCH_MESSAGE_MAX_BYTES="10000000") if big else None
        out = run([os.path.join(BUILD, "bench_kafka"), "produce", stack.bootstrap, "direct.%s.%d" % (name, r),
                   str(count), str(value_size), "1000"], env=env).stdout
        kp.append(float(re.search(r"events_per_s=([0-9.]+)", out).group(1)))

        # topics exist beforehand, as in production (the direct producer's is warmed up too)
        stack.broker_cmd("topic outboxd.%s.%d 4" % (name, r))
        o = Outboxd(stack, db, "ob_%s_%d" % (name, r), "outboxd.%s.%d" % (name, r), workdir,
                    "[kafka]\nmessage.max.bytes = 10000000\n" if big else "")
        try:
            deadline = o.start + 600
            while True:
                m = o.metrics()
                if m and m.get("outboxd_events_published_total", 0) >= count:
                    conf = stack.psql(db, "SELECT confirmed_flush_lsn FROM pg_replication_slots "
                                      "WHERE slot_name = 'ob_%s_%d'" % (name, r))
                    if lsn(conf) >= lsn(end):
                        break
                if o.proc.poll() is not None:
                    raise SystemExit("bench: outboxd exited:\n" + open(o.log).read())
                if time.monotonic() > deadline:
                    raise SystemExit("bench: outboxd did not finish shape %s in 600 s" % name)
                time.sleep(0.02)
            elapsed = time.monotonic() - o.start
            hwm, cpus = o.usage()
            ob.append(count / elapsed)
            rss.append(hwm)
            cpu.append(cpus / count * 1000.0)
            start.append(o.startup_ms())
        finally:
            o.stop()
        log("shape %s run %d: minimal client %.0f/s, pg_recvlogical %.0f/s, producer %.0f/s, outboxd %.0f/s "
            "(%.2f x minimal, %.2f x pg_recvlogical), RSS %.1f MiB, CPU %.3f s/1000, start-up %.0f ms"
            % (name, r + 1, mc[-1], rl[-1], kp[-1], ob[-1], ob[-1] / mc[-1], ob[-1] / rl[-1], rss[-1], cpu[-1],
               start[-1]))
    res.update({"minimal_client_eps": median(mc), "pg_recvlogical_eps": median(rl), "producer_eps": median(kp),
                "outboxd_eps": median(ob), "protocol": proto,
                "ratio_to_minimal_client": median([o / m for o, m in zip(ob, mc)]),
                "ratio_to_pg_recvlogical": median([o / r for o, r in zip(ob, rl)]),
                "peak_rss_mib": median(rss), "cpu_s_per_1000": median(cpu), "startup_ms": median(start),
                "target_ratio": TARGETS[name]})
    if name in args.poll_shapes:
        res["poll"] = poll_run(stack, db, name, count, median(ob)["median"], args, workdir)
    stack.psql("postgres", "DROP DATABASE %s WITH (FORCE)" % db)
    return res


def poll_run(stack, db, name, count, logical_eps, args, workdir):
    """Polling mode on the rows the log-based source just published: events/s, made pending per run."""
    stack.psql(db, open(os.path.join(ROOT, "sql/008_polling.sql")).read())
    eps, cpu, rss = [], [], []
    for r in range(args.runs):
        stack.psql(db, "UPDATE outbox SET published_at = NULL, attempts = 0, last_error = NULL, "
                   "next_attempt_at = now() - interval '1 second'")
        stack.psql(db, "VACUUM (ANALYZE) outbox")
        stack.psql(db, "CHECKPOINT")
        topic = "outboxd.poll.%s.%d" % (name, r)
        stack.broker_cmd("topic %s 4" % topic)
        o = Outboxd(stack, db, "poll_%s_%d" % (name, r), topic, workdir,
                    "[source]\nmode = poll\n[poll]\nbatch = %d\n" % args.poll_batch)
        try:
            deadline = o.start + 600
            while True:
                m = o.metrics()
                if m and m.get("outboxd_events_published_total", 0) >= count:
                    if stack.psql(db, "SELECT count(*) FROM outbox WHERE published_at IS NULL") == "0":
                        break
                if o.proc.poll() is not None:
                    raise SystemExit("bench: outboxd (polling) exited:\n" + open(o.log).read())
                if time.monotonic() > deadline:
                    raise SystemExit("bench: outboxd (polling) did not finish shape %s in 600 s" % name)
                time.sleep(0.02)
            elapsed = time.monotonic() - o.start
            hwm, cpus = o.usage()
            eps.append(count / elapsed)
            rss.append(hwm)
            cpu.append(cpus / count * 1000.0)
        finally:
            o.stop()
        log("shape %s poll run %d: %.0f/s (%.2f x the log-based source's %.0f/s), RSS %.1f MiB, CPU %.3f s/1000"
            % (name, r + 1, eps[-1], eps[-1] / logical_eps, logical_eps, rss[-1], cpu[-1]))
    wal = stack.psql(db, "SELECT pg_size_pretty(pg_relation_size('outbox_pending_seq')) || ' / ' || "
                     "pg_size_pretty(pg_relation_size('outbox'))")
    return {"batch": args.poll_batch, "outboxd_poll_eps": median(eps), "logical_eps": logical_eps,
            "ratio_to_logical": median([e / logical_eps for e in eps]), "peak_rss_mib": median(rss),
            "cpu_s_per_1000": median(cpu), "sizes_index_table": wal, "target_ratio": POLL_TARGET}


def dedupe_run(stack, args, workdir):
    """Start to first acknowledged event and drain time with [delivery] dedupe on vs off, same WAL.
    Every partition already holds older outboxd records (written with murmur2_random and an
    lsn header below the backlog's), so each is read back, one window each, and nothing is skipped."""
    topics, per_topic_old = 8, 200
    events = max(64, int(args.dedupe_events * args.scale) // 8 * 8)
    db = "bench_dd"
    stack.psql("postgres", "DROP DATABASE IF EXISTS %s" % db)
    stack.psql("postgres", "CREATE DATABASE %s" % db)
    stack.psql(db, open(os.path.join(ROOT, "sql/001_outbox.sql")).read())
    stack.psql(db, "CREATE PUBLICATION bench FOR TABLE outbox WITH (publish = 'insert')")
    stack.psql(db, "SELECT 1 FROM pg_create_logical_replication_slot('base_dd', 'pgoutput')")
    modes = ("off", "on")
    for r in range(args.runs):
        for mode in modes:
            stack.psql(db, "SELECT 1 FROM pg_copy_logical_replication_slot('base_dd', 'dd_%s_%d')" % (mode, r))
    script = os.path.join(workdir, "load_dd.sql")
    with open(script, "w") as f:
        f.write("\\set n random(1, 1000000000)\n\\set agg random(1, 1000)\n"
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES "
                "('dd' || (:agg %% %d), 'agg-' || :agg, 'created', %s);\n" % (topics, payload_sql(300)))
    os.chmod(script, 0o644)
    pgbench(stack, db, script, ["-c", "8", "-j", "2", "-t", str(events // 8)])
    end = stack.psql(db, "SELECT pg_current_wal_lsn()")
    first, drain = {m: [] for m in modes}, {m: [] for m in modes}
    for r in range(args.runs):
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            prefix = "dd_%s_%d" % (mode, r)
            for t in range(topics):
                topic = "%s.dd%d" % (prefix, t)
                stack.broker_cmd("topic %s 4" % topic)
                old = "".join("old-%d:{}\n" % i for i in range(per_topic_old))
                subprocess.run(["kcat", "-P", "-b", stack.bootstrap, "-t", topic, "-K:", "-X",
                                "partitioner=murmur2_random", "-H", "lsn=0/1", "-H", "seq=0", "-H", "id=old"],
                               input=old, text=True, check=True, capture_output=True)
            o = Outboxd(stack, db, prefix, prefix + ".${aggregatetype}", workdir,
                        "[delivery]\ndedupe = %s\n" % mode)
            try:
                t_first = None
                while True:
                    m = o.metrics() or {}
                    published = m.get("outboxd_events_published_total", 0)
                    if t_first is None and published >= 1:
                        t_first = time.monotonic() - o.start
                    if published >= events and lsn(stack.psql(db, "SELECT confirmed_flush_lsn FROM "
                                                              "pg_replication_slots WHERE slot_name = '%s'"
                                                              % prefix)) >= lsn(end):
                        break
                    if o.proc.poll() is not None:
                        raise SystemExit("bench: outboxd exited:\n" + open(o.log).read())
                    if time.monotonic() - o.start > 600:
                        raise SystemExit("bench: outboxd did not drain the dedupe backlog in 600 s")
                    time.sleep(0.005)
                drain[mode].append(time.monotonic() - o.start)
                first[mode].append(t_first * 1000.0)
                if m.get("outboxd_dedupe_skipped_total", 0) or m.get("outboxd_dedupe_fallbacks_total", 0):
                    raise SystemExit("bench: dedupe %s skipped or fell back; see %s" % (mode, o.log))
            finally:
                o.stop()
            log("dedupe %s run %d: first event %.0f ms, %d events drained in %.2f s"
                % (mode, r + 1, first[mode][-1], events, drain[mode][-1]))
    stack.psql("postgres", "DROP DATABASE %s WITH (FORCE)" % db)
    return {"events": events, "topics": topics, "partitions": topics * 4,
            "first_event_ms": {m: median(first[m]) for m in modes},
            "drain_s": {m: median(drain[m]) for m in modes},
            "first_event_ratio": median([a / b for a, b in zip(first["on"], first["off"])]),
            "drain_ratio": median([a / b for a, b in zip(drain["on"], drain["off"])])}


DELIVERY_MODES = {
    # name: [delivery] lines
    "at-least-once": "[delivery]\ndedupe = off\n",
    "dedupe": "[delivery]\ndedupe = on\n",
    "exactly-once": "[delivery]\nexactly_once = on\n",
}


def delivery_run(stack, args, workdir):
    """The delivery modes on the same WAL: throughput of a backlog of 1-event transactions
    (shape a) and commit-to-visible latency at --delivery-rate, at-least-once (dedupe off),
    with restart de-duplication (dedupe on, the default) and exactly-once. Exactly-once's
    latency counts a record when its Kafka transaction's progress record arrives: when a
    read_committed consumer could first see it (the test broker itself hands records out at
    once)."""
    modes = list(DELIVERY_MODES)
    events = max(800, int(args.delivery_events * args.scale) // 8 * 8)
    db = "bench_dm"
    stack.psql("postgres", "DROP DATABASE IF EXISTS %s" % db)
    stack.psql("postgres", "CREATE DATABASE %s" % db)
    stack.psql(db, open(os.path.join(ROOT, "sql/001_outbox.sql")).read())
    stack.psql(db, "CREATE PUBLICATION bench FOR TABLE outbox WITH (publish = 'insert')")
    stack.psql(db, "SELECT 1 FROM pg_create_logical_replication_slot('base_dm', 'pgoutput')")
    for r in range(args.runs):
        for i, mode in enumerate(modes):
            stack.psql(db, "SELECT 1 FROM pg_copy_logical_replication_slot('base_dm', 'dm_%d_%d')" % (i, r))
    script = os.path.join(workdir, "load_dm.sql")
    pgbench_script(script, 1, 300, "bench")
    pgbench(stack, db, script, ["-c", "8", "-j", "2", "-t", str(events // 8)])
    end = stack.psql(db, "SELECT pg_current_wal_lsn()")
    stack.broker_cmd("topic outboxd.progress 1")  # created compacted in production (README)
    eps = {m: [] for m in modes}
    rss = {m: [] for m in modes}
    lat = {m: [] for m in modes}
    for r in range(args.runs):
        order = modes if r % 2 == 0 else modes[::-1]
        for mode in order:
            i = modes.index(mode)
            slot, topic = "dm_%d_%d" % (i, r), "dm.%d.%d" % (i, r)
            stack.broker_cmd("topic %s 4" % topic)
            o = Outboxd(stack, db, slot, topic, workdir, DELIVERY_MODES[mode])
            try:
                while True:
                    m = o.metrics() or {}
                    if m.get("outboxd_events_published_total", 0) >= events and lsn(stack.psql(
                            db, "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '%s'"
                            % slot)) >= lsn(end):
                        break
                    if o.proc.poll() is not None:
                        raise SystemExit("bench: outboxd exited:\n" + open(o.log).read())
                    if time.monotonic() - o.start > 600:
                        raise SystemExit("bench: outboxd did not drain the %s backlog in 600 s" % mode)
                    time.sleep(0.02)
                eps[mode].append(events / (time.monotonic() - o.start))
                rss[mode].append(o.usage()[0])
            finally:
                o.stop()
        for mode in order:
            i = modes.index(mode)
            slot, topic = "dml_%d_%d" % (i, r), "dml.%d.%d" % (i, r)
            stack.psql(db, "SELECT 1 FROM pg_create_logical_replication_slot('%s', 'pgoutput')" % slot)
            stack.broker_cmd("topic %s 4" % topic)
            o = Outboxd(stack, db, slot, "${aggregatetype}", workdir, DELIVERY_MODES[mode])
            try:
                while o.metrics() is None or not o.logged("streaming from slot"):
                    if o.proc.poll() is not None:
                        raise SystemExit("bench: outboxd exited:\n" + open(o.log).read())
                    time.sleep(0.05)
                lscript = os.path.join(workdir, "dml_%d_%d.sql" % (i, r))
                pgbench_script(lscript, 1, 300, topic)
                pgbench(stack, db, lscript, ["-c", "1", "-t", "1"])
                while (o.metrics() or {}).get("outboxd_events_published_total", 0) < 1:
                    time.sleep(0.05)
                lat[mode].append(measure_latency(
                    stack, topic, "commit_ts", args.latency_seconds,
                    lambda: pgbench(stack, db, lscript, ["-c", "8", "-j", "2", "-R", str(args.delivery_rate),
                                                         "-T", str(args.latency_seconds)]),
                    progress="outboxd.progress" if mode == "exactly-once" else None))
                if mode == "exactly-once":
                    lat[mode][-1]["transactions"] = (o.metrics() or {}).get(
                        "outboxd_kafka_transactions_committed_total", 0)
            finally:
                o.stop()
        log("delivery run %d: %s" % (r + 1, ", ".join(
            "%s %.0f/s p50 %.2f p99 %.2f ms" % (m, eps[m][-1], lat[m][-1]["p50_ms"], lat[m][-1]["p99_ms"])
            for m in modes)))
    stack.psql("postgres", "DROP DATABASE %s WITH (FORCE)" % db)
    base = "at-least-once"
    return {"events": events, "rate": args.delivery_rate, "modes": modes,
            "eps": {m: median(eps[m]) for m in modes},
            "eps_ratio": {m: median([a / b for a, b in zip(eps[m], eps[base])]) for m in modes},
            "peak_rss_mib": {m: median(rss[m]) for m in modes},
            "p50_ms": {m: median([x["p50_ms"] for x in lat[m]]) for m in modes},
            "p99_ms": {m: median([x["p99_ms"] for x in lat[m]]) for m in modes},
            "achieved": {m: median([x["rate"] for x in lat[m]]) for m in modes},
            "p99_difference_ms": {m: median([x["p99_ms"] - y["p99_ms"] for x, y in zip(lat[m], lat[base])])
                                  for m in modes}}


def latency_run(stack, rate, args, workdir):
    db = "bench_lat"
    stack.psql("postgres", "DROP DATABASE IF EXISTS %s" % db)
    stack.psql("postgres", "CREATE DATABASE %s" % db)
    stack.psql(db, open(os.path.join(ROOT, "sql/001_outbox.sql")).read())
    stack.psql(db, "CREATE PUBLICATION bench FOR TABLE outbox WITH (publish = 'insert')")
    ob_stats, floor_stats, server_stats, loaded_stats = [], [], [], []
    for r in range(args.runs):
        slot = "lat_%d_%d" % (rate, r)
        topic = "lat.%d.%d" % (rate, r)
        stack.psql(db, "SELECT 1 FROM pg_create_logical_replication_slot('%s', 'pgoutput')" % slot)
        stack.broker_cmd("topic %s 4" % topic)
        o = Outboxd(stack, db, slot, "${aggregatetype}", workdir)
        try:
            while o.metrics() is None or not o.logged("streaming from slot"):
                time.sleep(0.05)
            script = os.path.join(workdir, "lat_%d_%d.sql" % (rate, r))
            pgbench_script(script, 1, 300, topic)
            # warm up as the direct producer does: the producer learns the topic's leaders
            pgbench(stack, db, script, ["-c", "1", "-t", "1"])
            while (o.metrics() or {}).get("outboxd_events_published_total", 0) < 1:
                time.sleep(0.05)
            ob_stats.append(measure_latency(stack, topic, "commit_ts", args.latency_seconds, lambda: pgbench(
                stack, db, script, ["-c", "8", "-j", "2", "-R", str(rate), "-T", str(args.latency_seconds)])))
        finally:
            o.stop()
        server_stats.append(server_latency(stack, db, rate, r, args.latency_seconds, workdir))
        dtopic = "dlat.%d.%d" % (rate, r)
        stack.broker_cmd("topic %s 4" % dtopic)
        floor_stats.append(measure_latency(stack, dtopic, "sent_us", args.latency_seconds, lambda: run(
            [os.path.join(BUILD, "bench_kafka"), "rate", stack.bootstrap, dtopic, str(rate),
             str(args.latency_seconds), "300"]), samples=os.path.join(workdir, "%s.samples" % dtopic)))
        # An estimate of what a relay adding no time of its own would show: the floor plus the
        # server's own share, summed from independent draws of the two distributions measured
        # here. Both were taken without the other's load, and real stalls hit both at once, so
        # the estimate is low: it is beside the target, not the target.
        both = combined(floor_stats[-1].pop("samples"), server_stats[-1].pop("samples"), r)
        floor_stats[-1]["plus_server_p50_ms"], floor_stats[-1]["plus_server_p99_ms"] = both
        # The same bare producer while the generator loads the database as it did for outboxd
        # (nobody decodes): the floor on a machine that also carries the database's work.
        ltopic = "llat.%d.%d" % (rate, r)
        stack.broker_cmd("topic %s 4" % ltopic)
        loaded_stats.append(measure_latency(stack, ltopic, "sent_us", args.latency_seconds, lambda: loaded_floor(
            stack, db, script, rate, args.latency_seconds, ltopic)))
        log("latency %d/s run %d: outboxd p50 %.2f p99 %.2f ms (%.0f/s), direct p50 %.2f p99 %.2f ms (%.0f/s), "
            "server p50 %.2f p99 %.2f ms"
            % (rate, r + 1, ob_stats[-1]["p50_ms"], ob_stats[-1]["p99_ms"], ob_stats[-1]["rate"],
               floor_stats[-1]["p50_ms"], floor_stats[-1]["p99_ms"], floor_stats[-1]["rate"],
               server_stats[-1]["p50_ms"], server_stats[-1]["p99_ms"]))
        log("latency %d/s run %d: bare producer beside the database load p50 %.2f p99 %.2f ms (%.0f/s)"
            % (rate, r + 1, loaded_stats[-1]["p50_ms"], loaded_stats[-1]["p99_ms"], loaded_stats[-1]["rate"]))
    stack.psql("postgres", "DROP DATABASE %s WITH (FORCE)" % db)
    out = {}
    for key in ("rate", "p50_ms", "p90_ms", "p99_ms", "max_ms"):
        out["outboxd_" + key] = median([s[key] for s in ob_stats])
        out["direct_" + key] = median([s[key] for s in floor_stats])
        out["server_" + key] = median([s[key] for s in server_stats])
        out["loaded_" + key] = median([s[key] for s in loaded_stats])
    out["p99_difference_ms"] = median([o["p99_ms"] - f["p99_ms"] for o, f in zip(ob_stats, floor_stats)])
    out["p99_above_loaded_ms"] = median([o["p99_ms"] - f["p99_ms"] for o, f in zip(ob_stats, loaded_stats)])
    out["floor_plus_server_p50_ms"] = median([f["plus_server_p50_ms"] for f in floor_stats])
    out["floor_plus_server_p99_ms"] = median([f["plus_server_p99_ms"] for f in floor_stats])
    out["p99_above_floor_plus_server_ms"] = median([o["p99_ms"] - f["plus_server_p99_ms"]
                                                    for o, f in zip(ob_stats, floor_stats)])
    out["target_p99_difference_ms"] = P99_TARGETS_MS.get(rate, 3.0)
    return out


def server_latency(stack, db, rate, r, seconds, workdir):
    """The server's own part: commit to receipt by a replication client (pg_recvlogical,
    test_decoding with commit timestamps), under the same generator, no outboxd, no broker."""
    slot = "srv_%d_%d" % (rate, r)
    stack.psql(db, "SELECT 1 FROM pg_create_logical_replication_slot('%s', 'test_decoding')" % slot)
    p = subprocess.Popen([os.path.join(PGBIN, "pg_recvlogical"), "-h", stack.host, "-p", stack.port,
                          "-U", "postgres", "-d", db, "--slot", slot, "--start", "-o", "include-timestamp=1",
                          "-o", "skip-empty-xacts=1", "-F", "0", "-f", "-"],
                         stdout=subprocess.PIPE, text=True, bufsize=1)
    lat = []

    def reader():
        for line in p.stdout:
            if line.startswith("COMMIT") and "(at " in line:
                now = time.time()
                ts = line.split("(at ", 1)[1].rstrip(")\n").split("+")[0]
                base, _, frac = ts.partition(".")
                t = datetime.datetime.strptime(base, "%Y-%m-%d %H:%M:%S").replace(
                    tzinfo=datetime.timezone.utc).timestamp() + float("0." + (frac or "0"))
                lat.append((now - t) * 1000.0)

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    time.sleep(1)
    script = os.path.join(workdir, "srv_%d_%d.sql" % (rate, r))
    pgbench_script(script, 1, 300, "srv")
    pgbench(stack, db, script, ["-c", "8", "-j", "2", "-R", str(rate), "-T", str(seconds)])
    time.sleep(1)
    p.terminate()
    p.wait()
    th.join(timeout=5)
    stack.psql(db, "SELECT pg_drop_replication_slot('%s')" % slot)
    if not lat:
        raise SystemExit("bench: pg_recvlogical received no commit")
    lat.sort()
    n = len(lat)
    return {"count": n, "rate": n / float(seconds), "p50_ms": lat[n // 2], "p90_ms": lat[n * 9 // 10],
            "p99_ms": lat[n * 99 // 100], "max_ms": lat[-1], "samples": lat}


def loaded_floor(stack, db, script, rate, seconds, topic):
    """The bare producer at rate while pgbench commits the outboxd run's transactions at rate."""
    g = subprocess.Popen([os.path.join(PGBIN, "pgbench"), "-n", "-h", stack.host, "-p", stack.port, "-U",
                          "postgres", "-f", script, "-c", "8", "-j", "2", "-R", str(rate), "-T", str(seconds), db],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        run([os.path.join(BUILD, "bench_kafka"), "rate", stack.bootstrap, topic, str(rate), str(seconds), "300"])
    finally:
        if g.wait() != 0:
            raise SystemExit("bench: pgbench beside the bare producer failed")


def combined(a, b, seed, n=200000):
    """p50 and p99 of x + y, x drawn from a and y from b (latencies in ms), independently."""
    rng = random.Random(seed)
    xs = sorted(rng.choice(a) + rng.choice(b) for _ in range(n))
    return xs[n // 2], xs[n * 99 // 100]


def measure_latency(stack, topic, header, seconds, generate, progress=None, samples=None):
    trace = os.environ.get("OBX_BENCH_TRACE")
    env = {k: v for k, v in os.environ.items() if k != "OBX_BENCH_SAMPLES"}
    if samples:
        env["OBX_BENCH_SAMPLES"] = samples
    c = subprocess.Popen([os.path.join(BUILD, "bench_kafka"), "latency", stack.bootstrap, topic,
                          str(seconds + 5), header] + ([progress] if progress else []), stdout=subprocess.PIPE, text=True,
                         stderr=open("%s.%s" % (trace, topic), "w") if trace else None, env=env)
    if c.stdout.readline().strip() != "ready":
        raise SystemExit("bench: the latency consumer did not start")
    generate()
    line = c.stdout.read().strip()
    c.wait()
    stats = {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", line)}
    if stats.get("count", 0) == 0:
        raise SystemExit("bench: no record reached the latency consumer on %s" % topic)
    if samples:
        try:
            with open(samples) as f:
                stats["samples"] = [int(x) / 1000.0 for x in f]
        finally:
            os.unlink(samples)
    return stats


def tables_sql(stack, db, name, lines):
    path = os.path.join(stack.dir, "%s-%s.sql" % (name, db))
    with open(path, "w") as f:
        f.writelines(lines)
    os.chmod(path, 0o644)
    run([os.path.join(PGBIN, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", stack.host, "-p", stack.port,
         "-U", "postgres", "-d", db, "-f", path])


def tables_ddl(stack, db, ntables):
    """The tenant outboxes t<i>.outbox, as sql/001_outbox.sql makes one."""
    tables_sql(stack, db, "ddl", ["CREATE SCHEMA t%d; CREATE TABLE t%d.outbox (id uuid PRIMARY KEY DEFAULT "
                                  "gen_random_uuid(), aggregatetype text NOT NULL, aggregateid text NOT NULL, "
                                  "type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT "
                                  "now());\n" % (i, i) for i in range(ntables)])


def tables_load(stack, db, ntables, events):
    """Commits events rows (about 150 B of payload each) spread over the tables, 100 per transaction,
    the tables interleaved; returns how many."""
    per = max(1, events // ntables)
    tables_sql(stack, db, "load", ["INSERT INTO t%d.outbox (aggregatetype, aggregateid, type, payload) "
                                   "SELECT 'tenant', 'agg-' || (g %% 100), 'created', jsonb_build_object('n', g, "
                                   "'blob', md5(g::text) || md5((g + 1)::text)) FROM generate_series(%d, %d) g;\n"
                                   % (i, start, min(per, start + 100) - 1)
                                   for start in range(0, per, 100) for i in range(ntables)])
    return per * ntables


def tables_conf(stack, db, slot, table, publication, workdir, tag):
    conf = os.path.join(workdir, "tables-%s.conf" % tag)
    with open(conf, "w") as f:
        f.write("[source]\nconninfo = %s\nslot = %s\npublication = %s\ntable = %s\ncreate_slot = false\n"
                "create_publication = false\nstatus_interval = 1s\n[outbox]\ntopic = tenants\n"
                "[kafka]\nbootstrap.servers = %s\n[metrics]\nlisten = 127.0.0.1:0\n"
                "[log]\nformat = text\nprogress_interval = 0\n"
                % (stack.conninfo(db), slot, publication, table, stack.bootstrap))
    return conf


def drain(stack, db, procs, end, timeout=600):
    """Waits until every slot of procs [(proc, slot, log)] confirmed end; returns seconds."""
    t0 = time.monotonic()
    while True:
        done = True
        for _, slot, _ in procs:
            c = stack.psql(db, "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '%s'" % slot)
            done = done and c != "" and lsn(c) >= end
        if done:
            return time.monotonic() - t0
        for p, _, log_path in procs:
            if p.poll() is not None:
                raise SystemExit("bench: outboxd exited during the tables run (%s)" % log_path)
        if time.monotonic() - t0 > timeout:
            raise SystemExit("bench: the tables run did not drain in %d s" % timeout)
        time.sleep(0.05)


def proc_usage(pid):
    with open("/proc/%d/status" % pid) as f:
        hwm = int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) / 1024.0
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return hwm, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_outboxd(conf, log_path):
    cmd = [os.environ.get("OBX_BENCH_OUTBOXD", os.path.join(BUILD, "outboxd")), "run", "-c", conf]
    if os.environ.get("OBX_BENCH_PERF"):
        # as Outboxd does: perf record -g into OBX_BENCH_PERF.<log name>
        cmd = ["perf", "record", "-q", "--call-graph", os.environ.get("OBX_BENCH_PERF_CALLGRAPH", "fp"), "-o",
               "%s.%s" % (os.environ["OBX_BENCH_PERF"], os.path.basename(log_path)), "--"] + cmd
    return subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)


def wait_logged(log_path, needle, proc, timeout=120):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        with open(log_path) as f:
            if needle in f.read():
                return time.monotonic() - t0
        if proc.poll() is not None:
            raise SystemExit("bench: outboxd exited (%s)" % log_path)
        time.sleep(0.01)
    raise SystemExit("bench: no '%s' in %s within %d s" % (needle, log_path, timeout))


def stop_proc(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=40)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def tables_run(stack, ntables, args, workdir):
    """One outboxd over ntables tenant tables, and (up to --per-table-max) one outboxd per table."""
    db = "tables%d" % ntables
    per_table = ntables <= args.per_table_max
    stack.psql("postgres", "DROP DATABASE IF EXISTS %s" % db)
    stack.psql("postgres", "CREATE DATABASE %s" % db)
    tables_ddl(stack, db, ntables)
    # the publications and slots before the backlog, as a running connector has them
    stack.psql(db, "CREATE PUBLICATION bench_all FOR ALL TABLES WITH (publish = 'insert', "
                   "publish_via_partition_root = true)")
    stack.psql(db, "SELECT pg_create_logical_replication_slot('tables_one', 'pgoutput')")
    for i in range(ntables if per_table else 0):
        stack.psql(db, "CREATE PUBLICATION bench_t%d FOR TABLE t%d.outbox WITH (publish = 'insert')" % (i, i))
        stack.psql(db, "SELECT pg_create_logical_replication_slot('tables_t%d', 'pgoutput')" % i)
    events = tables_load(stack, db, ntables, args.tables_events)
    end = lsn(stack.psql(db, "SELECT pg_current_wal_lsn()"))
    out = {"tables": ntables, "events": events}

    # one process for every table: drain, then a restart (SIGTERM, start to streaming)
    conf = tables_conf(stack, db, "tables_one", "t*.outbox", "bench_all", workdir, "%d-one" % ntables)
    log_path = os.path.join(workdir, "tables-%d-one.log" % ntables)
    t0 = time.monotonic()
    p = start_outboxd(conf, log_path)
    startup = wait_logged(log_path, "first replication message received", p)
    drain(stack, db, [(p, "tables_one", log_path)], end)
    elapsed = time.monotonic() - t0
    rss, cpu = proc_usage(p.pid)
    stop_proc(p)
    p = start_outboxd(conf, log_path + ".restart")
    restart = wait_logged(log_path + ".restart", "streaming from slot", p)
    stop_proc(p)
    out["one"] = {"eps": events / elapsed, "peak_rss_mib": rss, "cpu_per_1000": cpu * 1000.0 / events,
                  "startup_ms": startup * 1000.0, "restart_ms": restart * 1000.0}

    if per_table:
        procs = []
        t0 = time.monotonic()
        for i in range(ntables):
            c = tables_conf(stack, db, "tables_t%d" % i, "t%d.outbox" % i, "bench_t%d" % i, workdir,
                            "%d-t%d" % (ntables, i))
            lp = os.path.join(workdir, "tables-%d-t%d.log" % (ntables, i))
            procs.append((start_outboxd(c, lp), "tables_t%d" % i, lp))
        drain(stack, db, procs, end)
        elapsed = time.monotonic() - t0
        usage = [proc_usage(pp.pid) for pp, _, _ in procs]
        for pp, _, _ in procs:
            stop_proc(pp)
        out["per_table"] = {"eps": events / elapsed, "peak_rss_mib": sum(u[0] for u in usage),
                            "cpu_per_1000": sum(u[1] for u in usage) * 1000.0 / events}
        for i in range(ntables):
            stack.psql(db, "SELECT pg_drop_replication_slot('tables_t%d')" % i)
    stack.psql(db, "SELECT pg_drop_replication_slot('tables_one')")
    log("tables %d: %s" % (ntables, json.dumps(out)))
    return out


def machine(broker="test"):
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) // 1048576
    pg = run([os.path.join(PGBIN, "postgres"), "--version"]).stdout.strip()
    # the librdkafka the measured outboxd loads (its RPATH may name a build of
    # its own, scripts/build-librdkafka.sh), not the system's pkg-config answer
    ver = run([os.environ.get("OBX_BENCH_OUTBOXD", os.path.join(BUILD, "outboxd")), "--version"]).stdout
    m = re.search(r"\(librdkafka ([^)]+)\)", ver)
    rdk = m.group(1) if m else "?"
    return {"cpus": os.cpu_count(), "cpu": model, "memory_gib": mem, "kernel": platform.release(),
            "postgresql": pg, "librdkafka": rdk,
            "broker": "librdkafka mock cluster (tests/broker), 1 broker" if broker == "test" else
            "Apache Kafka %s, one KRaft node (tests/stack/kafkastack.sh)" % kafka_version()}


def kafka_version():
    with open(os.path.join(ROOT, "tests/stack/kafka/pom.xml")) as f:
        m = re.search(r"<kafka.version>([^<]+)</kafka.version>", f.read())
    return m.group(1) if m else "?"


def fmt(m, unit="", digits=0):
    f = "%%.%df" % digits
    return (f + "%s (%s-%s)") % (m["median"], unit, f % m["min"], f % m["max"])


def verdicts(res):
    """(PASS|MISS, what) for every target, each a ratio or difference within this run."""
    out = []
    for name, s in res["shapes"].items():
        r = s["ratio_to_minimal_client"]["median"]
        out.append((r >= s["target_ratio"], "shape %s: outboxd / minimal client %.2f (>= %.2f)"
                    % (name, r, s["target_ratio"])))
        if name in RSS_SHAPES:
            m = s["peak_rss_mib"]["median"]
            out.append((m <= RSS_TARGET_MIB, "shape %s: peak RSS %.1f MiB (<= %.0f)" % (name, m, RSS_TARGET_MIB)))
        if s.get("poll"):
            p = s["poll"]["ratio_to_logical"]["median"]
            out.append((p >= s["poll"]["target_ratio"], "shape %s: polling mode / log-based source %.2f (>= %.2f)"
                        % (name, p, s["poll"]["target_ratio"])))
        st = s["startup_ms"]["median"]
        out.append((st < STARTUP_TARGET_MS, "shape %s: start to first event %.0f ms (< %.0f)"
                    % (name, st, STARTUP_TARGET_MS)))
    for rate, l in res["latency"].items():
        d = l["p99_difference_ms"]["median"]
        if l["direct_p50_ms"]["median"] > FLOOR_SANE_P50_MS:
            # the open-loop bare producer queued: it is no floor, the comparison says nothing
            out.append((None, "%s/s: not measurable here (the bare producer's p50 %.0f ms: it queued)"
                        % (rate, l["direct_p50_ms"]["median"])))
        else:
            out.append((d <= l["target_p99_difference_ms"], "%s/s: p99 %.2f ms above the bare producer's (<= %.0f; "
                        "server alone p99 %.2f ms; %.2f ms above the estimate of the bare producer plus the "
                        "server's own share, p99 %.2f ms)" % (rate, d, l["target_p99_difference_ms"],
                                                             l["server_p99_ms"]["median"],
                                                             l["p99_above_floor_plus_server_ms"]["median"],
                                                             l["floor_plus_server_p99_ms"]["median"])))
        if l["loaded_p50_ms"]["median"] <= FLOOR_SANE_P50_MS and l["loaded_p99_ms"]["median"] <= FLOOR_SANE_P50_MS:
            dl = l["p99_above_loaded_ms"]["median"]
            out.append((dl <= l["target_p99_difference_ms"], "%s/s: p99 %.2f ms above the bare producer's beside "
                        "the same database load (<= %.0f)" % (rate, dl, l["target_p99_difference_ms"])))
        else:
            out.append((None, "%s/s beside the database load: not measurable here (the bare producer's p50 / p99 "
                        "%.0f / %.0f ms: it queued)" % (rate, l["loaded_p50_ms"]["median"], l["loaded_p99_ms"]["median"])))
    return [("N/A" if ok is None else "PASS" if ok else "MISS", what) for ok, what in out]


def markdown(res):
    lines = ["# outboxd benchmarks", "", "%s, UTC. Machine: %d CPUs (%s), %d GiB, kernel %s; %s; librdkafka %s; %s."
             % (res["time"], res["machine"]["cpus"], res["machine"]["cpu"], res["machine"]["memory_gib"],
                res["machine"]["kernel"], res["machine"]["postgresql"], res["machine"]["librdkafka"],
                res["machine"]["broker"]),
             "", "Median of %d runs (min-max). Throughput in events/s on the same WAL.%s" % (
                 res["runs"], " outboxd with %s." % ", ".join(res["outboxd_kafka"]) if res["outboxd_kafka"] else ""),
             "",
             "| shape | events | minimal client | pg_recvlogical | producer limit | outboxd "
             "| outboxd / minimal client (target) | outboxd / pg_recvlogical "
             "| peak RSS MiB | CPU s / 1000 events | start-up ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in res["shapes"].items():
        ratio = s["ratio_to_minimal_client"]
        lines.append("| %s: %s | %d | %s | %s | %s | %s | %.2f (>= %.2f %s) | %.2f | %s | %s | %s |" % (
            name, s["description"], s["events"], fmt(s["minimal_client_eps"]), fmt(s["pg_recvlogical_eps"]),
            fmt(s["producer_eps"]), fmt(s["outboxd_eps"]), ratio["median"], s["target_ratio"],
            "PASS" if ratio["median"] >= s["target_ratio"] else "MISS",
            s["ratio_to_pg_recvlogical"]["median"],
            fmt(s["peak_rss_mib"], "", 1), fmt(s["cpu_s_per_1000"], "", 3), fmt(s["startup_ms"])))
    polled = [(n, s) for n, s in res["shapes"].items() if s.get("poll")]
    if polled:
        lines += ["", "Polling mode ([source] mode = poll, [poll] batch = %d) on the same rows, made pending "
                  "again per run, process start to no row pending:" % polled[0][1]["poll"]["batch"], "",
                  "| shape | events | log-based source (above) | polling mode | polling / log-based (target) "
                  "| peak RSS MiB | CPU s / 1000 events |", "|---|---|---|---|---|---|---|"]
        for name, s in polled:
            p = s["poll"]
            lines.append("| %s: %s | %d | %s | %s | %.2f (>= %.2f %s) | %s | %s |" % (
                name, s["description"], s["events"], fmt(s["outboxd_eps"]), fmt(p["outboxd_poll_eps"]),
                p["ratio_to_logical"]["median"], p["target_ratio"],
                "PASS" if p["ratio_to_logical"]["median"] >= p["target_ratio"] else "MISS",
                fmt(p["peak_rss_mib"], "", 1), fmt(p["cpu_s_per_1000"], "", 3)))
    if res["latency"]:
        lines += ["", "Latency, commit to receipt (outboxd) and produce call to receipt (a bare producer, the "
                  "floor), ms:", "",
                  "| rate | achieved (outboxd / bare) | p50 | p90 | p99 | max | p99 difference (target) "
                  "| server alone p50 / p99 | bare + server p50 / p99 | outboxd p99 - (bare + server) "
                  "| bare beside the database load p50 / p99 | outboxd p99 - that |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for rate, l in res["latency"].items():
            d = l["p99_difference_ms"]["median"]
            sane = l["direct_p50_ms"]["median"] <= FLOOR_SANE_P50_MS
            lines.append("| %s/s | %.0f / %.0f | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | %s "
                         "| %.2f / %.2f | %s | %s | %s | %s |" % (
                rate, l["outboxd_rate"]["median"], l["direct_rate"]["median"], l["outboxd_p50_ms"]["median"],
                l["direct_p50_ms"]["median"], l["outboxd_p90_ms"]["median"], l["direct_p90_ms"]["median"],
                l["outboxd_p99_ms"]["median"], l["direct_p99_ms"]["median"], l["outboxd_max_ms"]["median"],
                l["direct_max_ms"]["median"],
                "%.2f (<= %.0f %s)" % (d, l["target_p99_difference_ms"],
                                       "PASS" if d <= l["target_p99_difference_ms"] else "MISS")
                if sane else "N/A (the bare producer queued)",
                l["server_p50_ms"]["median"], l["server_p99_ms"]["median"],
                "%.2f / %.2f" % (l["floor_plus_server_p50_ms"]["median"], l["floor_plus_server_p99_ms"]["median"])
                if sane else "N/A",
                "%.2f" % l["p99_above_floor_plus_server_ms"]["median"] if sane else "N/A",
                "%.2f / %.2f" % (l["loaded_p50_ms"]["median"], l["loaded_p99_ms"]["median"]),
                "%.2f" % l["p99_above_loaded_ms"]["median"]
                if max(l["loaded_p50_ms"]["median"], l["loaded_p99_ms"]["median"]) <= FLOOR_SANE_P50_MS else "N/A"))
        lines += ["", "Server alone: commit to receipt of the COMMIT by pg_recvlogical (test_decoding with "
                  "timestamps), same generator, no outboxd and no broker: the part of outboxd's latency "
                  "that is PostgreSQL's (WAL flush, walsender wake-up, decoding). Bare + server: sums of "
                  "independent draws from the bare producer's and the server's distributions of the same run, "
                  "an estimate of what a relay adding no time of its own would show; each was measured "
                  "without the other's load and stalls that hit both are not summed, so it is low. Bare beside "
                  "the database load: the bare producer again while pgbench commits outboxd's transactions "
                  "at the same rate and nobody decodes them, the floor on a machine that also does the "
                  "database's work."]
    if res.get("dedupe"):
        d = res["dedupe"]
        lines += ["", "Restart de-duplication's read-backs: %d events over %d topics (%d partitions, each "
                  "holding older records, so each is read back), dedupe on vs off on the same WAL:" % (
                      d["events"], d["topics"], d["partitions"]), "",
                  "| | dedupe off | dedupe on | on / off |", "|---|---|---|---|",
                  "| start to first acknowledged event, ms | %s | %s | %.2f |" % (
                      fmt(d["first_event_ms"]["off"]), fmt(d["first_event_ms"]["on"]),
                      d["first_event_ratio"]["median"]),
                  "| start to the backlog drained, s | %s | %s | %.2f |" % (
                      fmt(d["drain_s"]["off"], "", 2), fmt(d["drain_s"]["on"], "", 2), d["drain_ratio"]["median"])]
    if res.get("delivery"):
        d = res["delivery"]
        lines += ["", "Delivery modes on the same WAL: a backlog of %d 1-event transactions (300 B), and "
                  "commit to visible at %d events/s (exactly-once: when the Kafka transaction's progress "
                  "record arrives, as a read_committed consumer would first see it):" % (d["events"], d["rate"]),
                  "", "| mode | backlog events/s | / at-least-once | peak RSS MiB | p50 ms | p99 ms "
                  "| p99 - at-least-once ms |",
                  "|---|---|---|---|---|---|---|"]
        for m in d["modes"]:
            lines.append("| %s | %s | %.2f | %.1f | %.2f | %.2f | %+.2f |" % (
                m, fmt(d["eps"][m]), d["eps_ratio"][m]["median"], d["peak_rss_mib"][m]["median"],
                d["p50_ms"][m]["median"],
                d["p99_ms"][m]["median"], d["p99_difference_ms"][m]["median"]))
    if res.get("tables"):
        lines += ["", "Several tables: one outboxd relaying N tenant tables (`table = t*.outbox`, a publication "
                  "FOR ALL TABLES) against one outboxd per table (a slot and a publication each), on the same "
                  "backlog spread over the tables (no target: the curve):", "",
                  "| tables | events | one process: events/s | peak RSS MiB | CPU s / 1000 events | start-up ms "
                  "| restart ms | one per table: events/s | sum of peak RSS MiB | CPU s / 1000 events |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for t in res["tables"]:
            o, pt = t["one"], t.get("per_table")
            lines.append("| %d | %d | %.0f | %.1f | %.3f | %.0f | %.0f | %s | %s | %s |" % (
                t["tables"], t["events"], o["eps"], o["peak_rss_mib"], o["cpu_per_1000"], o["startup_ms"],
                o["restart_ms"], "%.0f" % pt["eps"] if pt else "not run",
                "%.1f" % pt["peak_rss_mib"] if pt else "-", "%.3f" % pt["cpu_per_1000"] if pt else "-"))
    lines += ["", "Targets:", ""] + ["- %s %s" % v for v in verdicts(res)]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of each shape's events")
    ap.add_argument("--shapes", default="abcd")
    ap.add_argument("--poll-shapes", default="a", help="shapes also run in polling mode ('' for none)")
    ap.add_argument("--poll-batch", type=int, default=10000, help="[poll] batch for those runs (the default)")
    ap.add_argument("--latency-seconds", type=int, default=20)
    ap.add_argument("--rates", default="1000,5000", help="latency rates, events/s ('' for none)")
    ap.add_argument("--dedupe-events", type=int, default=20000,
                    help="backlog for the dedupe on/off comparison (0 for none)")
    ap.add_argument("--delivery-events", type=int, default=50000,
                    help="backlog for the delivery modes' comparison (0 for none)")
    ap.add_argument("--delivery-rate", type=int, default=1000, help="the delivery modes' latency rate")
    ap.add_argument("--tables", default="1,10,100,1000",
                    help="tenant table counts for the several-tables curve ('' for none)")
    ap.add_argument("--tables-events", type=int, default=20000, help="backlog of each tables run")
    ap.add_argument("--per-table-max", type=int, default=10,
                    help="the largest table count also run as one outboxd per table (a slot each)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--broker", choices=["test", "kafka"], default="test",
                    help="the test broker (librdkafka's mock cluster) or Apache Kafka (tests/stack/kafkastack.sh)")
    ap.add_argument("--outboxd-kafka", action="append", default=[], metavar="KEY=VALUE",
                    help="a producer setting added to outboxd's [kafka] section")
    args = ap.parse_args()
    for kv in args.outboxd_kafka:
        k, eq, v = kv.partition("=")
        if not eq or not k.strip():
            ap.error("--outboxd-kafka wants KEY=VALUE, not %r" % kv)
        Outboxd.kafka_extra += "%s = %s\n" % (k.strip(), v.strip())

    log("building without sanitizers in %s" % BUILD)
    run(["cmake", "-S", ROOT, "-B", BUILD, "-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DOBX_SANITIZE=OFF",
         "-DOBX_TEST_HOOKS=OFF"])
    run(["cmake", "--build", BUILD, "-j", str(os.cpu_count()), "--target", "outboxd", "bench_kafka",
         "bench_repl", "obx-testbroker"])
    stack = Stack(args.broker)
    workdir = tempfile.mkdtemp(prefix="obx-bench-run.")
    os.chmod(workdir, 0o755)
    res = {"time": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"), "machine": machine(args.broker), "broker": args.broker,
           "runs": args.runs, "scale": args.scale, "outboxd_kafka": args.outboxd_kafka, "shapes": {},
           "latency": {}}
    try:
        for name in args.shapes:
            res["shapes"][name] = shape_run(stack, name, args, workdir)
        if args.dedupe_events > 0:
            res["dedupe"] = dedupe_run(stack, args, workdir)
        if args.delivery_events > 0:
            res["delivery"] = delivery_run(stack, args, workdir)
        for rate in [int(x) for x in args.rates.split(",") if x]:
            res["latency"][str(rate)] = latency_run(stack, rate, args, workdir)
        if args.tables:
            stack.broker_cmd("topic tenants 4")  # made first: its creation is no part of the first figure
        res["tables"] = [tables_run(stack, int(n), args, workdir) for n in args.tables.split(",") if n]
    finally:
        stack.close()
        if os.environ.get("OBX_BENCH_KEEP"):
            log("kept %s" % workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    stamp = datetime.datetime.utcnow().strftime("%Y%m%dT%H%M%SZ")
    md = markdown(res)
    with open(os.path.join(args.out, stamp + ".json"), "w") as f:
        json.dump(res, f, indent=2)
    with open(os.path.join(args.out, stamp + ".md"), "w") as f:
        f.write(md)
    print(md)
    for verdict, what in verdicts(res):
        print("%s %s" % (verdict, what))
    log("results in %s/%s.{md,json}" % (args.out, stamp))


if __name__ == "__main__":
    main()
