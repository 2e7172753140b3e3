#!/bin/sh
# Builds every image the demo cluster runs and writes them, as one
# `docker save` archive, to the path given ($1), ready for
# `ctr -n k8s.io images import`. Built on the project's Docker engine
# (deploy/images/engine.sh), offline:
#   - oversold-local/{mysql,redis,zookeeper,etcd}:latest, the stand-ins of
#     deploy/images/build.sh (Debian 12 packages);
#   - oversold-local/oversold:demo, orderd from deploy/Dockerfile (its
#     runtime stage on the stand-in base make compose-demo uses);
#   - registry.k8s.io/pause and registry.k8s.io/coredns/coredns, each the
#     static binary build-kube.sh made, imported as a one-file image.
# $2 is build-kube.sh's bin folder.
set -eu
out=$1
bin=$2
cd "$(dirname "$0")/../../.."
images=deploy/images
DOCKER_HOST=$("$images/engine.sh")
export DOCKER_HOST

"$images/build.sh"
# quiet ARGS...: docker ARGS, its output (the legacy builder's deprecation
# notice included) only when it fails.
quiet() {
	log=$(docker "$@" 2>&1) || { echo "$log" >&2; return 1; }
}
echo "images: oversold-local/runtime:latest"
quiet build -q -t oversold-local/runtime:latest "$images/compose/runtime"
echo "images: oversold-local/oversold:demo (deploy/Dockerfile)"
# deploy/Dockerfile's runtime stage as it is; its build stage, the same
# `go build`, runs here: Debian's docker CLI has no buildx, the legacy
# builder refuses the file's cache mounts, and without them every change
# would compile everything again inside the image. Here the Go build cache
# is kept between runs.
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir "$ctx/out"
CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$ctx/out/" ./cmd/orderd ./cmd/lab
awk '
	/^FROM .* AS build$/ { print "FROM scratch AS build"; print "COPY out/ /out/"; skip = 1; next }
	skip && /^FROM / { skip = 0 }
	!skip' deploy/Dockerfile >"$ctx/Dockerfile"
quiet build -q --build-arg RUNTIME_IMAGE=oversold-local/runtime:latest \
	-t oversold-local/oversold:demo "$ctx"

# The tags the kubelet's containerd (sandbox_image) and kubeadm's CoreDNS
# Deployment name.
echo "images: $PAUSE_IMAGE, $COREDNS_IMAGE"
tar -c -C "$bin" pause | docker import --change 'ENTRYPOINT ["/pause"]' - "$PAUSE_IMAGE" >/dev/null
tar -c -C "$bin" coredns | docker import --change 'ENTRYPOINT ["/coredns"]' - "$COREDNS_IMAGE" >/dev/null

echo "images: saving to $out"
docker save -o "$out.tmp" oversold-local/mysql:latest oversold-local/redis:latest \
	oversold-local/zookeeper:latest oversold-local/etcd:latest oversold-local/oversold:demo \
	"$PAUSE_IMAGE" "$COREDNS_IMAGE"
mv "$out.tmp" "$out"
