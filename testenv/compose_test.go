// Package testenv_test checks the files that stand up the environment but that no test
// here can run: there is no Docker engine on our machines, so the compose file is
// validated for what it names, not started.
package testenv_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

type compose struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
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
