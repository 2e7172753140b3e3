#!/bin/sh
# Builds Kubernetes, CoreDNS and the pause program from the Go module proxy
# into $OVERSOLD_K8S_CACHE (default ~/.cache/oversold/k8s), once: a later run
# finds the binaries there and returns at once. Cold, about 15-20 minutes on
# two cores, nearly all of it compiling Kubernetes; the Go build cache kept on
# the machine makes a rebuild take under a minute.
#
# k8s.io/kubernetes cannot be required as it is: its go.mod replaces every
# staging module (k8s.io/api, k8s.io/client-go, ...) with ./staging/..., which
# a dependent module cannot follow. The wrapper module made here copies its
# requirements and maps each staging module to the release published with it.
set -eu

KUBE_VERSION=${KUBE_VERSION:-v1.34.4}
COREDNS_VERSION=${COREDNS_VERSION:-v1.12.1}
CACHE=${OVERSOLD_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/oversold/k8s}
BIN=$CACHE/$KUBE_VERSION/bin
GO=${GO:-go}
KUBE_BINS="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubeadm kubectl"

have_all() {
	for b in $KUBE_BINS coredns pause; do [ -x "$BIN/$b" ] || return 1; done
}
if have_all; then echo "$BIN"; exit 0; fi
mkdir -p "$BIN"

staging=${KUBE_VERSION#v1.}           # 34.4
staging=v0.$staging                   # v0.34.4
minor=$(echo "$KUBE_VERSION" | cut -d. -f2)
mod=$CACHE/$KUBE_VERSION/module
mkdir -p "$mod"
if [ ! -f "$mod/go.sum" ]; then
	proxy=$($GO env GOPROXY | cut -d, -f1)
	# The upstream go.mod minus its module line and replace block.
	upstream=$($GO mod download -json "k8s.io/kubernetes@$KUBE_VERSION" >/dev/null 2>&1 &&
		cat "$($GO env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$KUBE_VERSION.mod") ||
		upstream=$(curl -fsS "$proxy/k8s.io/kubernetes/@v/$KUBE_VERSION.mod")
	{
		echo "module oversold.local/kube"
		echo
		echo "$upstream" | awk '
			/^module / || /^\/\// || /^godebug/ { next }
			/^replace \($/ { skip = 1; next }
			skip && /^\)$/ { skip = 0; next }
			!skip { print }'
		echo
		echo "require k8s.io/kubernetes $KUBE_VERSION"
		echo
		echo "replace ("
		echo "$upstream" | awk '/=> \.\/staging\// { print $1 }' |
			while read -r m; do echo "	$m => $m $staging"; done
		echo ")"
	} >"$mod/go.mod"
	cat >"$mod/tools.go" <<'GO'
//go:build tools

package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
	(cd "$mod" && $GO mod tidy)
fi

# kubeadm refuses binaries that do not carry their version.
ld="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ld="$ld -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done
pkgs=
for b in $KUBE_BINS; do pkgs="$pkgs k8s.io/kubernetes/cmd/$b"; done
echo "building Kubernetes $KUBE_VERSION into $BIN" >&2
(cd "$mod" && CGO_ENABLED=0 $GO build -trimpath -ldflags "$ld" -o "$BIN/" $pkgs)

if [ ! -x "$BIN/coredns" ]; then
	echo "building CoreDNS $COREDNS_VERSION" >&2
	CGO_ENABLED=0 GOBIN="$BIN" $GO install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION"
fi

# The pause container: waits for a signal, reaps nothing else.
if [ ! -x "$BIN/pause" ]; then
	p=$CACHE/pause
	mkdir -p "$p"
	cat >"$p/main.go" <<'GO'
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	<-c
}
GO
	printf 'module pause\n\ngo 1.22\n' >"$p/go.mod"
	(cd "$p" && CGO_ENABLED=0 $GO build -trimpath -ldflags "-s -w" -o "$BIN/pause" .)
fi
have_all
echo "$BIN"
