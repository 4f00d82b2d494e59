#!/usr/bin/env python3
"""Builds deploy/Containerfile's image as a directory, without a container engine.

Usage: image-rootfs.py [--containerfile FILE] [--context DIR] [--build-arg K=V]... OUT

Reads the Containerfile and replays it: each FROM is a Debian file system made
by debootstrap (--variant=minbase) and set up as the official image is
(apt sources, apt's cleanup, a policy-rc.d, and for -slim dpkg's path
excludes), each RUN runs in a chroot of it with the stage's WORKDIR, USER, ARG
and ENV, each COPY copies from the context or from an earlier stage's
directory.  The last stage's file system is left in OUT (replaced if
present), and the image's configuration (user, entrypoint, cmd, workdir, env,
exposed ports, labels) in OUT.json.  An instruction it does not know stops it:
the file it proves is the file as written.

What a stage does before its first COPY depends on the Containerfile alone,
so it is kept, as a container engine keeps a layer: the debootstrap result
and each stage's prefix live under OBX_ROOTFS_CACHE
(default $OBX_DEPS_CACHE/rootfs-trixie, OBX_DEPS_CACHE being
/var/cache/outboxd-deps), each with a stamp, named by a hash of the
instructions that made it and of the debootstrap it started from.  The
debootstrap is made again after 30 days, which renews the layers too;
layers unused for 14 days are removed.  Deleting the folder starts afresh.

Needs root (debootstrap, chroot) and the debootstrap package; mounts
nothing.  OBX_DEBIAN_MIRROR names the mirror (http://deb.debian.org/debian).
"""
import argparse
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

# the images a FROM may name: Debian 13, full and slim, as Docker Hub's debian images are made
IMAGES = {
    "debian:13": ("trixie", False),
    "debian:trixie": ("trixie", False),
    "debian:13-slim": ("trixie", True),
    "debian:trixie-slim": ("trixie", True),
}
MIRROR = os.environ.get("OBX_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SECURITY = "http://deb.debian.org/debian-security"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_DAYS = 30
LAYER_DAYS = 14
STAMP = ".outboxd-layer"


def log(msg):
    print("image-rootfs: " + msg, flush=True)


def die(msg):
    print("image-rootfs: " + msg, file=sys.stderr, flush=True)
    sys.exit(1)


def parse(path):
    """The Containerfile as (line number, INSTRUCTION, arguments), continuations joined."""
    out = []
    pending, start = None, 0
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            stripped = line.strip()
            # a comment or blank line, also inside a continued instruction
            if stripped.startswith("#") or (pending is None and not stripped):
                continue
            if pending is None:
                pending, start = "", n
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            pending += line
            word, _, rest = pending.strip().partition(" ")
            out.append((start, word.upper(), rest.strip()))
            pending = None
    if pending is not None:
        die(f"{path}:{start}: the file ends inside an instruction")
    return out


def substitute(text, env):
    """${VAR} and $VAR from env, as the engine expands them outside RUN."""

    def repl(m):
        return env.get(m.group(1) or m.group(2), "")

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", repl, text)


def key_value_pairs(text):
    """LABEL/ENV arguments: k=v pairs, values may be quoted."""
    pairs = {}
    for word in shlex.split(text):
        if "=" not in word:
            die(f"expected KEY=VALUE, got {word!r}")
        k, v = word.split("=", 1)
        pairs[k] = v
    return pairs


def user_ids(root, user):
    """uid, gid of a USER value (name or number, optional :group) in root's passwd and group."""
    name, _, group = user.partition(":")

    def lookup(file, key, field):
        with open(os.path.join(root, "etc", file)) as f:
            for line in f:
                parts = line.rstrip("\n").split(":")
                if parts[0] == key:
                    return int(parts[field])
        die(f"USER {user}: no {key} in /etc/{file}")

    uid = int(name) if name.isdigit() else lookup("passwd", name, 2)
    if group:
        gid = int(group) if group.isdigit() else lookup("group", group, 2)
    elif name.isdigit():
        gid = uid
    else:
        gid = lookup("passwd", name, 3)
    return uid, gid


def chroot_run(root, argv, workdir="/", user="", env=None, stdout=None):
    """Runs argv in a chroot of root, in workdir, as user (USER syntax), with exactly env."""
    uid = gid = None
    if user:
        uid, gid = user_ids(root, user)

    def enter():
        os.chroot(root)
        os.chdir(workdir)
        if gid is not None:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)

    return subprocess.run(argv, preexec_fn=enter, env=env, stdin=subprocess.DEVNULL, stdout=stdout).returncode


def copy_tree(src, dst):
    subprocess.run(["cp", "-a", src, dst], check=True)


