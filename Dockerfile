# The extworker daemon: a static binary on distroless, running as a non-root user.
#   docker build -t extworker .
#   docker run --rm -e EXTWORKER_ENGINE_URL=https://bpm.example.com/engine-rest \
#     -e EXTWORKER_ENGINE_USER=worker -e EXTWORKER_ENGINE_PASSWORD_FILE=/run/secrets/engine_password \
#     extworker            # `run` by default; `migrate`, `config`, `effects ...` as arguments
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/extworker ./cmd/extworker

# distroless/static: CA certificates and tzdata, no shell, no package manager.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/extworker /extworker
USER 65532:65532
ENTRYPOINT ["/extworker"]
CMD ["run"]
