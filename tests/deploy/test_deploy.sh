#!/usr/bin/env bash
# deploy/ can be checked without a container engine or a cluster: every YAML
# and JSON file parses, yamllint accepts the manifests, promtool accepts the
# alert rules, the Deployment keeps the properties the design relies on, every
# overlay renders (kustomize) into objects an SRE expects (credentials only as
# mounted files from Secrets that no apply overwrites, the recommended labels,
# spread over nodes and zones, per-instance Secrets, monitoring selected by
# kube-prometheus-stack), and the container file runs as non-root on Debian 13
# slim with the OCI labels.  (That the image builds and relays on Debian 13 is
# tests/deploy/test_image.sh.)  (That every metric
# named in the alerts and the dashboard exists is checked against a live
# scrape in tests/integration/t6000_metrics_health.c.)
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

python3 - "$src/deploy/kubernetes/components/monitoring/prometheusrule.yaml" "$tmp/rules.yaml" <<'PY'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
yaml.safe_dump({"groups": doc["spec"]["groups"]}, open(sys.argv[2], "w"))
PY
run "promtool accepts the alert rules" promtool check rules "$tmp/rules.yaml"
cp "$src/tests/deploy/alerts_test.yaml" "$tmp/alerts_test.yaml"
run "alerts: each fires when it should and not otherwise, once per slot with two pods (promtool test rules)" \
	promtool test rules "$tmp/alerts_test.yaml"
run "alerts: summary, description and a runbook_url on one base with an anchor docs/reference/alerts.md has; up{job} is the PodMonitor's" \
	python3 - "$src/deploy/kubernetes/components/monitoring/prometheusrule.yaml" "$src/docs/reference/alerts.md" "$src/deploy/kubernetes/components/monitoring/podmonitor.yaml" \
	"$src/deploy/kubernetes/base/deployment.yaml" "$src/deploy/grafana/outboxd-dashboard.json" <<'PY'
import re, sys, yaml
rules = [r for g in yaml.safe_load(open(sys.argv[1]))["spec"]["groups"] for r in g["rules"]]
runbook = open(sys.argv[2]).read()
anchors = {h.strip().lower() for h in re.findall(r"^## (.+)$", runbook, re.M)}
bases = set()
for r in rules:
    a = r["annotations"]
    assert a.get("summary") and a.get("description"), r["alert"]
    url = a["runbook_url"]
    assert url.startswith("https://"), url
    base, anchor = url.split("#")
    bases.add(base)
    assert base.endswith("/docs/reference/alerts.md"), base
    assert anchor == r["alert"].lower() and anchor in anchors, (r["alert"], "no ## heading in docs/reference/alerts.md")
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
run "deployment: no service links; the config file is where args say; credentials only as files mounted from Secrets, readable by the pod's group alone" \
	python3 - "$src/deploy/kubernetes/base/deployment.yaml" "$src/deploy/kubernetes/base/outboxd.ini" <<'PY'
import re, sys, yaml
docs = {d["kind"]: d for d in yaml.safe_load_all(open(sys.argv[1]))}
pod = docs["Deployment"]["spec"]["template"]["spec"]
assert pod["enableServiceLinks"] is False
assert pod["automountServiceAccountToken"] is False
sc = pod["securityContext"]
assert sc["runAsUser"] != 0 and sc["fsGroup"] == sc["runAsGroup"], sc
c = pod["containers"][0]
vols = {v["name"]: v for v in pod["volumes"]}
mounts = {m["mountPath"]: vols[m["name"]] for m in c["volumeMounts"]}
ini = open(sys.argv[2]).read()
conf = c["args"][c["args"].index("-c") + 1]
assert conf.rsplit("/", 1)[0] in mounts and "configMap" in mounts[conf.rsplit("/", 1)[0]], conf
paths = re.findall(r"(?:sslrootcert|sslcert|sslkey)=(\S+)", ini)
paths += [e["value"] for e in c.get("env", []) if e["name"].endswith("_FILE")]
assert paths, "expected file paths to check"
for name in ("OUTBOXD_SOURCE_PASSWORD_FILE", "OUTBOXD_KAFKA_SASL_USERNAME_FILE", "OUTBOXD_KAFKA_SASL_PASSWORD_FILE"):
    assert any(e["name"] == name for e in c["env"]), name + " is not set"
