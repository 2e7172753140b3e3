#!/bin/sh
# Builds the stand-in images oversold-local/{mysql,redis,zookeeper,etcd}:latest
# from Debian 12 packages, for machines where no registry answers
# (docs/design.md, "Test servers"; deploy/images/README.md).
#
#   deploy/images/build.sh            # as root, or with sudo available
#
# The Debian root filesystem (debootstrap from Debian's mirror, every server
# package in one layer) is imported once as oversold-local/debian:<key>,
# where the key hashes the package list: a second run only checks that it
# exists, and `docker build` reuses its cache for the small images on top.
set -eu

DOCKER=${DOCKER:-docker}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
PACKAGES=mariadb-server,mariadb-client,redis-server,redis-sentinel,redis-tools,zookeeper,etcd-server,etcd-client,busybox,procps,netcat-openbsd
here=$(cd "$(dirname "$0")" && pwd)

# Bump BASE_REV when the root filesystem steps below change.
BASE_REV=1
key=$(printf '%s %s %s' "$BASE_REV" "$SUITE" "$PACKAGES" | sha256sum | cut -c1-12)
base=oversold-local/debian:$key

if ! $DOCKER image inspect "$base" >/dev/null 2>&1; then
	command -v debootstrap >/dev/null || {
		echo "build.sh: debootstrap is missing: apt-get install -y debootstrap" >&2
		exit 1
	}
	root=$(mktemp -d /var/tmp/oversold-rootfs.XXXXXX)
	trap 'rm -rf "$root" "$root.log"' EXIT
	echo "images: debootstrap $SUITE with the server packages (about 3 minutes, once)"
	debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 || {
		tail -20 "$root.log" >&2
		exit 1
	}
	# Smaller layer: the package cache, docs and translations go.
	rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
		"$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
	echo "deb $MIRROR $SUITE main" >"$root/etc/apt/sources.list"
	tar -C "$root" -c . | $DOCKER import \
		--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change 'CMD ["bash"]' - "$base" >/dev/null
	$DOCKER tag "$base" oversold-local/debian:latest
fi

for image in mysql redis zookeeper etcd; do
	echo "images: oversold-local/$image:latest"
	# -q, and the legacy builder's deprecation notice only when the build fails.
	if ! out=$($DOCKER build -q --build-arg BASE="$base" -t "oversold-local/$image:latest" "$here/$image" 2>&1); then
		echo "$out" >&2
		exit 1
	fi
done
