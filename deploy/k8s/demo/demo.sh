#!/bin/sh
# make k8s-demo: orderd on a real single-node Kubernetes, offline, through a
# rollout, a refused rollout and a pod evicted under load (deploy/k8s/README.md,
# "The demo on a real cluster"). Steps:
#
#   1. build-kube.sh: Kubernetes and CoreDNS from the module proxy (once; cached)
#   2. images.sh: the servers' stand-ins and orderd (deploy/Dockerfile)
#   3. cluster.sh up: the control plane, kubelet and containerd as processes
#      in a network namespace; the images imported into containerd
#   4. the servers of the demo overlay, then deploy/k8s through the overlay
#   5. four lab runs through the orderd Service (lab --target), each checked:
#      plain; under `kubectl rollout restart`; under a rollout to another lock
#      (refused, stalled, undone); with a pod evicted mid-load
#   6. the report in $OVERSOLD_K8S_REPORT (k8s-report/), then cluster.sh down,
#      whatever happened, and a check that nothing of the cluster is left.
#
# Exits 0 when every step and check passed, 1 otherwise (the first failure
# is named on stderr and in summary.txt).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
cd "$here/../../.."
REPORT=${OVERSOLD_K8S_REPORT:-k8s-report}
CACHE=${OVERSOLD_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/oversold/k8s}
APP=app.kubernetes.io/component=orderd
LOCK=redis GUARD=version # the product ConfigMap's, which the overlay keeps
OTHER_LOCK=zookeeper     # step 3's rollout

[ "$(id -u)" = 0 ] || { echo "k8s-demo: needs root (network namespace, cgroups, containerd)" >&2; exit 1; }
rm -rf "$REPORT"
mkdir -p "$REPORT/runs"
summary=$REPORT/summary.txt
: >"$summary"
say() { echo "k8s-demo: $*" >&2; echo "$*" >>"$summary"; }
fail() { say "FAILED: $*"; exit 1; }
began=$(date +%s)
stamp() { echo "$(($(date +%s) - began))s"; }

BIN= # build-kube.sh's folder, once built
work=$(mktemp -d /tmp/oversold-k8s-demo.XXXXXX)
k() { in_ns "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" -n oversold-demo "$@"; }

teardown() {
	rc=$?
	trap - EXIT INT TERM
	set +e
	jobs -p | xargs -r kill 2>/dev/null
	if [ $rc != 0 ] && [ -d "$STATE/logs" ]; then
		# What a failure needs to be understood.
		mkdir -p "$REPORT/cluster"
		cp -r "$STATE/logs/." "$REPORT/cluster/"
		k get pods -A -o wide >"$REPORT/cluster/pods-all.txt" 2>&1
		k describe pods >"$REPORT/cluster/describe-pods.txt" 2>&1
		k get events --sort-by=.lastTimestamp >"$REPORT/cluster/events.txt" 2>&1
	fi
	t0=$(date +%s)
	"$here/cluster.sh" down
	if left=$("$here/cluster.sh" leftovers); then
		say "teardown: $(($(date +%s) - t0))s; nothing of the cluster left (processes, mounts, cgroups, network namespaces, sysctls)"
	else
		say "FAILED: teardown: $left"
		rc=1
	fi
	for s in $KUBELET_SYSCTLS; do
		now=$(sysctl -n "$s")
		before=$(sed -n "s/^$s=//p" "$work/sysctl.before" 2>/dev/null)
		[ -z "$before" ] || [ "$now" = "$before" ] || { say "FAILED: sysctl $s is $now, was $before"; rc=1; }
	done
	rm -rf "$work"
	say "total: $(stamp), exit $rc"
	exit $rc
}
trap teardown EXIT
trap 'exit 1' INT TERM
for s in $KUBELET_SYSCTLS; do echo "$s=$(sysctl -n "$s")"; done >"$work/sysctl.before"

