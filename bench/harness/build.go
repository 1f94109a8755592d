package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Programs are the Go programs of the benchmark, built by BuildPrograms.
var Programs = []string{"goworker", "stubengine", "rawloop"}

// BuildPrograms builds bench/cmd/{goworker,stubengine,rawloop} into dir with the go
// command on PATH (without the race detector, whatever the caller was built with).
func BuildPrograms(ctx context.Context, moduleRoot, dir string) error {
	args := []string{"build", "-o", dir + string(os.PathSeparator)}
	for _, p := range Programs {
		args = append(args, "./bench/cmd/"+p)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = moduleRoot
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// moduleRoot finds the extworker checkout from the working directory.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the extworker module (go env GOMOD is empty)")
	}
	return filepath.Dir(mod), nil
}

// pprofTop renders the top functions of a CPU profile, flat and cumulative.
func pprofTop(ctx context.Context, binary, profile string) (string, error) {
	var b strings.Builder
	for _, sort := range []string{"-flat", "-cum"} {
		out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", sort, "-nodecount=22", binary, profile).Output()
		if err != nil {
			return "", fmt.Errorf("go tool pprof %s: %w", profile, err)
		}
		// Keep the table; drop the header lines that name temporary paths.
		for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
			if strings.HasPrefix(line, "File:") || strings.HasPrefix(line, "Build ID:") || strings.HasPrefix(line, "Type:") || strings.HasPrefix(line, "Time:") {
				continue
			}
			b.WriteString(line + "\n")
		}
		b.WriteString("\n")
	}
	return strings.TrimRight(b.String(), "\n"), nil
}

// versions describes what ran: engine, database, toolchains, clients, machine.
func versions(ctx context.Context, o Options, engineVersion string) ([][2]string, string) {
	v := [][2]string{{"Camunda 7 engine", engineVersion + " (" + o.EngineURL + ")"}}
	if o.EngineDBURL != "" {
		v = append(v, [2]string{"PostgreSQL (engine's database)", pgVersion(ctx, o.EngineDBURL)})
	}
	rev := firstLine(run(ctx, o.ModuleRoot, "git", "rev-parse", "--short", "HEAD"))
	if strings.TrimSpace(run(ctx, o.ModuleRoot, "git", "status", "--porcelain")) != "" {
		rev += " with uncommitted changes"
	}
	v = append(v, [2]string{"extworker", "commit " + rev + ", built with " + firstLine(run(ctx, o.ModuleRoot, "go", "version"))})
	if o.has(Java) {
		v = append(v, [2]string{"Java", firstLine(run(ctx, "", "java", "-version"))})
		v = append(v, [2]string{"Java client", "org.camunda.bpm:camunda-external-task-client " + pomVersion(filepath.Join(o.ModuleRoot, "bench", "java-worker", "pom.xml"))})
	}
	if o.has(JS) {
		v = append(v, [2]string{"Node.js", firstLine(run(ctx, "", "node", "--version"))})
		v = append(v, [2]string{"JS client", "camunda-external-task-client-js " + npmVersion(filepath.Join(o.JSDir, "node_modules", "camunda-external-task-client-js", "package.json"))})
	}
	return v, machine()
}

func run(ctx context.Context, dir, name string, args ...string) string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil && len(out) == 0 {
		return "unknown (" + err.Error() + ")"
	}
	return string(out)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(s)
}

func pgVersion(ctx context.Context, url string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return v
}

var pomVersionRE = regexp.MustCompile(`<camunda\.version>([^<]+)</camunda\.version>`)

func pomVersion(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	if m := pomVersionRE.FindSubmatch(b); m != nil {
		return string(m[1])
	}
	return "unknown"
}

func npmVersion(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	var p struct {
		Version string `json:"version"`
	}
	if json.Unmarshal(b, &p) != nil || p.Version == "" {
		return "unknown"
	}
	return p.Version
}

// machine describes this machine for a results file, with what ran on it.
func machine() string {
	return Machine("engine, PostgreSQL, driver and workers")
}

// Machine is "<cpu model>, N cores, M GiB memory, os/arch; <what> all on this machine",
// from /proc, for the header of a results file (bench/results).
func Machine(what string) string {
	model := runtime.GOARCH
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil {
			mem = fmt.Sprintf(", %.0f GiB memory", float64(kb)/(1<<20))
		}
	}
	return fmt.Sprintf("%s, %d cores%s, %s/%s; %s all on this machine", model, runtime.NumCPU(), mem, runtime.GOOS, runtime.GOARCH, what)
}
