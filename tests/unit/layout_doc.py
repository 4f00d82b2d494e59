#!/usr/bin/env python3
"""docs/internals/design.md's "Source layout" names every source file, and only those.

Every .c file under src/<layer>/ (core, pg, kafka, run, cmd, sys) must be a
row of the table under its layer's paragraph (a row starting with
| `name.c` |), and every row must name a file that exists in that layer.
Header-only files under include/obx/<layer>/ must be named in the section
too.  Prints what is missing or stale and exits 1.

Usage: layout_doc.py SOURCE_DIR
"""
import os
import re
import sys

LAYERS = ("core", "pg", "kafka", "run", "cmd", "sys")


def main():
    top = sys.argv[1]
    text = open(os.path.join(top, "docs/internals/design.md")).read()
    start = text.index("\n## Source layout")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end > 0 else len(text)]
    bad = []
    # each layer's paragraph starts with **`src/<layer>/`
    parts = re.split(r"\n\*\*`src/([a-z]+)/`", section)
    listed = {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}
    for layer in LAYERS:
        d = os.path.join(top, "src", layer)
        have = {f for f in os.listdir(d) if f.endswith(".c")}
        body = listed.get(layer)
        if body is None:
            bad.append("no paragraph for src/%s/" % layer)
            continue
        rows = set(re.findall(r"^\| `([a-z_0-9]+\.c)` \|", body, re.M))
        for f in sorted(have - rows):
            bad.append("src/%s/%s has no row under src/%s/" % (layer, f, layer))
        for f in sorted(rows - have):
            bad.append("src/%s/ lists %s, which does not exist" % (layer, f))
        hdrs = os.path.join(top, "include/obx", layer)
        for h in sorted(os.listdir(hdrs)):
            c = h[:-2] + ".c"
            if h.endswith(".h") and c not in have and ("`%s`" % h) not in body \
                    and ("include/obx/%s/%s" % (layer, h)) not in body:
                bad.append("include/obx/%s/%s (no .c) is not named under src/%s/" % (layer, h, layer))
    for b in bad:
        print("layout_doc: docs/internals/design.md, \"Source layout\": " + b, file=sys.stderr)
    if bad:
        sys.exit(1)
    print("layout_doc: every file of src/ has its row")


main()