# 1-2: binaries and images.
t=$(date +%s)
BIN=$("$here/build-kube.sh")
say "kubernetes $KUBE_VERSION binaries: $(($(date +%s) - t))s ($BIN)"
t=$(date +%s)
# The flags of images.sh (deploy/Dockerfile's): one build in the Go cache.
CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$work/lab" ./cmd/lab
PAUSE_IMAGE=$PAUSE_IMAGE COREDNS_IMAGE=$COREDNS_IMAGE "$here/images.sh" "$CACHE/images.tar" "$BIN"
say "images: $(($(date +%s) - t))s"

# 3: the cluster.
t=$(date +%s)
"$here/cluster.sh" up "$BIN"
say "cluster up, node Ready: $(($(date +%s) - t))s"
t=$(date +%s)
"$here/cluster.sh" load "$CACHE/images.tar"
say "images imported into containerd: $(($(date +%s) - t))s"
in_ns "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" -n kube-system rollout status deployment/coredns --timeout=180s >/dev/null ||
	fail "CoreDNS did not become ready"

# 4: servers first (orderd exits 2 when one does not answer at start), then all.
t=$(date +%s)
in_ns "$BIN/kubectl" kustomize --load-restrictor=LoadRestrictionsNone deploy/k8s/demo >"$work/demo.yaml"
in_ns "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" apply -l oversold.demo/server=true -f "$work/demo.yaml" >/dev/null
for d in mysql redis zookeeper etcd; do
	k rollout status deployment/$d --timeout=300s >/dev/null || fail "server $d did not become ready"
done
say "servers ready (mysql, redis, zookeeper, etcd): $(($(date +%s) - t))s"
t=$(date +%s)
in_ns "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" apply -f "$work/demo.yaml" >"$REPORT/apply.txt"
k rollout status deployment/orderd --timeout=180s >/dev/null || fail "orderd did not roll out"
say "orderd rolled out, 3 replicas ready: $(($(date +%s) - t))s"
k get pods -o wide >"$REPORT/pods-start.txt"

ORDERD_IP=$(k get service orderd -o jsonpath='{.spec.clusterIP}')
ORDERD=http://$ORDERD_IP:80
# Ready pods are not yet a Service that answers: kube-proxy programs the
# endpoints a moment later (until then the ClusterIP refuses). Wait until
# it answers /readyz 200, without curl (bash's /dev/tcp, in the netns).
t=$(date +%s)
until in_ns timeout 2 bash -c "exec 3<>/dev/tcp/$ORDERD_IP/80 && printf 'GET /readyz HTTP/1.0\r\n\r\n' >&3 && head -1 <&3" 2>/dev/null | grep -q ' 200 '; do
	[ $(($(date +%s) - t)) -lt 60 ] || fail "the orderd Service did not answer /readyz within 60s"
	sleep 1
done
say "the orderd Service answers: $(($(date +%s) - t))s"
MYSQL_DSN="oversold:oversold@tcp($(k get service mysql -o jsonpath='{.spec.clusterIP}'):3306)/oversold?parseTime=true"

