#!/bin/sh
# Prints the environment that runs internal/testbed on containers, one
# VAR=value a line (for `env $(deploy/images/testbed-env.sh) go test ...`):
# the engine (engine.sh) and OVERSOLD_TESTBED=containers, plus the stand-in
# images (built by build.sh) when the official ones cannot be pulled, or
# when OVERSOLD_STANDIN=1 asks for them.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
host=$("$here/engine.sh")
export DOCKER_HOST=$host
echo "DOCKER_HOST=$host"
echo "OVERSOLD_TESTBED=containers"

official="mysql:8.4 redis:7 zookeeper:3.9 quay.io/coreos/etcd:v3.5.21"
pulled() {
	for image in $official; do
		docker image inspect "$image" >/dev/null 2>&1 || timeout 300 docker pull -q "$image" >/dev/null 2>&1 || return 1
	done
}
if [ "${OVERSOLD_STANDIN:-}" != 1 ] && pulled; then
	exit 0
fi
echo "testbed-env: official images unavailable (or OVERSOLD_STANDIN=1): stand-ins from Debian packages" >&2
"$here/build.sh" >&2
for kind in MYSQL REDIS ZOOKEEPER ETCD; do
	echo "OVERSOLD_IMAGE_$kind=oversold-local/$(echo "$kind" | tr 'A-Z' 'a-z'):latest"
done
