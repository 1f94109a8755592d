// Package services_test checks the files that stand up the environment but that no test
// here can run: there is no Docker engine on our machines, so the compose file is
// validated for what it names, not started.
package services_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/extworker/extworker/internal/testenv"
)

type compose struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Build       any               `yaml:"build"`
		Command     []string          `yaml:"command"`
		Restart     string            `yaml:"restart"`
		Environment map[string]string `yaml:"environment"`
		Ports       []string          `yaml:"ports"`
		DependsOn   map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
		Healthcheck struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		Volumes []string `yaml:"volumes"`
	} `yaml:"services"`
	Volumes map[string]any `yaml:"volumes"`
}

func TestComposeFile(t *testing.T) {
	data, err := os.ReadFile("../docker-compose.camunda7.yml")
	require.NoError(t, err)
	var c compose
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(false)
	require.NoError(t, dec.Decode(&c))

	db, ok := c.Services["db"]
	require.True(t, ok, "a db service")
	assert.Equal(t, "postgres:15", db.Image)
	assert.Equal(t, "camunda", db.Environment["POSTGRES_DB"])
	assert.NotEmpty(t, db.Healthcheck.Test)

	engine, ok := c.Services["engine"]
	require.True(t, ok, "an engine service")
	assert.Equal(t, "camunda/camunda-bpm-platform:run-7.24.0", engine.Image)
	assert.Equal(t, "org.postgresql.Driver", engine.Environment["DB_DRIVER"])
	assert.Equal(t, "jdbc:postgresql://db:5432/camunda", engine.Environment["DB_URL"], "engine data in PostgreSQL")
	assert.Equal(t, db.Environment["POSTGRES_USER"], engine.Environment["DB_USERNAME"])
	assert.Equal(t, db.Environment["POSTGRES_PASSWORD"], engine.Environment["DB_PASSWORD"])
	assert.Equal(t, "service_healthy", engine.DependsOn["db"].Condition)
	assert.Contains(t, engine.Ports, "127.0.0.1:8080:8080")
	assert.Contains(t, strings.Join(engine.Healthcheck.Test, " "), "/engine-rest/version")

	// The worker: built from ./Dockerfile, migrating once, then running against the engine
	// and the ledger database by their service names.
	migrate, ok := c.Services["extworker-migrate"]
	require.True(t, ok, "a one-shot migrate service")
	assert.Equal(t, ".", migrate.Build, "built from the repository's Dockerfile")
	assert.Equal(t, []string{"migrate"}, migrate.Command)
	assert.Equal(t, "service_healthy", migrate.DependsOn["db"].Condition)
	worker, ok := c.Services["extworker"]
	require.True(t, ok, "an extworker service")
	assert.Equal(t, migrate.Image, worker.Image, "the image the migrate service builds")
	assert.Equal(t, []string{"run"}, worker.Command)
	assert.Equal(t, "service_healthy", worker.DependsOn["engine"].Condition)
	assert.Equal(t, "service_completed_successfully", worker.DependsOn["extworker-migrate"].Condition)
	for _, s := range []map[string]string{migrate.Environment, worker.Environment} {
		assert.Equal(t, "http://engine:8080/engine-rest", s["EXTWORKER_ENGINE_URL"])
		assert.Contains(t, s["EXTWORKER_DATABASE_URL"], "@db:5432/extworker")
	}
	initdb, err := os.ReadFile("compose-initdb.sql")
	require.NoError(t, err)
	assert.Contains(t, string(initdb), "CREATE DATABASE extworker", "the ledger database the worker connects to")

	// Every bind-mounted file exists in the repository.
	for name, s := range c.Services {
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if strings.HasPrefix(src, "./") {
				_, err := os.Stat("../" + strings.TrimPrefix(src, "./"))
				assert.NoError(t, err, "service %s mounts %s", name, src)
			}
		}
	}
}

// The engine under test is configured for PostgreSQL and the REST path the client uses.
func TestEngineApplicationConfig(t *testing.T) {
	data, err := os.ReadFile("engine/src/main/resources/application.yaml")
	require.NoError(t, err)
	var cfg map[string]any
	require.NoError(t, yaml.Unmarshal(data, &cfg))
	ds := cfg["spring"].(map[string]any)["datasource"].(map[string]any)
	assert.Contains(t, ds["url"], "jdbc:postgresql://127.0.0.1:5432/camunda")
	bpm := cfg["camunda"].(map[string]any)["bpm"].(map[string]any)
	assert.Equal(t, bpm, cfg["operaton"].(map[string]any)["bpm"], "Operaton reads the same settings")
	assert.Equal(t, "full", bpm["history-level"])
}

// The worker's image: the demo's worker (or WORKER) and the operator's tool, static binaries,
// a small base, a non-root user, `run` by default.
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile("../Dockerfile")
	require.NoError(t, err)
	df := string(data)
	assert.Contains(t, df, "FROM golang:1.26 AS build")
	assert.Contains(t, df, "CGO_ENABLED=0 go build -trimpath")
	assert.Contains(t, df, "./cmd/extworker")
	assert.Contains(t, df, "FROM gcr.io/distroless/static-debian12:nonroot")
	assert.Contains(t, df, "USER 65532:65532")
	assert.Contains(t, df, `ENTRYPOINT ["/worker"]`)
	assert.Contains(t, df, "ARG WORKER=./examples/invoice")
	assert.Contains(t, df, `CMD ["run"]`)

	ignore, err := os.ReadFile("../.dockerignore")
	require.NoError(t, err)
	for _, p := range []string{".git", "bench/", "services/", "**/node_modules"} {
		assert.Contains(t, string(ignore), p+"\n", "kept out of the build context")
	}
}

// The second engine (ENGINE_REST_AUTH=true) creates the administrator the tests log in as.
func TestEngineRestAuthProfile(t *testing.T) {
	data, err := os.ReadFile("engine/src/main/resources/application-rest-auth.yaml")
	require.NoError(t, err)
	var cfg map[string]any
	require.NoError(t, yaml.Unmarshal(data, &cfg))
	bpm := cfg["camunda"].(map[string]any)["bpm"].(map[string]any)
	assert.Equal(t, bpm, cfg["operaton"].(map[string]any)["bpm"], "Operaton reads the same settings")
	admin := bpm["admin-user"].(map[string]any)
	assert.Equal(t, "${ENGINE_ADMIN_USER:admin}", admin["id"])
	assert.Equal(t, "${ENGINE_ADMIN_PASSWORD}", admin["password"])

	up, err := os.ReadFile("engine-up.sh")
	require.NoError(t, err)
	assert.Contains(t, string(up), `ENGINE_ADMIN_USER:-`+testenv.AuthEngineUser+`}`)
	assert.Contains(t, string(up), `ENGINE_ADMIN_PASSWORD:-`+testenv.AuthEnginePassword+`}`)
	pg, err := os.ReadFile("pg-up.sh")
	require.NoError(t, err)
	assert.Contains(t, string(pg), "camunda:camunda:camunda_auth")
}
