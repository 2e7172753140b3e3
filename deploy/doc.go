// Package deploy holds no Go code, only the deployment files (Dockerfile,
// nginx, Prometheus, Grafana, Kubernetes) and the tests that check them
// against each other and against docs/design.md without a Docker engine or a
// cluster. See README.md in this directory.
package deploy
