package testenv

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
)

// An engine cluster of the test's own, as production runs Camunda 7: engine nodes on ONE
// database behind a load balancer (HAProxy, round robin, with the health check and
// timeouts of services/haproxy-cluster.cfg, which make cluster-up runs too). The nodes
// run from the build services/engine-up.sh makes, each started by that script on a free
// port of its own, all on database ClusterDB of the main PostgreSQL (created by
// services/pg-up.sh). A test may SIGKILL a node (Kill), stop it without killing it
// (Freeze) and start it again (Restart).
const (
	// ClusterDB is the test clusters' engine database (make cluster-up's is
	// camunda_cluster, so the two never share a schema being created).
	ClusterDB = "camunda_cluster_test"
	// ClusterDBURL is that database, as the engine's login.
	ClusterDBURL = "postgres://camunda:camunda@127.0.0.1:5432/" + ClusterDB
)

// clusterStartTimeout bounds the start of the cluster's nodes (an engine starts in
// 20-60s here; two at once on two cores, beside a test suite, take longer).
const clusterStartTimeout = 5 * time.Minute

// Cluster is an engine cluster of the test's own (StartCluster).
type Cluster struct {
	root      string
	ports     []int
	lbPort    int
	statsPort int
	haproxy   *exec.Cmd
	lbDone    chan struct{}
	lbLog     *Buffer
}

// StartCluster starts an engine cluster of nodes nodes for the test, in parallel (the
// first alone when the database has no engine schema yet: two nodes creating it at once
// collide), and HAProxy in front of them, and returns once every node answers and HAProxy
// counts each one up; it logs how long that took. One test cluster runs at a time on this
// machine (a lock file in services/.run; a second test waits for it): four more JVMs on
// two cores would starve everything else. At cleanup HAProxy and the nodes are
// SIGKILLed, and the nodes' files in services/.run removed (kept when the test failed).
//
// Where haproxy is not installed (`make cluster-up` installs it) the test fails in CI and
// is skipped elsewhere. In a lane of make engines-check (services/lane.sh) it is skipped:
// the nodes would run the default release on the main PostgreSQL, not the lane's.
func StartCluster(t testing.TB, nodes int) *Cluster {
	t.Helper()
	needServices(t, "an engine cluster of the test's own")
	if nodes < 1 {
		t.Fatalf("StartCluster: %d nodes", nodes)
	}
	if lane := os.Getenv("LANE_PG_CLUSTER"); lane != "" {
		// make conformance leaves the cluster's tests out in a lane; reaching here is a
		// mistake of the run, which in CI fails rather than passes unseen.
		msg := fmt.Sprintf("an engine cluster runs the default release on the main PostgreSQL: not in a lane (LANE_PG_CLUSTER=%s); make test-beyond runs it", lane)
		if InCI() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if _, err := exec.LookPath("haproxy"); err != nil {
		unavailable(t, "haproxy, the engine cluster's load balancer (`make cluster-up` installs Debian's package)", err)
	}
	root := repoRoot(t)
	began := time.Now()
	unlock := clusterLock(t, root)
	t.Cleanup(unlock)
	if waited := time.Since(began); waited > time.Second {
		t.Logf("waited %v for another test's engine cluster to stop", waited.Round(time.Millisecond))
	}
	began = time.Now()

	c := &Cluster{root: root}
	for range nodes {
		c.ports = append(c.ports, mustFreePort(t))
	}
	c.lbPort, c.statsPort = mustFreePort(t), mustFreePort(t)
	t.Cleanup(func() { c.stop(t) })

	ctx, cancel := context.WithTimeout(context.Background(), clusterStartTimeout)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "bash", filepath.Join(root, "services", "pg-up.sh"), ClusterDB).CombinedOutput(); err != nil {
		unavailable(t, "PostgreSQL for the cluster's database "+ClusterDB, fmt.Errorf("services/pg-up.sh: %v\n%s", err, out))
	}
	rest := c.ports
	if !clusterSchema(t, ctx) {
		if err := c.startNode(ctx, 0); err != nil {
			t.Fatal(err)
		}
		rest = rest[1:]
	}
	errs := make(chan error, len(rest))
	for _, p := range rest {
		go func() { errs <- c.startNode(ctx, c.index(p)) }()
	}
	var failed []error
	for range rest {
		if err := <-errs; err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		t.Fatal(errors.Join(failed...))
	}
	if err := c.startHAProxy(t); err != nil {
		t.Fatal(err)
	}
	for i := range c.ports {
		c.WaitBalanced(t, i, true, time.Minute)
	}
	t.Logf("engine cluster: %d nodes (ports %v, database %s) behind HAProxy at %s, started in %v",
		nodes, c.ports, ClusterDB, c.URL(), time.Since(began).Round(time.Millisecond))
	return c
}

// clusterLock takes the machine's test-cluster lock (blocking) and returns its release.
func clusterLock(t testing.TB, root string) func() {
	t.Helper()
	dir := filepath.Join(root, "services", ".run")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "cluster-test.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("lock %s: %v", f.Name(), err)
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }
}

