# syntax=docker/dockerfile:1
# Static nodecache binary on a distroless base, non-root by default, for any platform:
#   make image                      (docker buildx, linux/amd64 and linux/arm64)
#   docker buildx build --platform linux/arm64 --build-arg VERSION=v0.1.0 --build-arg COMMIT=$(git rev-parse HEAD) .
# The build stage runs on the builder's own platform and cross-compiles for TARGETOS/TARGETARCH
# (CGO_ENABLED=0), so no emulation is needed.
# The agent (hostNetwork DaemonSet) needs root to read /proc and the runtime's files on the
# host: its manifest sets runAsUser: 0 explicitly (examples/kubernetes/daemonset.yaml).
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
ARG COMMIT=unknown
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath \
      -tags containers_image_openpgp,exclude_graphdriver_btrfs \
      -ldflags "-s -w -X github.com/nodecache/nodecache/internal/buildinfo.version=${VERSION} -X github.com/nodecache/nodecache/internal/buildinfo.commit=${COMMIT}" \
      -o /out/usr/local/bin/nodecache ./cmd/nodecache \
 && mkdir -p /out/var/lib/nodecache /out/usr/share/doc/nodecache \
 && cp LICENSE THIRD_PARTY_NOTICES.md /out/usr/share/doc/nodecache/

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/usr/local/bin/nodecache /usr/local/bin/nodecache
COPY --from=build /out/usr/share/doc/nodecache /usr/share/doc/nodecache
COPY --from=build --chown=65532:65532 /out/var/lib/nodecache /var/lib/nodecache
USER 65532:65532
EXPOSE 5000 9464
VOLUME ["/var/lib/nodecache"]
ENTRYPOINT ["/usr/local/bin/nodecache"]
CMD ["serve"]