# lab_start NAME ARGS...: the lab through the Service, in the background ($lab),
# with `kubectl get pods -o wide` every 3 s into pods.txt meanwhile ($sampler).
lab_start() {
	name=$1
	shift
	in_ns env OVERSOLD_ADMIN_TOKEN=oversold-demo-token "$work/lab" --target "$ORDERD" \
		--servers "mysql=$MYSQL_DSN" --backends $LOCK --guards $GUARD --replicas 3 \
		--out "$REPORT/runs/$name" "$@" >"$REPORT/runs/$name.log" 2>&1 &
	lab=$!
	(while :; do
		{ echo "== $name, $(date -u +%T)"; k get pods -o wide -l $APP; echo; } >>"$REPORT/pods.txt" 2>&1
		sleep 3
	done) &
	sampler=$!
}
running() { kill -0 "$lab" 2>/dev/null; }
# lab_wait NAME STRICT: waits, then checks the run's invariants: it ran, is
# safe (oversold 0, every 201 in MySQL, no lost update), all stock sold;
# STRICT also wants no answer but 201 and 409 out_of_stock and none missing.
lab_wait() {
	wait "$lab" || { kill "$sampler"; fail "run $1: the lab failed (runs/$1.log)"; }
	kill "$sampler"
	jq -r '.[] | "run '"$1"': \(.requests) orders, status \(.status), no answer \(.no_response), sold \(.ordered_quantity) of \(.initial_stock), oversold \(.oversold), lost acks \(.lost_acks), lost updates \(.lost_updates), \(.orders_rps) orders/s"' \
		"$REPORT/runs/$1/results.json" | while read -r l; do say "$l"; done
	jq -e --argjson strict "$2" 'length == 1 and (.[0] |
		.safe and (.error // "") == "" and .oversold == 0 and .lost_acks == 0 and .lost_updates == 0
		and .duplicates == 0 and .ordered_quantity == .initial_stock
		and (($strict | not) or (.no_response == 0 and ((.status | keys) - ["201", "409"] | length) == 0)))' \
		"$REPORT/runs/$1/results.json" >/dev/null || fail "run $1: an invariant did not hold (runs/$1/results.json)"
}
# A long run for the rollouts: 40 orders/s for about DURATION seconds, the
# stock a little under the orders, so it sells out near the end.
long() { echo "--rate 40 --requests $(($1 * 40)) --stock $(($1 * 36))"; }
ready_replicas() { k get deployment orderd -o jsonpath='{.status.readyReplicas}'; }

# Run 1: the lab through the Service.
lab_start 1-service
lab_wait 1-service true

# Run 2: a rolling update with the same settings under load.
# shellcheck disable=SC2046 # long's words
lab_start 2-rollout-same $(long 70)
sleep 8
t=$(date +%s)
k rollout restart deployment/orderd >/dev/null
k rollout status deployment/orderd --timeout=180s >"$REPORT/rollout-same.txt" 2>&1 || fail "run 2: the rollout did not complete"
running || fail "run 2: the load ended before the rollout did; nothing was shown"
say "run 2: rollout restart completed under load in $(($(date +%s) - t))s"
lab_wait 2-rollout-same true

# Run 3: a rolling update to another lock under load: the newcomer is refused.
# shellcheck disable=SC2046
lab_start 3-rollout-other-lock $(long 75)
sleep 5
t=$(date +%s)
k set env deployment/orderd OVERSOLD_LOCK=$OTHER_LOCK >/dev/null
refused=
for _ in $(seq 60); do
	refused=$(k get pods -l $APP -o jsonpath='{range .items[*]}{.metadata.name} {.status.containerStatuses[0].lastState.terminated.exitCode}{"\n"}{end}' | awk '$2 == 2 { print $1; exit }')
	[ -z "$refused" ] || break
	sleep 1
