# syntax=docker/dockerfile:1
# Static nodecache binary on a distroless base, non-root by default.
# The agent (hostNetwork DaemonSet) needs root to read /proc and the runtime's files on the
# host: its manifest sets runAsUser: 0 explicitly (examples/kubernetes/daemonset.yaml).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath \
      -tags containers_image_openpgp,exclude_graphdriver_btrfs \
      -ldflags "-s -w -X github.com/nodecache/nodecache/internal/buildinfo.version=${VERSION}" \
      -o /out/nodecache ./cmd/nodecache \
 && mkdir -p /out/var/lib/nodecache

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/nodecache /usr/local/bin/nodecache
COPY --from=build --chown=65532:65532 /out/var/lib/nodecache /var/lib/nodecache
USER 65532:65532
EXPOSE 5000
VOLUME ["/var/lib/nodecache"]
ENTRYPOINT ["/usr/local/bin/nodecache"]
CMD ["serve"]