for p in paths:
    d, f = p.rsplit("/", 1)
    assert d in mounts, p + " is not under a mounted volume"
    assert "secret" in mounts[d], p + " is not mounted from a Secret"
for v in vols.values():
    if "secret" in v:
        assert v["secret"].get("defaultMode") in (0o400, 0o440), (v["name"], v["secret"].get("defaultMode"))
for e in c.get("env", []):
    assert "valueFrom" not in e, e["name"] + ": a value from the API in the environment"
    assert not re.search(r"PASSWORD|SECRET|TOKEN", e["name"]) or e["name"].endswith("_FILE"), e["name"]
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
run "container: multi-stage, Debian 13 slim runtime, non-root" bash -c \
	"grep -q '^FROM debian:13 AS build' '$src/deploy/Containerfile' && grep -q '^FROM debian:13-slim' '$src/deploy/Containerfile' && grep -q '^USER 10001' '$src/deploy/Containerfile'"
run "container: OCI labels (title, description, source, licenses, version and revision from build arguments)" \
	python3 - "$src/deploy/Containerfile" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
final = text[text.rindex("\nFROM "):]
labels = dict(re.findall(r'(org\.opencontainers\.image\.[a-z]+)="([^"]*)"', final))
for k in ("title", "description", "source", "licenses", "version", "revision"):
    assert labels.get("org.opencontainers.image." + k), k + " missing"
assert labels["org.opencontainers.image.version"] == "${VERSION}" and re.search(r"^ARG VERSION", final, re.M)
assert labels["org.opencontainers.image.revision"] == "${REVISION}" and re.search(r"^ARG REVISION", final, re.M)
PY

