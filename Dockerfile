# syntax=docker/dockerfile:1

# Build: a static binary (no cgo), so the runtime image needs no libc.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w" -o /out/ingest-worker ./cmd/ingest-worker

# Run: distroless static, as the unprivileged user nonroot (uid 65532).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ingest-worker /usr/local/bin/ingest-worker
USER 65532:65532
# Probes, metrics and the task API; listen on all interfaces inside the container.
ENV INGEST_HTTP_ADDR=0.0.0.0:8080
EXPOSE 8080
# No curl in the image: the binary probes itself.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/ingest-worker", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/ingest-worker"]
CMD ["run"]
