#!/bin/sh
# A single-node Kubernetes as processes, offline:
#
#   cluster.sh up BIN      # BIN: build-kube.sh's folder; then images with load
#   cluster.sh load FILE   # a `docker save` archive into containerd (k8s.io)
#   cluster.sh down        # everything gone: processes, mounts, cgroups, netns, sysctls
#
# etcd (Debian's), kube-apiserver, kube-controller-manager, kube-scheduler,
# kubelet, kube-proxy (iptables) and containerd (Debian's, pods on a bridge
# from Debian's CNI plugins) run inside the network namespace $NS, whose only
# links are lo and a veth pair with both ends inside, one carrying the
# node's address (this kernel has no dummy links): nothing listens on
# the host's network, and the iptables rules of kube-proxy and the CNI
# plugins live and die with the namespace. Every process, the pods' included,
# is in the cgroup $CGROUP, so `down` can find them all.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"

log() { echo "cluster: $*" >&2; }
die() { log "$*"; exit 1; }

hierarchies() {
	for d in /sys/fs/cgroup/*/; do
		[ -f "$d/cgroup.procs" ] && echo "${d%/}"
	done
}

# spawn NAME CMD...: CMD in the namespace and the cgroup, log in $STATE/logs.
spawn() {
	name=$1
	shift
	# shellcheck disable=SC2016 # $$ is the child's
	sh -c 'for h in "$0"/*/'"$CGROUP"'/daemons; do echo $$ >"$h/cgroup.procs"; done; exec "$@"' \
		/sys/fs/cgroup nsenter --net=/run/netns/$NS -- "$@" >"$STATE/logs/$name.log" 2>&1 &
	echo $! >"$STATE/pids/$name"
}

# wait_for WHAT SECONDS CMD...: until CMD succeeds.
wait_for() {
	what=$1 secs=$2
	shift 2
	i=0
	until "$@" >/dev/null 2>&1; do
		i=$((i + 1))
		[ $i -le $((secs * 2)) ] || die "$what not up after ${secs}s (logs in $STATE/logs)"
		sleep 0.5
	done
}