func mustFreePort(t testing.TB) int {
	t.Helper()
	p, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// clusterSchema reports whether ClusterDB holds the engine's schema already.
func clusterSchema(t testing.TB, ctx context.Context) bool {
	t.Helper()
	conn, err := pgx.Connect(ctx, ClusterDBURL)
	if err != nil {
		unavailable(t, "the cluster's database "+ClusterDB, err)
	}
	defer conn.Close(context.Background())
	var have bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('act_ge_property') IS NOT NULL`).Scan(&have); err != nil {
		t.Fatalf("the cluster's database %s: %v", ClusterDB, err)
	}
	return have
}

func (c *Cluster) index(port int) int {
	for i, p := range c.ports {
		if p == port {
			return i
		}
	}
	return -1
}

// startNode runs services/engine-up.sh for node i and returns once it answers.
func (c *Cluster) startNode(ctx context.Context, i int) error {
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(c.root, "services", "engine-up.sh"))
	cmd.Dir = c.root
	cmd.Env = append(os.Environ(), "ENGINE_PORT="+strconv.Itoa(c.ports[i]), "ENGINE_DB="+ClusterDB,
		"ENGINE_REST_AUTH=false", "ENGINE_START_TIMEOUT="+strconv.Itoa(int(clusterStartTimeout/time.Second)))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("cluster node %d: services/engine-up.sh (port %d): %v\n%s", i, c.ports[i], err, out)
	}
	if !answers(c.NodeURL(i), 10*time.Second) {
		return fmt.Errorf("cluster node %d (port %d) started but does not answer GET /version", i, c.ports[i])
	}
	return nil
}

// haproxyConfig is services/haproxy-cluster.cfg with the nodes as the backend's servers
// and a statistics page (for WaitBalanced).
func (c *Cluster) haproxyConfig() (string, error) {
	base, err := os.ReadFile(filepath.Join(c.root, "services", "haproxy-cluster.cfg"))
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.Write(base)
	for i, p := range c.ports {
		fmt.Fprintf(&b, "    server node%d 127.0.0.1:%d check\n", i, p)
	}
	fmt.Fprintf(&b, "\nlisten stats\n    bind 127.0.0.1:%d\n    stats enable\n    stats uri /stats\n", c.statsPort)
	return b.String(), nil
}

func (c *Cluster) startHAProxy(t testing.TB) error {
	t.Helper()
	cfg, err := c.haproxyConfig()
	if err != nil {
		return err
	}
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return err
	}
	c.lbLog = &Buffer{}
	cmd := exec.Command("haproxy", "-db", "-f", path)
	cmd.Env = append(os.Environ(), "CLUSTER_PORT="+strconv.Itoa(c.lbPort))
	cmd.Stdout, cmd.Stderr = c.lbLog, c.lbLog
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start haproxy: %w", err)
	}
	c.haproxy, c.lbDone = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(c.lbDone) }()
	deadline := time.Now().Add(30 * time.Second)
	for !listening(c.lbPort) || !listening(c.statsPort) {
		select {
		case <-c.lbDone:
			return fmt.Errorf("haproxy exited at start (%v):\n%s", cmd.ProcessState, c.lbLog.String())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("haproxy does not listen on 127.0.0.1:%d after 30s:\n%s", c.lbPort, c.lbLog.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// stop SIGKILLs HAProxy and every node, and removes the nodes' files unless the test failed.
func (c *Cluster) stop(t testing.TB) {
	if c.haproxy != nil {
		_ = c.haproxy.Process.Kill()
		<-c.lbDone
		if t.Failed() {
			t.Logf("HAProxy's output:\n%s", c.lbLog.String())
		}
	}
	for i, p := range c.ports {
		if pid, err := c.jvm(i); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		base := strings.TrimSuffix(enginePIDFile(c.root, strconv.Itoa(p)), ".pid")
		if t.Failed() {
			t.Logf("cluster node %d's log: %s.log", i, base)
			_ = os.Remove(base + ".jar")
			continue
		}
		for _, ext := range []string{".pid", ".jar", ".log"} {
			_ = os.Remove(base + ext)
		}
	}
}

// Nodes is the number of nodes.
func (c *Cluster) Nodes() int { return len(c.ports) }

// URL is the cluster's REST root through HAProxy.
func (c *Cluster) URL() string { return fmt.Sprintf("http://127.0.0.1:%d/engine-rest", c.lbPort) }

// NodeURL is node i's own REST root, bypassing the balancer.
func (c *Cluster) NodeURL(i int) string {
	return fmt.Sprintf("http://127.0.0.1:%d/engine-rest", c.ports[i])
}

// Client is a client for the cluster through HAProxy.
func (c *Cluster) Client(t testing.TB) *admin.Client {
	t.Helper()
	return engine(t, "engine cluster", camunda7.Config{BaseURL: c.URL()})
}

// NodeClient is a client for node i alone.
func (c *Cluster) NodeClient(t testing.TB, i int) *admin.Client {
	t.Helper()
	return engine(t, fmt.Sprintf("engine cluster node %d", i), camunda7.Config{BaseURL: c.NodeURL(i)})
}

// jvm is node i's java process (the pid engine-up.sh recorded, checked to run its jar).
func (c *Cluster) jvm(i int) (int, error) {
	port := strconv.Itoa(c.ports[i])
	pidFile := enginePIDFile(c.root, port)
	data, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("%s: not a pid: %q", pidFile, data)
	}
	return findJVM(pid, "engine-"+port+".jar")
}

// Kill SIGKILLs node i's JVM and returns once it is dead and its port refuses
// connections (HAProxy notices later: WaitBalanced). A frozen node (Freeze) dies too.
func (c *Cluster) Kill(t testing.TB, i int) EngineKill {
	t.Helper()
	pid, err := c.jvm(i)
	if err != nil {
		t.Fatalf("cluster node %d: %v", i, err)
	}
	k := EngineKill{PID: pid, At: time.Now()}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL cluster node %d (pid %d): %v", i, pid, err)
	}
	Eventually(t, 20*time.Second, fmt.Sprintf("cluster node %d's JVM (pid %d) to die and its port %d to close", i, pid, c.ports[i]), func() (bool, error) {
		if alive(pid) {
			return false, fmt.Errorf("pid %d still running", pid)
		}
		return !listening(c.ports[i]), nil
	})
	k.Dead = time.Since(k.At)
	t.Logf("cluster node %d killed (SIGKILL to pid %d); dead and its port closed %v later", i, pid, k.Dead.Round(time.Millisecond))
	return k
}

// Freeze SIGSTOPs node i's JVM: its port still accepts connections (the kernel's backlog)
// but nothing answers, as in a long stop-the-world pause. Kill ends it; Thaw resumes it.
func (c *Cluster) Freeze(t testing.TB, i int) {
	t.Helper()
	c.signal(t, i, syscall.SIGSTOP)
}

// Thaw SIGCONTs a frozen node.
func (c *Cluster) Thaw(t testing.TB, i int) {
	t.Helper()
	c.signal(t, i, syscall.SIGCONT)
}

func (c *Cluster) signal(t testing.TB, i int, sig syscall.Signal) {
	t.Helper()
	pid, err := c.jvm(i)
	if err != nil {
		t.Fatalf("cluster node %d: %v", i, err)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatalf("%v to cluster node %d (pid %d): %v", sig, i, pid, err)
	}
}

// Restart starts node i again (services/engine-up.sh, same port and database) and returns
// once it answers and HAProxy counts it up again, with how long that took; it logs it.
func (c *Cluster) Restart(t testing.TB, i int) time.Duration {
	t.Helper()
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), clusterStartTimeout)
	defer cancel()
	if err := c.startNode(ctx, i); err != nil {
		t.Fatal(err)
	}
	answered := time.Since(began)
	c.WaitBalanced(t, i, true, time.Minute)
	d := time.Since(began)
	t.Logf("cluster node %d restarted: answering after %v, up in HAProxy after %v", i, answered.Round(time.Millisecond), d.Round(time.Millisecond))
	return d
}

// Balanced reports whether HAProxy counts node i up (its statistics: UP, or UP 1/2 while
// going down), with HAProxy's status word.
func (c *Cluster) Balanced(i int) (bool, string, error) {
	row, err := c.lbStats(i)
	if err != nil {
		return false, "", err
	}
	return strings.HasPrefix(row[17], "UP"), row[17], nil
}

// InFlight is how many requests HAProxy has open to node i just now (its scur): a
// pending long poll, or a request a frozen node has not answered, counts until answered.
func (c *Cluster) InFlight(i int) (int, error) {
	row, err := c.lbStats(i)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(row[4])
}

// lbStats is node i's row of HAProxy's statistics (CSV: pxname, svname, ..., scur the
// 5th column, stot the 8th, status the 18th).
func (c *Cluster) lbStats(i int) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/stats;csv", c.statsPort), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	r := csv.NewReader(resp.Body)
	r.FieldsPerRecord = -1
	rows, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("HAProxy's statistics: %w", err)
	}
	name := fmt.Sprintf("node%d", i)
	for _, row := range rows {
		if len(row) > 17 && row[0] == "engines" && row[1] == name {
			return row, nil
		}
	}
	return nil, fmt.Errorf("HAProxy's statistics have no server %s", name)
}

// WaitBalanced waits until HAProxy counts node i up (up true) or down, and returns how
// long that took.
func (c *Cluster) WaitBalanced(t testing.TB, i int, up bool, timeout time.Duration) time.Duration {
	t.Helper()
	began := time.Now()
	want := "DOWN"
	if up {
		want = "UP"
	}
	Eventually(t, timeout, fmt.Sprintf("HAProxy to count cluster node %d %s", i, want), func() (bool, error) {
		ok, status, err := c.Balanced(i)
		if err != nil {
			return false, err
		}
		return ok == up && !strings.Contains(status, "/"), fmt.Errorf("status %s", status)
	})
	return time.Since(began)
}
