#!/usr/bin/env python3
"""Writes the fuzzer's seed corpus: CopyData sequences a PostgreSQL 15 server
sends for an outbox INSERT (layouts from src/backend/replication/logical/proto.c),
each message prefixed by its 2-byte length as fuzz_pgoutput.c expects, plus
runs of the messages captured from a real server (tests/fixtures/pgoutput)."""
import os
import struct
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "corpus"
os.makedirs(out, exist_ok=True)


def xlog(payload, start=0x1000):
    return b"w" + struct.pack(">QQQ", start, start + 0x100, 0) + payload


def cstr(s):
    return s.encode() + b"\0"


def text(v):
    if v is None:
        return b"n"
    b = v.encode()
    return b"t" + struct.pack(">I", len(b)) + b


cols = [("id", 2950), ("aggregatetype", 25), ("aggregateid", 25), ("type", 25),
        ("payload", 3802), ("headers", 3802), ("created_at", 1184), ("origin", 25)]
rel = b"R" + struct.pack(">I", 16384) + cstr("public") + cstr("outbox") + b"d" + struct.pack(">H", len(cols))
for name, oid in cols:
    rel += b"\0" + cstr(name) + struct.pack(">Ii", oid, -1)
row = ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "order", "o-1", "OrderCreated",
       '{"total": 1}', '{"tenant": "t", "n": 1}', "2026-11-30 08:40:12.5+01", "erp"]
ins = b"I" + struct.pack(">I", 16384) + b"N" + struct.pack(">H", len(row)) + b"".join(text(v) for v in row)
begin = b"B" + struct.pack(">QqI", 0x2000, 1000, 731)
commit = b"C" + b"\0" + struct.pack(">QQq", 0x2000, 0x2030, 1000)
keepalive = b"k" + struct.pack(">QQ", 0x3000, 0) + b"\1"
upd = b"U" + struct.pack(">I", 16384) + b"K" + struct.pack(">H", 1) + text("k") + b"N" + struct.pack(">H", 2) + text("x") + b"u"
dele = b"D" + struct.pack(">I", 16384) + b"O" + struct.pack(">H", 1) + text("x")
trunc = b"T" + struct.pack(">IB", 1, 0) + struct.pack(">I", 16384)
msg = b"M" + b"\1" + struct.pack(">Q", 0x10) + cstr("outboxd") + struct.pack(">I", 3) + b"abc"
origin = b"O" + struct.pack(">Q", 0x10) + cstr("origin")
typ = b"Y" + struct.pack(">I", 16500) + cstr("public") + cstr("mood")


def seq(*msgs, version=0):
    # first byte: protocol version - 1 (and bit 2: streaming = parallel)
    return bytes([version]) + b"".join(struct.pack(">H", len(m)) + m for m in msgs)


seeds = {
    "insert": seq(xlog(begin), xlog(rel, 0), xlog(ins), xlog(commit)),
    "null_payload": seq(xlog(rel, 0), xlog(ins.replace(text('{"total": 1}'), b"n"))),
    "bytea": seq(xlog(rel.replace(struct.pack(">Ii", 3802, -1), struct.pack(">Ii", 17, -1), 1), 0),
                 xlog(ins.replace(text('{"total": 1}'), text("\\x00ff")))),
    "others": seq(xlog(upd), xlog(dele), xlog(trunc), xlog(msg), xlog(origin), xlog(typ), keepalive),
    "stream": seq(xlog(b"S" + struct.pack(">IB", 900, 1)),
                  xlog(b"R" + struct.pack(">I", 901) + rel[1:]),
                  xlog(b"I" + struct.pack(">I", 901) + ins[1:]),
                  xlog(b"E"),
                  xlog(b"A" + struct.pack(">IIQq", 900, 901, 0x600, 1)),
                  xlog(b"c" + struct.pack(">IBQQq", 900, 0, 0x500, 0x530, 1)), version=3 | 4),
    "twophase": seq(xlog(b"b" + struct.pack(">QQqI", 0x700, 0x730, 1, 42) + cstr("g")),
                    xlog(b"P" + b"\0" + struct.pack(">QQqI", 0x700, 0x730, 1, 42) + cstr("g")),
                    xlog(b"K" + b"\0" + struct.pack(">QQqI", 0x800, 0x830, 1, 42) + cstr("g")),
                    xlog(b"r" + b"\0" + struct.pack(">QQqqI", 0x900, 0x930, 1, 2, 42) + cstr("g")),
                    version=2),
}
for name, data in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)


# captured fixtures: consecutive runs of messages, each run under libFuzzer's max_len
fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "pgoutput")
for name, version in (("pg15-v3.hex", 2), ("pg15-v1-binary.hex", 0)):
    path = os.path.join(fixtures, name)
    if not os.path.exists(path):
        sys.exit("make_seeds: %s is missing (tests/fixtures/capture-pgoutput.sh writes it)" % path)
    run, size, k = [], 0, 0
    with open(path) as f:
        msgs = [bytes.fromhex(line.split()[1]) for line in f if line.strip()]
    for m in msgs:
        framed = xlog(m)
        if run and size + len(framed) + 2 > 8000:
            with open(os.path.join(out, "%s-%03d" % (name[:-4], k)), "wb") as f:
                f.write(seq(*run, version=version))
            run, size, k = [], 0, k + 1
        if len(framed) + 3 <= 8000:
            run.append(framed)
            size += len(framed) + 2
    if run:
        with open(os.path.join(out, "%s-%03d" % (name[:-4], k)), "wb") as f:
            f.write(seq(*run, version=version))
