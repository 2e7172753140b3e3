# Sourced by cluster.sh and demo.sh: where the demo cluster lives.
# Everything of the cluster is in these places, and `cluster.sh down`
# removes them all.
KUBE_VERSION=${KUBE_VERSION:-v1.34.4}
NS=oversold-k8s                  # network namespace of the whole cluster
STATE=/var/lib/oversold-k8s      # etcd, containerd, kubelet, certificates, logs
RUNDIR=/run/oversold-k8s         # sockets and containerd's state
CGROUP=oversold-k8s              # cgroup (every v1 hierarchy) of every process
NODE=oversold-k8s                # the node's name
NODE_IP=10.245.0.2               # on a veth inside $NS
SERVICE_CIDR=10.96.0.0/16
CLUSTER_DNS=10.96.0.10
POD_CIDR=10.244.0.0/24
PAUSE_IMAGE=registry.k8s.io/pause:3.10.1
COREDNS_IMAGE=registry.k8s.io/coredns/coredns:v1.12.1
KUBECONFIG_ADMIN=$STATE/kube/super-admin.conf
# Host sysctls the kubelet sets (setupKernelTunables): recorded before, restored after.
KUBELET_SYSCTLS="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes"

# Host paths the kubelet and containerd create whatever their flags say
# (device plugins, container log links, shim sockets): removed by down when
# they were not there before up.
HOST_PATHS="/var/lib/kubelet /var/log/containers /var/log/pods /etc/kubernetes /var/lib/cni /etc/cni"
# containerd 1.6 puts its shims' sockets here, whatever its state folder.
SHIM_SOCKETS=/run/containerd/s

# in_ns CMD...: CMD in the cluster's network namespace only (not its mount
# namespace: `ip netns exec` would remount /sys without the cgroups).
in_ns() { nsenter --net=/run/netns/$NS -- "$@"; }
