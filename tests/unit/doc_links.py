#!/usr/bin/env python3
"""Every relative link of the documentation resolves.

Reads README.md and every .md file under docs/, and for each Markdown link
[text](target) that is not a URL checks that the target file exists and, for
a target#anchor into a Markdown file (or #anchor alone), that the file has a
heading with that anchor (GitHub's rule: lower case, punctuation dropped,
spaces as hyphens, -1, -2 ... for repeated headings).  Links inside code
spans and code blocks are not links.  Prints each broken link with its file
and line, and exits 1 if there is one.

Usage: doc_links.py SOURCE_DIR
"""
import os
import re
import sys

# Documents another change of the tree writes; a link to one is allowed before it lands.
PENDING = set()

LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)\)")


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def prose_lines(text):
    """Yields (line number, line) outside fenced and indented code, code spans blanked."""
    fence = False
    for n, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if fence:
            continue
        yield n, re.sub(r"`[^`]*`", "``", line)


def headings(path):
    """Anchors of path, computed from the headings' full text (code spans kept)."""
    seen, found = {}, set()
    fence = False
    with open(path, encoding="utf-8") as f:
        for line in f.read().split("\n"):
            if line.lstrip().startswith("```"):
                fence = not fence
                continue
            m = None if fence else re.match(r"#{1,6} (.+)$", line)
            if m:
                s = slug(m.group(1))
                k = seen.get(s, 0)
                found.add(s if k == 0 else "%s-%d" % (s, k))
                seen[s] = k + 1
    return found


def main():
    root = os.path.abspath(sys.argv[1])
    docs = ["README.md"]
    for d, _, files in os.walk(os.path.join(root, "docs")):
        docs += [os.path.relpath(os.path.join(d, f), root) for f in files if f.endswith(".md")]
    bad = 0
    for doc in sorted(docs):
        path = os.path.join(root, doc)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for n, line in prose_lines(text):
            if line.startswith("    ") and not line.lstrip().startswith(("-", "|")):
                continue  # an indented code block
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue
                file, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
                rel = os.path.relpath(dest, root)
                if not os.path.exists(dest):
                    if rel not in PENDING:
                        print("%s:%d: %s: no such file" % (doc, n, target))
                        bad += 1
                    continue
                if anchor and dest.endswith(".md") and anchor not in headings(dest):
                    print("%s:%d: %s: no heading with that anchor in %s" % (doc, n, target, rel))
                    bad += 1
    print("%d document(s), %d broken link(s)" % (len(docs), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
