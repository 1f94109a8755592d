# A worker image: a static binary on distroless, running as a non-root user, with the
# operator's tool beside it. WORKER is the worker program's package: the demo's
# (examples/invoice) by default; a worker of your own with --build-arg WORKER=./path.
#   docker build -t extworker .
#   docker run --rm -e EXTWORKER_ENGINE_URL=https://bpm.example.com/engine-rest \
#     -e EXTWORKER_ENGINE_USER=worker -e EXTWORKER_ENGINE_PASSWORD_FILE=/run/secrets/engine_password \
#     extworker            # the worker's `run` by default; `migrate`, `config` as arguments
#   docker run --rm --entrypoint /extworker extworker effects list   # the operator's tool
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG WORKER=./examples/invoice
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/worker $WORKER && \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/extworker ./cmd/extworker

# distroless/static: CA certificates and tzdata, no shell, no package manager.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/worker /worker
COPY --from=build /out/extworker /extworker
USER 65532:65532
ENTRYPOINT ["/worker"]
CMD ["run"]