# The per-database overlays, rendered by kustomize (a `kustomize` binary, else
# kubectl's built-in one; components need kustomize 4.2 / kubectl 1.22 or later).
# Two instances side by side in one namespace must not share a name, a selector,
# a slot or a Secret, and each object must carry what an SRE expects.
render() {
	if command -v kustomize >/dev/null 2>&1; then kustomize build "$1"; else kubectl kustomize "$1"; fi
}
overlays() {
	local o rendered=() k8s=$tmp/kubernetes
	# a copy, with the git-ignored files a secretGenerator reads written as a user would
	cp -r "$src/deploy/kubernetes" "$k8s"
	for o in "$k8s"/overlays/*/; do
		if grep -q '^secretGenerator:' "$o/kustomization.yaml"; then
			mkdir -p "$o/secrets"
			for f in pg-password kafka-sasl-username kafka-sasl-password; do
				printf 'test-only-%s\n' "$f" >"$o/secrets/$f"
			done
			if git -C "$src" rev-parse --git-dir >/dev/null 2>&1 &&
				! git -C "$src" check-ignore -q "deploy/kubernetes/overlays/$(basename "$o")/secrets/pg-password"; then
				echo "overlays/$(basename "$o")/secrets/ is not git-ignored"
				return 1
			fi
		fi
	done
	render "$k8s/base" >"$tmp/base.yaml" || return 1
	for o in "$k8s"/overlays/*/; do
		o=$(basename "$o")
		render "$k8s/overlays/$o" >"$tmp/overlay-$o.yaml" || return 1
		rendered+=("$o")
	done
	python3 - "$tmp" "${rendered[@]}" <<'PY' || return 1
import base64, re, sys, yaml
tmp, names = sys.argv[1], sys.argv[2:]
assert len(names) >= 2, names
base = [d for d in yaml.safe_load_all(open(f"{tmp}/base.yaml")) if d]
assert not [d for d in base if d["kind"] == "Secret"], "the base renders a Secret: an apply would overwrite the credentials"
recommended = ("name", "instance", "version", "component", "part-of", "managed-by")
seen, slots, tls, creds = {}, {}, {}, {}
for o in names:
    docs = [d for d in yaml.safe_load_all(open(f"{tmp}/overlay-{o}.yaml")) if d]
    kinds = {}
    for d in docs:
        key = (d["kind"], d["metadata"]["name"])
        assert key not in seen, f"{key} in both {seen.get(key)} and {o}"
        seen[key] = o
        kinds.setdefault(d["kind"], []).append(d)
        labels = d["metadata"].get("labels", {})
        for k in recommended:
            assert labels.get("app.kubernetes.io/" + k), (o, key, "lacks app.kubernetes.io/" + k)
        assert labels["app.kubernetes.io/instance"] == o and labels["app.kubernetes.io/name"] == "outboxd", (o, key)
        if d["kind"] == "Secret":
            # only generated from the files above, never a literal in the manifests
            for k, v in d.get("data", {}).items():
                assert base64.b64decode(v).decode().startswith("test-only-"), (o, key, k)
            assert not d.get("stringData"), (o, key)
    stable = {"app.kubernetes.io/name": "outboxd", "app.kubernetes.io/instance": o}
    dep = kinds["Deployment"][0]
    sel = dep["spec"]["selector"]["matchLabels"]
    assert sel == stable, (o, "selector must be name + instance only", sel)
    tpl = dep["spec"]["template"]["metadata"]["labels"]
    for k in recommended:
        assert tpl.get("app.kubernetes.io/" + k), (o, "pod template lacks app.kubernetes.io/" + k)
    assert kinds["PodDisruptionBudget"][0]["spec"]["selector"]["matchLabels"] == stable
    assert kinds["Service"][0]["spec"]["selector"] == stable
    names_here = {(d["kind"], d["metadata"]["name"]) for d in docs}
    pod = dep["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False, o
    spread = {t["topologyKey"]: t for t in pod.get("topologySpreadConstraints", [])}
    assert set(spread) >= {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}, (o, list(spread))
    assert spread["topology.kubernetes.io/zone"]["whenUnsatisfiable"] == "ScheduleAnyway"
    for t in spread.values():
        assert t["labelSelector"]["matchLabels"] == stable, (o, t)
    c = pod["containers"][0]
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: vols[m["name"]] for m in c["volumeMounts"]}
    for e in c.get("env", []):
        assert "secretKeyRef" not in e.get("valueFrom", {}), (o, e["name"], "a secret in the environment")
    for v in pod["volumes"]:
        if "configMap" in v:
            assert ("ConfigMap", v["configMap"]["name"]) in names_here, (o, v)
        if "secret" in v:
            assert v["secret"]["defaultMode"] in (0o400, 0o440), (o, v)
    cred = vols["secrets"]["secret"]["secretName"]
    t = vols["tls"]["secret"]["secretName"]
    assert o in cred and o in t, (o, cred, t)
    assert t not in tls.values() and cred not in creds.values(), (o, t, cred)
    tls[o], creds[o] = t, cred
    generated = [d for d in kinds.get("Secret", []) if d["metadata"]["name"] == cred]
    for e in c["env"]:
        if e["name"].endswith("_FILE"):
            d, f = e["value"].rsplit("/", 1)
            assert "secret" in mounts[d], (o, e)
            if generated and mounts[d]["secret"]["secretName"] == cred:
                assert f in generated[0]["data"], (o, f, "no such key in the generated Secret")
    for kind in ("PodMonitor", "PrometheusRule"):
        assert len(kinds.get(kind, [])) == 1, (o, kind, "the monitoring component is not included")
        assert kinds[kind][0]["metadata"]["labels"].get("release") == "kube-prometheus-stack", (o, kind)
    assert kinds["PodMonitor"][0]["spec"]["selector"]["matchLabels"] == stable, (o, "the PodMonitor would scrape other instances")
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
run "kustomize: the base renders no Secret; every overlay renders with distinct names, selectors (name + instance), slots, credentials and TLS Secrets, the recommended labels, spread over nodes and zones, no service account token, credentials as 0400/0440 files, monitoring with the release label" overlays

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