up() {
	bin=$1
	[ ! -e /run/netns/$NS ] || die "a demo cluster exists already (cluster.sh down removes it)"
	for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubeadm kubectl; do
		[ -x "$bin/$b" ] || die "$bin/$b missing: run build-kube.sh"
	done
	for c in containerd containerd-shim-runc-v2 runc etcd nsenter iptables conntrack; do
		command -v $c >/dev/null || die "$c missing (make deps)"
	done
	[ -x /usr/lib/cni/bridge ] || die "/usr/lib/cni/bridge missing: apt-get install containernetworking-plugins (make deps)"
	mkdir -p "$STATE/logs" "$STATE/pids" "$STATE/kube" "$STATE/cni" "$RUNDIR"
	# What down restores and compares against.
	ls /run/netns >"$STATE/netns.before" 2>/dev/null || : >"$STATE/netns.before"
	for p in $HOST_PATHS; do [ -e "$p" ] || echo "$p"; done >"$STATE/paths.created"
	ls $SHIM_SOCKETS >"$STATE/shims.before" 2>/dev/null || : >"$STATE/shims.before"
	for s in $KUBELET_SYSCTLS; do echo "$s=$(sysctl -n $s)"; done >"$STATE/sysctl.before"

	for h in $(hierarchies); do
		mkdir -p "$h/$CGROUP/daemons"
		# cpuset: a new cgroup starts with no CPUs and memory nodes.
		if [ -f "$h/cpuset.cpus" ]; then
			for g in "$h/$CGROUP" "$h/$CGROUP/daemons"; do
				cat "$h/cpuset.cpus" >"$g/cpuset.cpus"
				cat "$h/cpuset.mems" >"$g/cpuset.mems"
			done
		fi
	done

	ip netns add $NS
	in_ns ip link set lo up
	in_ns ip link add k8snode0 type veth peer name k8snode1
	in_ns ip link set k8snode1 up
	in_ns ip addr add $NODE_IP/24 dev k8snode0
	in_ns ip link set k8snode0 up
	in_ns ip route add default dev k8snode0
	in_ns sysctl -qw net.ipv4.ip_forward=1
	[ ! -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || in_ns sysctl -qw net.bridge.bridge-nf-call-iptables=1

	# Certificates and kubeconfigs, offline (kubeadm's phases, no preflight).
	cat >"$STATE/kubeadm.yaml" <<-YAML
	apiVersion: kubeadm.k8s.io/v1beta4
	kind: InitConfiguration
	localAPIEndpoint: {advertiseAddress: $NODE_IP, bindPort: 6443}
	nodeRegistration: {name: $NODE, criSocket: unix://$RUNDIR/containerd.sock}
	---
	apiVersion: kubeadm.k8s.io/v1beta4
	kind: ClusterConfiguration
	kubernetesVersion: $KUBE_VERSION
	clusterName: oversold-demo
	certificatesDir: $STATE/pki
	controlPlaneEndpoint: $NODE_IP:6443
	networking: {serviceSubnet: $SERVICE_CIDR, podSubnet: $POD_CIDR, dnsDomain: cluster.local}
	YAML
	"$bin/kubeadm" init phase certs all --config "$STATE/kubeadm.yaml" >"$STATE/logs/kubeadm.log" 2>&1
	"$bin/kubeadm" init phase kubeconfig all --config "$STATE/kubeadm.yaml" --kubeconfig-dir "$STATE/kube" >>"$STATE/logs/kubeadm.log" 2>&1
	pki=$STATE/pki kube=$STATE/kube

	spawn etcd etcd --name oversold-k8s --data-dir "$STATE/etcd" \
		--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
		--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
		--initial-cluster oversold-k8s=http://127.0.0.1:2380 --logger zap --log-level warn

	cat >"$STATE/containerd.toml" <<-TOML
	version = 2
	root = "$STATE/containerd"
	state = "$RUNDIR/containerd"
	oom_score = 0
	[grpc]
	  address = "$RUNDIR/containerd.sock"
	[plugins."io.containerd.internal.v1.opt"]
	  path = "$STATE/opt"
	[plugins."io.containerd.grpc.v1.cri"]
	  sandbox_image = "$PAUSE_IMAGE"
	  # runc cannot write a negative oom_score_adj here (no CAP_SYS_RESOURCE
	  # in the bounding set): keep every container at or above containerd's.
	  restrict_oom_score_adj = true
	  [plugins."io.containerd.grpc.v1.cri".containerd]
	    snapshotter = "overlayfs"
	    default_runtime_name = "runc"
	    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
	      runtime_type = "io.containerd.runc.v2"
	      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
	        SystemdCgroup = false
	        Root = "$RUNDIR/runc"
	  [plugins."io.containerd.grpc.v1.cri".cni]
	    bin_dir = "/usr/lib/cni"
	    conf_dir = "$STATE/cni"
	TOML
	cat >"$STATE/cni/10-oversold.conflist" <<-JSON
	{"cniVersion": "1.0.0", "name": "oversold", "plugins": [
	  {"type": "bridge", "bridge": "k8sbr0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
	   "ipam": {"type": "host-local", "dataDir": "$STATE/cni-ipam",
	            "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}}
	]}
	JSON
	spawn containerd containerd --config "$STATE/containerd.toml"

	spawn kube-apiserver "$bin/kube-apiserver" \
		--advertise-address=$NODE_IP --bind-address=0.0.0.0 --secure-port=6443 \
		--etcd-servers=http://127.0.0.1:2379 \
		--service-cluster-ip-range=$SERVICE_CIDR \
		--client-ca-file="$pki/ca.crt" \
		--tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
		--kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
		--kubelet-client-key="$pki/apiserver-kubelet-client.key" \
		--kubelet-preferred-address-types=InternalIP \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
		--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
		--requestheader-client-ca-file="$pki/front-proxy-ca.crt" \
		--proxy-client-cert-file="$pki/front-proxy-client.crt" --proxy-client-key-file="$pki/front-proxy-client.key" \
		--requestheader-allowed-names=front-proxy-client --requestheader-extra-headers-prefix=X-Remote-Extra- \
		--requestheader-group-headers=X-Remote-Group --requestheader-username-headers=X-Remote-User
	wait_for kube-apiserver 60 in_ns "$bin/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" get --raw /readyz
	# What kubeadm init would do: admin.conf's group and the apiserver's
	# kubelet client (kubectl logs, exec) are cluster admins.
	in_ns "$bin/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" create clusterrolebinding kubeadm:cluster-admins \
		--clusterrole=cluster-admin --group=kubeadm:cluster-admins >/dev/null

	spawn kube-controller-manager "$bin/kube-controller-manager" \
		--kubeconfig="$kube/controller-manager.conf" \
		--authentication-kubeconfig="$kube/controller-manager.conf" \
		--authorization-kubeconfig="$kube/controller-manager.conf" \
		--bind-address=127.0.0.1 --leader-elect=false \
		--cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
		--root-ca-file="$pki/ca.crt" --service-account-private-key-file="$pki/sa.key" \
		--use-service-account-credentials=true --service-cluster-ip-range=$SERVICE_CIDR
	spawn kube-scheduler "$bin/kube-scheduler" \
		--kubeconfig="$kube/scheduler.conf" \
		--authentication-kubeconfig="$kube/scheduler.conf" \
		--authorization-kubeconfig="$kube/scheduler.conf" \
		--bind-address=127.0.0.1 --leader-elect=false

	cat >"$STATE/kubelet.yaml" <<-YAML
	apiVersion: kubelet.config.k8s.io/v1beta1
	kind: KubeletConfiguration
	authentication:
	  anonymous: {enabled: false}
	  webhook: {enabled: true}
	  x509: {clientCAFile: $pki/ca.crt}
	authorization: {mode: Webhook}
	containerRuntimeEndpoint: unix://$RUNDIR/containerd.sock
	cgroupDriver: cgroupfs
	cgroupRoot: /$CGROUP
	# This machine has cgroup v1 only.
	failCgroupV1: false
	failSwapOn: false
	clusterDNS: [$CLUSTER_DNS]
	clusterDomain: cluster.local
	resolvConf: $STATE/resolv.conf
	podLogsDir: $STATE/pod-logs
	healthzBindAddress: 127.0.0.1
	# A shared build machine: evict only when it is really full.
	evictionHard: {memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%}
	imageGCHighThresholdPercent: 99
	imageGCLowThresholdPercent: 98
	YAML
	# CoreDNS forwards outside names here: the node's address, where nothing
	# answers on port 53 (offline). Not a loopback address: in CoreDNS's pod
	# that would be CoreDNS itself, a loop it refuses to start with.
	echo "nameserver $NODE_IP" >"$STATE/resolv.conf"
	spawn kubelet "$bin/kubelet" --config="$STATE/kubelet.yaml" \
		--kubeconfig="$kube/kubelet.conf" --root-dir="$STATE/kubelet" --cert-dir="$STATE/kubelet/pki" \
		--node-ip=$NODE_IP --hostname-override=$NODE

	cat >"$STATE/kube-proxy.yaml" <<-YAML
	apiVersion: kubeproxy.config.k8s.io/v1alpha1
	kind: KubeProxyConfiguration
	mode: iptables
	clientConnection: {kubeconfig: $KUBECONFIG_ADMIN}
	hostnameOverride: $NODE
	clusterCIDR: $POD_CIDR
	# Service traffic from a pod to a pod on the same bridge is masqueraded,
	# so replies come back through the namespace's NAT.
	iptables: {masqueradeAll: true}
	# Leave the host's conntrack table size and timeouts alone.
	conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
	healthzBindAddress: 127.0.0.1:10256
	metricsBindAddress: 127.0.0.1:10249
	YAML
	spawn kube-proxy "$bin/kube-proxy" --config="$STATE/kube-proxy.yaml"

	wait_for "node $NODE Ready" 90 in_ns "$bin/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" \
		wait --for=condition=Ready node/$NODE --timeout=1s
	in_ns "$bin/kubeadm" init phase addon coredns --config "$STATE/kubeadm.yaml" \
		--kubeconfig "$KUBECONFIG_ADMIN" >>"$STATE/logs/kubeadm.log" 2>&1
	log "node $NODE Ready ($KUBE_VERSION)"
}

load() {
	ctr --address "$RUNDIR/containerd.sock" -n k8s.io images import --no-unpack "$1" >/dev/null
}

down() {
	# The control plane first (no new pods), then every process left in the
	# cgroup: daemons, containerd's shims, the pods' processes.
	for name in kubelet kube-proxy kube-scheduler kube-controller-manager kube-apiserver; do
		[ -f "$STATE/pids/$name" ] && kill "$(cat "$STATE/pids/$name")" 2>/dev/null || :
	done
	pidsroot=/sys/fs/cgroup/pids/$CGROUP
	[ -d "$pidsroot" ] || pidsroot=$(hierarchies | head -1)/$CGROUP
	i=0
	while [ -d "$pidsroot" ]; do
		pids=$(find "$pidsroot" -name cgroup.procs -exec cat {} + 2>/dev/null)
		[ -n "$pids" ] || break
		# shellcheck disable=SC2086 # a list of pids
		kill -9 $pids 2>/dev/null || :
		i=$((i + 1))
		[ $i -lt 100 ] || { log "processes left in $pidsroot: $pids"; break; }
		sleep 0.2
	done
	# Mounts of containerd (rootfs, shm) and the kubelet (volumes), deepest first.
	for m in $(awk -v s="$STATE/" -v r="$RUNDIR/" 'index($5, s) == 1 || index($5, r) == 1 { print $5 }' /proc/self/mountinfo | sort -r); do
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || :
	done
	# The pods' network namespaces (containerd's cni-*), then the cluster's.
	if [ -f "$STATE/netns.before" ]; then
		for n in $(ls /run/netns 2>/dev/null); do
			case $n in cni-*) grep -qx "$n" "$STATE/netns.before" || ip netns delete "$n" 2>/dev/null || : ;; esac
		done
	fi
	[ ! -e /run/netns/$NS ] || ip netns delete $NS
	# Paths the kubelet and containerd use whatever they are told; the
	# ones that were not there before go.
	if [ -f "$STATE/paths.created" ]; then
		while read -r p; do rm -rf "$p"; done <"$STATE/paths.created"
	fi
	[ ! -d /var/log/containers ] || find /var/log/containers -lname "$STATE/*" -delete
	if [ -f "$STATE/shims.before" ]; then
		for f in $(ls $SHIM_SOCKETS 2>/dev/null); do
			grep -qx "$f" "$STATE/shims.before" || rm -f "$SHIM_SOCKETS/$f"
		done
		rmdir $SHIM_SOCKETS "$(dirname $SHIM_SOCKETS)" 2>/dev/null || :
	fi
	for h in $(hierarchies); do
		[ -d "$h/$CGROUP" ] && find "$h/$CGROUP" -depth -type d -exec rmdir {} \; 2>/dev/null || :
	done
	if [ -f "$STATE/sysctl.before" ]; then
		while IFS== read -r k v; do sysctl -qw "$k=$v" || :; done <"$STATE/sysctl.before"
	fi
	rm -rf "$STATE" "$RUNDIR"
}

# leftovers: prints whatever of the cluster is still on the host; exits 1 if any.
leftovers() {
	left=
	[ ! -e /run/netns/$NS ] || left="$left netns:$NS"
	for h in $(hierarchies); do [ ! -d "$h/$CGROUP" ] || left="$left cgroup:$h/$CGROUP"; done
	m=$(awk -v s="$STATE" -v r="$RUNDIR" 'index($5, s) == 1 || index($5, r) == 1 { print $5 }' /proc/self/mountinfo)
	[ -z "$m" ] || left="$left mounts:$m"
	[ ! -e "$STATE" ] || left="$left dir:$STATE"
	[ ! -e "$RUNDIR" ] || left="$left dir:$RUNDIR"
	[ ! -d /var/log/containers ] || [ -z "$(find /var/log/containers -lname "$STATE/*")" ] || left="$left /var/log/containers links"
	[ -z "$(pgrep -f "$RUNDIR/containerd.sock")" ] || left="$left processes of $RUNDIR/containerd.sock"
	[ -z "$left" ] || { echo "left behind:$left"; return 1; }
}

case ${1:-} in
up) up "$2" ;;
load) load "$2" ;;
down) down ;;
leftovers) leftovers ;;
*) echo "usage: cluster.sh up BIN | load FILE | down | leftovers" >&2; exit 2 ;;
esac