def debootstrap(cache, suite):
    """The minbase file system of suite in the cache, made when missing or older than BASE_DAYS."""
    base = os.path.join(cache, f"minbase-{suite}")
    stamp = os.path.join(base, STAMP)
    if os.path.exists(stamp) and time.time() - os.path.getmtime(stamp) < BASE_DAYS * 86400:
        return base
    if shutil.which("debootstrap") is None:
        die("debootstrap is missing (Debian package debootstrap; scripts/install-deps.sh installs it)")
    t0 = time.time()
    log(f"debootstrap --variant=minbase {suite} from {MIRROR}")
    tmp = tempfile.mkdtemp(prefix=f".minbase-{suite}.", dir=cache)
    logfile = tmp + ".log"
    with open(logfile, "w") as f:
        r = subprocess.run(["debootstrap", "--variant=minbase", suite, tmp, MIRROR], stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        with open(logfile) as f:
            sys.stderr.write("".join(f.readlines()[-30:]))
        shutil.rmtree(tmp, ignore_errors=True)
        die("debootstrap failed")
    os.unlink(logfile)
    # mkdtemp's 0700 would keep every user but root out of the file system
    os.chmod(tmp, 0o755)
    with open(os.path.join(tmp, STAMP), "w") as f:
        f.write(f"debootstrap --variant=minbase {suite} {MIRROR} {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
    shutil.rmtree(base, ignore_errors=True)
    os.rename(tmp, base)
    log(f"debootstrap: {time.time() - t0:.0f} s")
    return base


def image_setup(root, suite, slim):
    """What Docker Hub's debian image adds to a minbase debootstrap (debuerreotype)."""
    os.makedirs(os.path.join(root, "etc/apt/sources.list.d"), exist_ok=True)
    sl = os.path.join(root, "etc/apt/sources.list")
    if os.path.exists(sl):
        os.unlink(sl)
    keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    with open(os.path.join(root, "etc/apt/sources.list.d/debian.sources"), "w") as f:
        f.write(f"Types: deb\nURIs: {MIRROR}\nSuites: {suite} {suite}-updates\nComponents: main\nSigned-By: {keyring}\n\n")
        f.write(f"Types: deb\nURIs: {SECURITY}\nSuites: {suite}-security\nComponents: main\nSigned-By: {keyring}\n")
    # no downloaded .deb or package cache kept in a layer
    clean = 'rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true'
    with open(os.path.join(root, "etc/apt/apt.conf.d/docker-clean"), "w") as f:
        f.write(f'DPkg::Post-Invoke {{ "{clean}"; }};\nAPT::Update::Post-Invoke {{ "{clean}"; }};\n')
        f.write('Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n')
    # packages never start services in a build
    policy = os.path.join(root, "usr/sbin/policy-rc.d")
    with open(policy, "w") as f:
        f.write("#!/bin/sh\nexit 101\n")
    os.chmod(policy, 0o755)
    if slim:
        excludes = [
            "path-exclude /usr/share/doc/*",
            "path-include /usr/share/doc/*/copyright",
            "path-exclude /usr/share/info/*",
            "path-exclude /usr/share/linda/*",
            "path-exclude /usr/share/lintian/overrides/*",
            "path-exclude /usr/share/locale/*",
            "path-exclude /usr/share/man/*",
            "path-exclude /usr/share/groff/*",
        ]
        with open(os.path.join(root, "etc/dpkg/dpkg.cfg.d/docker"), "w") as f:
            f.write("\n".join(excludes) + "\n")
        # and what the base already holds of them
        for d in ("doc", "info", "linda", "lintian/overrides", "locale", "man", "groff"):
            top = os.path.join(root, "usr/share", d)
            for dirpath, dirnames, filenames in os.walk(top, topdown=False):
                for e in filenames + dirnames:
                    p = os.path.join(dirpath, e)
                    if d == "doc" and e == "copyright" and os.path.dirname(dirpath) == top:
                        continue
                    if os.path.isdir(p) and not os.path.islink(p):
                        if not os.listdir(p):
                            os.rmdir(p)
                    else:
                        os.unlink(p)


class Stage:
    def __init__(self, index, image, name):
        self.index, self.image, self.name = index, image, name
        self.instructions = []
        self.root = None
        self.workdir = "/"
        self.user = ""
        self.args = {}
        self.env = {"PATH": DEFAULT_PATH}
        self.labels = {}
        self.expose = []
        self.entrypoint = None
        self.cmd = None


def stages_of(instructions, path):
    stages = []
    for n, word, rest in instructions:
        if word == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            if not m:
                die(f"{path}:{n}: FROM {rest}: expected IMAGE [AS NAME]")
            if m.group(1) not in IMAGES:
                die(f"{path}:{n}: FROM {m.group(1)}: only {', '.join(IMAGES)} can be made here")
            stages.append(Stage(len(stages), m.group(1), m.group(2)))
        elif not stages:
            die(f"{path}:{n}: {word} before the first FROM")
        else:
            stages[-1].instructions.append((n, word, rest))
    if not stages:
        die(f"{path}: no FROM")
    return stages


def run_instruction(stage, n, word, rest, stages, context, build_args, path):
    st = stage
    if word == "RUN":
        if rest.startswith("["):
            die(f"{path}:{n}: RUN in exec form is not replayed")
        t0 = time.time()
        log(f"{st.image} line {n}: RUN {rest[:100]}{'...' if len(rest) > 100 else ''}")
        env = dict(st.args)
        env.update(st.env)
        env.setdefault("HOME", "/root")
        env.setdefault("HOSTNAME", "outboxd-image")
        r = chroot_run(st.root, ["/bin/sh", "-c", rest], st.workdir, st.user, env)
        if r != 0:
            die(f"{path}:{n}: RUN exited {r}")
        log(f"  {time.time() - t0:.0f} s")
    elif word == "WORKDIR":
        wd = substitute(rest, {**st.args, **st.env})
        st.workdir = os.path.normpath(os.path.join(st.workdir, wd))
        os.makedirs(st.root + st.workdir, exist_ok=True)
    elif word == "COPY":
        words = shlex.split(substitute(rest, {**st.args, **st.env}))
        src_root = context
        while words and words[0].startswith("--"):
            opt = words.pop(0)
            if opt.startswith("--from="):
                ref = opt[len("--from="):]
                src = [s for s in stages[: st.index] if s.name == ref or str(s.index) == ref]
                if not src:
                    die(f"{path}:{n}: COPY --from={ref}: no earlier stage of that name")
                src_root = src[0].root
            else:
                die(f"{path}:{n}: COPY {opt} is not replayed")
        if len(words) < 2:
            die(f"{path}:{n}: COPY needs a source and a destination")
        dst = words[-1]
        dst_abs = os.path.normpath(os.path.join(st.workdir, dst))
        into_dir = dst.endswith("/") or len(words) > 2
        for s in words[:-1]:
            sp = os.path.normpath(os.path.join(src_root, s.lstrip("/")))
            if not sp.startswith(os.path.normpath(src_root)) or not os.path.exists(sp):
                die(f"{path}:{n}: COPY {s}: not found in {'the context' if src_root == context else 'the stage'}")
            target = st.root + dst_abs
            if os.path.isdir(sp):
                # a directory's contents, as the engine copies them
                os.makedirs(target, exist_ok=True)
                subprocess.run(["cp", "-R", "--preserve=mode,timestamps", sp + "/.", target], check=True)
            else:
                if into_dir:
                    os.makedirs(target, exist_ok=True)
                    target = os.path.join(target, os.path.basename(sp))
                else:
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                subprocess.run(["cp", "--preserve=mode,timestamps", sp, target], check=True)
        # owned by root, as the engine makes them without --chown
        subprocess.run(["chown", "-R", "0:0", st.root + dst_abs], check=True)
    elif word == "USER":
        st.user = substitute(rest, {**st.args, **st.env})
        user_ids(st.root, st.user)  # the user must exist (or be numeric)
    elif word == "ARG":
        name, eq, default = rest.partition("=")
        st.args[name] = build_args.get(name, default if eq else "")
    elif word == "ENV":
        st.env.update({k: substitute(v, {**st.args, **st.env}) for k, v in key_value_pairs(rest).items()})
    elif word == "LABEL":
        st.labels.update({k: substitute(v, {**st.args, **st.env}) for k, v in key_value_pairs(rest).items()})
    elif word == "EXPOSE":
        st.expose += rest.split()
    elif word in ("ENTRYPOINT", "CMD"):
        if not rest.startswith("["):
            die(f"{path}:{n}: {word} in shell form is not replayed")
        value = json.loads(rest)
        if word == "ENTRYPOINT":
            st.entrypoint = value
        else:
            st.cmd = value
    else:
        die(f"{path}:{n}: {word}: an instruction this script does not replay")


def prepare_stage(st, cache, path, build_args):
    """The stage's root with its instructions up to the first COPY done, from the cache or made."""
    suite, slim = IMAGES[st.image]
    base = debootstrap(cache, suite)
    with open(os.path.join(base, STAMP)) as f:
        base_id = f.read()
    prefix = []
    for ins in st.instructions:
        if ins[1] == "COPY":
            break
        prefix.append(ins)
    # ARG values reach RUN: the ones given on the command line are part of the key
    argnames = [rest.partition("=")[0] for _, w, rest in prefix if w == "ARG"]
    key_text = json.dumps([base_id, st.image, [(w, r) for _, w, r in prefix], {a: build_args.get(a) for a in argnames}])
    key = hashlib.sha256(key_text.encode()).hexdigest()[:16]
    layer = os.path.join(cache, f"layer-{key}")
    stamp = os.path.join(layer, STAMP)
    if not os.path.exists(stamp):
        t0 = time.time()
        log(f"{st.image}: making layer {key} (FROM and the instructions before its first COPY)")
        tmp = tempfile.mkdtemp(prefix=f".layer-{key}.", dir=cache)
        os.rmdir(tmp)
        copy_tree(base, tmp)
        os.unlink(os.path.join(tmp, STAMP))
        image_setup(tmp, suite, slim)
        # a stage of its own: the state these instructions leave is set again on each use
        scratch = Stage(st.index, st.image, st.name)
        scratch.root = tmp
        for n, word, rest in prefix:
            run_instruction(scratch, n, word, rest, [], None, build_args, path)
        with open(os.path.join(tmp, STAMP), "w") as f:
            f.write(key_text + "\n")
        os.rename(tmp, layer)
        log(f"{st.image}: layer {key} made in {time.time() - t0:.0f} s")
    os.utime(stamp)
    return layer, prefix


def prune(cache, keep):
    for e in os.listdir(cache):
        p = os.path.join(cache, e)
        if e.startswith(".layer-") or e.startswith(".minbase-"):
            # an interrupted run's leftovers (the cache is locked while one runs)
            shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else os.unlink(p)
        elif e.startswith("layer-") and p not in keep:
            s = os.path.join(p, STAMP)
            if not os.path.exists(s) or time.time() - os.path.getmtime(s) > LAYER_DAYS * 86400:
                shutil.rmtree(p, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description="Builds a Containerfile's image as a directory with debootstrap and chroot.")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--containerfile", default=os.path.join(here, "deploy/Containerfile"))
    ap.add_argument("--context", default=here)
    ap.add_argument("--build-arg", action="append", default=[], metavar="K=V")
    ap.add_argument("out")
    a = ap.parse_args()
    if os.geteuid() != 0:
        die("needs root (debootstrap, chroot)")
    build_args = dict(x.split("=", 1) for x in a.build_arg)
    cache = os.environ.get("OBX_ROOTFS_CACHE") or os.path.join(
        os.environ.get("OBX_DEPS_CACHE", "/var/cache/outboxd-deps"), "rootfs-trixie")
    os.makedirs(cache, exist_ok=True)
    out = os.path.abspath(a.out)
    context = os.path.abspath(a.context)
    t0 = time.time()
    stages = stages_of(parse(a.containerfile), a.containerfile)

    work = []
    lock = open(os.path.join(cache, ".lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        prune(cache, set())
        layers = [prepare_stage(st, cache, a.containerfile, build_args) for st in stages]
        prune(cache, {layer for layer, _ in layers})
        # each stage's own directory, a copy of its layer, next to OUT
        shutil.rmtree(out, ignore_errors=True)
        for st, (layer, prefix) in zip(stages, layers):
            root = out if st is stages[-1] else f"{out}.stage{st.index}"
            shutil.rmtree(root, ignore_errors=True)
            copy_tree(layer, root)
            os.unlink(os.path.join(root, STAMP))
            os.chmod(root, 0o755)
            work.append(root)
            # the prefix again for its state (WORKDIR, USER, ARG, ...), its RUNs being in the layer
            st.root = root
            for n, word, rest in prefix:
                if word != "RUN":
                    run_instruction(st, n, word, rest, stages, context, build_args, a.containerfile)
        fcntl.flock(lock, fcntl.LOCK_UN)
        for st, (_, prefix) in zip(stages, layers):
            for n, word, rest in st.instructions[len(prefix):]:
                run_instruction(st, n, word, rest, stages, context, build_args, a.containerfile)
        last = stages[-1]
        config = {
            "user": last.user,
            "workdir": last.workdir,
            "env": last.env,
            "entrypoint": last.entrypoint,
            "cmd": last.cmd,
            "expose": last.expose,
            "labels": last.labels,
        }
        with open(out + ".json", "w") as f:
            json.dump(config, f, indent=2)
            f.write("\n")
    finally:
        for root in work[:-1]:
            shutil.rmtree(root, ignore_errors=True)
        lock.close()
    log(f"{out}: the image's file system ({last.image}), configuration in {out}.json, {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
