// Package test checks what nodecache ships besides the binary: the Helm chart, the kustomize
// examples, the dashboard and alerts, the Dockerfile, the release build, the systemd unit and the
// documentation (README.md and docs/: the text the chart and example tests read, every link).
// It is its own module so that the product's go.mod stays free of Helm, Kubernetes, kustomize,
// Prometheus and BuildKit; run it with `make test-deploy`.
package test