done
[ -n "$refused" ] || fail "run 3: no new pod exited with status 2"
# Its log files on the node (every start of it; `kubectl logs --previous`
# may find the last one already replaced).
sleep 1
cat "$STATE"/pod-logs/oversold-demo_"$refused"_*/orderd/*.log >"$REPORT/refused-pod.log" 2>&1 || :
grep -q 'run other settings' "$REPORT/refused-pod.log" || fail "run 3: the new pod exited 2, but not for other settings (refused-pod.log)"
say "run 3: new pod $refused (lock=$OTHER_LOCK) exited 2 after $(($(date +%s) - t))s: $(grep -o 'replicas of one database run other settings.*' "$REPORT/refused-pod.log" | head -1 | cut -c1-160)"
if k rollout status deployment/orderd --timeout=120s >"$REPORT/rollout-other-lock.txt" 2>&1; then
	fail "run 3: the rollout to another lock completed"
fi
grep -q 'exceeded its progress deadline' "$REPORT/rollout-other-lock.txt" || fail "run 3: the rollout did not report its stall (rollout-other-lock.txt)"
running || fail "run 3: the load ended before the stall was reported"
status=$(k get deployment orderd -o jsonpath='ready {.status.readyReplicas}, available {.status.availableReplicas}, updated {.status.updatedReplicas}, unavailable {.status.unavailableReplicas}')
state=$(k get pod "$refused" -o jsonpath='{.status.containerStatuses[0].state.waiting.reason}{.status.containerStatuses[0].state.terminated.reason} restarts {.status.containerStatuses[0].restartCount}')
k get pods -o wide -l $APP >"$REPORT/pods-stalled.txt"
[ "$(ready_replicas)" = 3 ] || fail "run 3: the old replicas are not all ready during the stall ($status)"
say "run 3: rollout stalled after $(($(date +%s) - t))s ($(tail -1 "$REPORT/rollout-other-lock.txt")); deployment: $status; new pod: $state"
k rollout undo deployment/orderd >/dev/null
k rollout status deployment/orderd --timeout=120s >/dev/null || fail "run 3: rollout undo did not complete"
say "run 3: rolled back (kubectl rollout undo) after $(($(date +%s) - t))s"
lab_wait 3-rollout-other-lock true

# Run 4: a pod evicted mid-load (the Eviction API: a delete that asks the
# PodDisruptionBudget), and a second eviction at once, which the budget refuses.
evict() {
	printf '{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "%s", "namespace": "oversold-demo"}}\n' "$1" >"$work/eviction.json"
	k create --raw "/api/v1/namespaces/oversold-demo/pods/$1/eviction" -f "$work/eviction.json"
}
# shellcheck disable=SC2046
lab_start 4-pod-evicted $(long 50)
sleep 8
# shellcheck disable=SC2046 # names
set -- $(k get pods -l $APP -o json | jq -r '.items[] | select(.metadata.deletionTimestamp == null and .status.phase == "Running") | .metadata.name')
[ $# = 3 ] || fail "run 4: want 3 running orderd pods, have $*"
t=$(date +%s)
evict "$1" >/dev/null 2>"$work/evict1.txt" || fail "run 4: eviction of $1 refused: $(cat "$work/evict1.txt")"
if evict "$2" >/dev/null 2>"$work/evict2.txt"; then
	fail "run 4: a second eviction was allowed while $1 was going"
fi
grep -q 'disruption budget' "$work/evict2.txt" || fail "run 4: second eviction failed otherwise: $(cat "$work/evict2.txt")"
say "run 4: evicted $1 under load; evicting $2 at once was refused: $(cat "$work/evict2.txt")"
k wait --for=delete "pod/$1" --timeout=90s >/dev/null || fail "run 4: $1 did not go"
for _ in $(seq 90); do
	[ "$(ready_replicas)" = 3 ] && break
	sleep 1
done
[ "$(ready_replicas)" = 3 ] || fail "run 4: no replacement became ready"
say "run 4: $1 gone and a replacement ready $(($(date +%s) - t))s after the eviction$(running && echo ', load still running')"
lab_wait 4-pod-evicted false

# The report: the lab's (one results.json for the four runs), the rollouts'
# events and history, what the HPA and the PDB said.
in_ns "$work/lab" --merge "$REPORT/runs/1-service,$REPORT/runs/2-rollout-same,$REPORT/runs/3-rollout-other-lock,$REPORT/runs/4-pod-evicted" \
	--out "$REPORT" >/dev/null 2>"$work/merge.log" || { cat "$work/merge.log" >&2; fail "lab --merge"; }
k get events --sort-by=.lastTimestamp >"$REPORT/events.txt"
{
	k rollout history deployment/orderd
	k describe deployment orderd
	k get replicasets -o wide -l $APP
} >"$REPORT/rollout.txt" 2>&1
k get pods -o wide >"$REPORT/pods-end.txt"
k describe hpa orderd >"$REPORT/hpa.txt" 2>&1
k describe pdb orderd >"$REPORT/pdb.txt" 2>&1
say "hpa: $(k get hpa orderd -o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}) {end}')"
in_ns "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" version >"$REPORT/version.txt" 2>&1
say "all runs passed"
