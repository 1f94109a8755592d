package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/testenv"
)

func TestProgramVersion(t *testing.T) {
	const rev = "3f2c1a9e7b0d5c4b3a291807f6e5d4c3b2a19080"
	vcs := func(modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "-compiler", Value: "gc"}, {Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev},
			{Key: "vcs.time", Value: "2025-03-04T10:12:30Z"}, {Key: "vcs.modified", Value: modified}}
	}
	for _, c := range []struct {
		bi   *debug.BuildInfo
		want string
	}{
		{&debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}, Settings: vcs("false")}, "extworker v1.4.0 (revision " + rev + ", 2025-03-04T10:12:30Z)"},
		{&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs("true")}, "extworker (devel) (revision " + rev + ", 2025-03-04T10:12:30Z, modified)"},
		{&debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}}, "extworker v1.4.0 (no VCS revision)"},
		{&debug.BuildInfo{}, "extworker (devel) (no VCS revision)"},
		{nil, "extworker (no build information)"},
	} {
		assert.Equal(t, c.want, programVersion(c.bi))
	}
}

// The binary as built says which module version and revision it is (as `go version -m`
// reads them from it, modified or not), then the engine's version.
func TestVersionCommandNamesTheBuild(t *testing.T) {
	if testing.Short() && !testenv.InCI() { // in CI (CI=true) it always runs
		t.Skip("builds the binary")
	}
	// As a release is built: stamped with the VCS revision when there is one (this
	// environment's GOFLAGS may say -buildvcs=false).
	bin := filepath.Join(t.TempDir(), "extworker")
	b, err := exec.Command("go", "build", "-buildvcs=auto", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", b)
	m, err := exec.Command("go", "version", "-m", bin).CombinedOutput()
	require.NoError(t, err, "go version -m: %s", m)
	settings := map[string]string{}
	var modVersion string
	for line := range strings.Lines(string(m)) {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[0] == "mod":
			modVersion = f[2]
		case len(f) == 2 && f[0] == "build":
			if k, v, ok := strings.Cut(f[1], "="); ok {
				settings[k] = v
			}
		}
	}
	require.NotEmpty(t, modVersion, "go version -m: %s", m)
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"version":"7.24.0"}`))
	}))
	defer engine.Close()
	cmd := exec.Command(bin, "version")
	cmd.Env = append(os.Environ(), "EXTWORKER_ENGINE_URL="+engine.URL+"/engine-rest")
	out, err := cmd.Output()
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	require.Len(t, lines, 2, "%s", out)
	assert.True(t, strings.HasPrefix(lines[0], "extworker "+modVersion+" ("), lines[0])
	if rev := settings["vcs.revision"]; rev != "" {
		assert.Contains(t, lines[0], "revision "+rev)
		assert.Equal(t, settings["vcs.modified"] == "true", strings.HasSuffix(lines[0], ", modified)"), lines[0])
	} else {
		assert.Contains(t, lines[0], "(no VCS revision)")
	}
	assert.Equal(t, "engine 7.24.0", lines[1])
}
