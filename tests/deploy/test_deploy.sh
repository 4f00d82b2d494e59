#!/usr/bin/env bash
# deploy/ can be checked without a container engine or a cluster: every YAML
# and JSON file parses, yamllint accepts the manifests, promtool accepts the
# alert rules, the Deployment keeps the properties the design relies on, and
# the container file runs as non-root on Debian 12 slim.  (That every metric
# named in the alerts and the dashboard exists is checked against a live
# scrape in tests/integration/test_ops.c.)
set -uo pipefail
src=${OBX_SOURCE_DIR:?}
n=0
failed=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $1"; }
run() { local d=$1; shift; if out=$("$@" 2>&1); then ok "$d"; else not_ok "$d: $out"; fi; }
tmp=$(mktemp -d /tmp/obx-deploy.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

for f in $(find "$src/deploy/kubernetes" -name "*.yaml" | sort); do
	run "${f#"$src"/deploy/kubernetes/} parses" python3 -c 'import sys, yaml; list(yaml.safe_load_all(open(sys.argv[1])))' "$f"
done
run "yamllint accepts the manifests" yamllint -d '{extends: relaxed, rules: {line-length: {max: 200}}}' "$src/deploy/kubernetes"
run "the dashboard is JSON, with slot and pod variables every query filters by" python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["panels"]; v = [t["name"] for t in d["templating"]["list"]]; assert "slot" in v and "pod" in v, v; assert all("$pod" in t["expr"] for p in d["panels"] for t in p.get("targets", []))' \
	"$src/deploy/grafana/outboxd-dashboard.json"

python3 - "$src/deploy/kubernetes/prometheusrule.yaml" "$tmp/rules.yaml" <<'PY'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
yaml.safe_dump({"groups": doc["spec"]["groups"]}, open(sys.argv[2], "w"))
PY
run "promtool accepts the alert rules" promtool check rules "$tmp/rules.yaml"
cp "$src/tests/deploy/alerts_test.yaml" "$tmp/alerts_test.yaml"
run "alerts: each fires when it should and not otherwise, once per slot with two pods (promtool test rules)" \
	promtool test rules "$tmp/alerts_test.yaml"
run "alerts: summary, description and a runbook_url on one base with an anchor README.md has; up{job} is the PodMonitor's" \
	python3 - "$src/deploy/kubernetes/prometheusrule.yaml" "$src/README.md" "$src/deploy/kubernetes/podmonitor.yaml" \
	"$src/deploy/kubernetes/base/deployment.yaml" "$src/deploy/grafana/outboxd-dashboard.json" <<'PY'
import re, sys, yaml
rules = [r for g in yaml.safe_load(open(sys.argv[1]))["spec"]["groups"] for r in g["rules"]]
readme = open(sys.argv[2]).read()
runbook = readme[readme.index("### Alert runbook"):]
runbook = runbook[:runbook.index("\n### ", 5)]
anchors = {h.strip().lower() for h in re.findall(r"^#### (.+)$", runbook, re.M)}
bases = set()
for r in rules:
    a = r["annotations"]
    assert a.get("summary") and a.get("description"), r["alert"]
    url = a["runbook_url"]
    assert url.startswith("https://"), url
    base, anchor = url.split("#")
    bases.add(base)
    assert anchor == r["alert"].lower() and anchor in anchors, (r["alert"], "no #### heading in README's Alert runbook")
assert len(bases) == 1, bases
pm = yaml.safe_load(open(sys.argv[3]))["spec"]
dep = [d for d in yaml.safe_load_all(open(sys.argv[4])) if d["kind"] == "Deployment"][0]
job = dep["spec"]["template"]["metadata"]["labels"][pm["jobLabel"]]
text = open(sys.argv[1]).read() + open(sys.argv[5]).read()
for sel in re.findall(r"\bup\{([^}]*)\}", text):
    assert 'job=\\"%s\\"' % job in sel or 'job="%s"' % job in sel, sel
PY

run "deployment: 2 replicas, maxSurge 1, maxUnavailable 1, probes, grace covers the 30 s drain, PDB" \
	python3 - "$src/deploy/kubernetes/base/deployment.yaml" <<'PY'
import sys, yaml
docs = {d["kind"]: d for d in yaml.safe_load_all(open(sys.argv[1]))}
dep = docs["Deployment"]["spec"]
assert dep["replicas"] == 2
ru = dep["strategy"]["rollingUpdate"]
assert ru["maxSurge"] == 1 and ru["maxUnavailable"] == 1
pod = dep["template"]["spec"]
assert pod["terminationGracePeriodSeconds"] > 30
c = pod["containers"][0]
assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
assert pod["securityContext"]["runAsNonRoot"] is True
assert docs["PodDisruptionBudget"]["spec"]["minAvailable"] == 1
PY
run "deployment: no service links; the config file is where args say; every file the INI and env name is mounted from a Secret" \
	python3 - "$src/deploy/kubernetes/base/deployment.yaml" "$src/deploy/kubernetes/base/outboxd.ini" \
	"$src/deploy/kubernetes/base/secret.yaml" <<'PY'
import re, sys, yaml
docs = {d["kind"]: d for d in yaml.safe_load_all(open(sys.argv[1]))}
pod = docs["Deployment"]["spec"]["template"]["spec"]
assert pod["enableServiceLinks"] is False
c = pod["containers"][0]
vols = {v["name"]: v for v in pod["volumes"]}
mounts = {m["mountPath"]: vols[m["name"]] for m in c["volumeMounts"]}
ini = open(sys.argv[2]).read()
conf = c["args"][c["args"].index("-c") + 1]
assert conf.rsplit("/", 1)[0] in mounts and "configMap" in mounts[conf.rsplit("/", 1)[0]], conf
paths = re.findall(r"(?:sslrootcert|sslcert|sslkey)=(\S+)", ini)
paths += [e["value"] for e in c.get("env", []) if e["name"].endswith("_FILE")]
assert paths, "expected file paths to check"
secret_keys = set(yaml.safe_load(open(sys.argv[3]))["stringData"])
for p in paths:
    d, f = p.rsplit("/", 1)
    assert d in mounts, p + " is not under a mounted volume"
    assert "secret" in mounts[d], p + " is not mounted from a Secret"
    if mounts[d]["secret"]["secretName"] == "outboxd":
        assert f in secret_keys, p + ": no such key in secret.yaml"
for e in c.get("env", []):
    ref = e.get("valueFrom", {}).get("secretKeyRef")
    if ref is not None and ref["name"] == "outboxd":
        assert ref["key"] in secret_keys, ref["key"] + ": no such key in secret.yaml"
PY
run "no secret in the ConfigMap's INI" python3 - $(find "$src/deploy/kubernetes" -name outboxd.ini) <<'PY'
import sys
ini = "".join(open(f).read() for f in sys.argv[1:])
for word in ("password", "sasl.username"):
    for line in ini.splitlines():
        if not line.lstrip().startswith(";") and word in line.split("=")[0]:
            raise SystemExit("secret key in ConfigMap: " + line)
PY
run "the base's INI is a valid outboxd configuration" bash -c \
	"'${OBX_OUTBOXD:?}' check -c '$src/deploy/kubernetes/base/outboxd.ini' --set source.conninfo=host=127.0.0.1\\ port=1 2>&1 | grep -q 'FAIL server: could not connect'"
run "container: multi-stage, Debian 12 slim runtime, non-root" bash -c \
	"grep -q '^FROM debian:12 AS build' '$src/deploy/Containerfile' && grep -q '^FROM debian:12-slim' '$src/deploy/Containerfile' && grep -q '^USER 10001' '$src/deploy/Containerfile'"

# The per-database overlays, rendered by kubectl's built-in kustomize: two instances
# side by side in one namespace must not share a name, a selector or a slot.
overlays() {
	local o rendered=()
	for o in "$src"/deploy/kubernetes/overlays/*/; do
		o=$(basename "$o")
		kubectl kustomize "$src/deploy/kubernetes/overlays/$o" >"$tmp/overlay-$o.yaml" || return 1
		rendered+=("$o")
	done
	python3 - "$tmp" "${rendered[@]}" <<'PY' || return 1
import re, sys, yaml
tmp, names = sys.argv[1], sys.argv[2:]
assert len(names) >= 2, names
seen, slots = {}, {}
for o in names:
    docs = [d for d in yaml.safe_load_all(open(f"{tmp}/overlay-{o}.yaml")) if d]
    kinds = {}
    for d in docs:
        key = (d["kind"], d["metadata"]["name"])
        assert key not in seen, f"{key} in both {seen.get(key)} and {o}"
        seen[key] = o
        kinds.setdefault(d["kind"], []).append(d)
        assert d["metadata"]["labels"].get("app.kubernetes.io/instance") == o, (o, key)
    dep = kinds["Deployment"][0]
    sel = dep["spec"]["selector"]["matchLabels"]
    assert sel.get("app.kubernetes.io/instance") == o, (o, sel)
    assert all(dep["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())
    assert kinds["PodDisruptionBudget"][0]["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/instance") == o
    assert kinds["Service"][0]["spec"]["selector"].get("app.kubernetes.io/instance") == o
    names_here = {(d["kind"], d["metadata"]["name"]) for d in docs}
    pod = dep["spec"]["template"]["spec"]
    for v in pod["volumes"]:
        if "configMap" in v:
            assert ("ConfigMap", v["configMap"]["name"]) in names_here, (o, v)
        if "secret" in v and v["secret"]["secretName"] != "outboxd-tls":
            assert ("Secret", v["secret"]["secretName"]) in names_here, (o, v)
    for e in pod["containers"][0].get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ("Secret", ref["name"]) in names_here, (o, ref)
    ini = kinds["ConfigMap"][0]["data"]["outboxd.ini"]
    open(f"{tmp}/overlay-{o}.ini", "w").write(ini)
    slot = re.search(r"^slot = (\S+)", ini, re.M).group(1)
    assert slot not in slots, f"slot {slot} in both {slots.get(slot)} and {o}"
    slots[slot] = o
PY
	for o in "${rendered[@]}"; do
		# a valid configuration gets as far as connecting (to nothing)
		out=$("${OBX_OUTBOXD:?}" check -c "$tmp/overlay-$o.ini" --set source.conninfo=host=127.0.0.1\ port=1 2>&1)
		grep -q 'FAIL server: could not connect' <<<"$out" || { echo "overlay $o: $out"; return 1; }
	done
}
run "kustomize: per-database overlays render with distinct names, labels, selectors and slots" overlays

# The build stage, replayed without a container engine: exactly the files its COPY
# lines bring in, in a fresh directory, then its cmake commands.
containerfile_build() {
	local ctx=$tmp/container-src stage
	mkdir -p "$ctx"
	stage=$(sed -n '/^FROM .* AS build/,/^FROM /p' "$src/deploy/Containerfile")
	while read -r _ args; do
		# shellcheck disable=SC2086
		set -- $args
		local dst=${!#} n=$(($# - 1))
		for s in "${@:1:$n}"; do
			if [ "$dst" = "./" ]; then cp -r "$src/$s" "$ctx/"; else cp -r "$src/$s" "$ctx/$dst"; fi
		done
	done < <(printf '%s\n' "$stage" | grep '^COPY ')
	cmds=$(printf '%s\n' "$stage" | sed -n '/^RUN cmake/,/^[^ ]/p' | grep -v '^FROM' | sed 's/^RUN //; s/\\$//; s/"$(nproc)"/2/' | tr '\n' ' ')
	(cd "$ctx" && eval "$cmds") >"$tmp/container-build.log" 2>&1 || { tail -20 "$tmp/container-build.log"; return 1; }
	test -x "$ctx/build/outboxd" && "$ctx/build/outboxd" --version
}
run "Containerfile: the build stage builds from exactly its COPY lines" containerfile_build

echo "1..$n"
[ "$failed" -eq 0 ]
