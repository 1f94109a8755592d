package testenv

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Broker is a RabbitMQ node of the test's own (StartBroker), which the test may SIGKILL
// and start again: the shared broker (AMQPURL) is never touched.
type Broker struct {
	n *BrokerNode
}

// BrokerNode is a RabbitMQ node of its own (its own ports, data directory, Erlang node
// name and cookie), for a test (Broker) or a harness outside tests (the soak). It runs as
// the user running it, from the real scripts of the installed rabbitmq-server, with no
// plugins, listening on loopback only; it has RabbitMQ's default user guest (password
// guest), which may log in from loopback, and the default virtual host.
type BrokerNode struct {
	node           string // extworker-test-<hex>@localhost
	port, distPort int
	dir            string // data, logs, configuration and HOME (with the cookie)
	server, ctl    string // the rabbitmq-server and rabbitmqctl scripts
	env            []string

	mu   sync.Mutex
	proc *brokerProc // nil while killed
}

// brokerProc is one run of rabbitmq-server: the shell script (the leader of its own
// process group), which starts the Erlang VM (beam.smp) as its child.
type brokerProc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the script has exited and been reaped
	beam int           // the VM's pid, found once the node has booted
}

func (p *brokerProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// brokerStartTimeout bounds a start, from the process to rabbitmqctl await_startup
// (a few seconds on an idle machine; far more under a loaded -race suite).
const brokerStartTimeout = 2 * time.Minute

// StartBroker starts a RabbitMQ node for the test and returns once it has booted
// (rabbitmqctl -n NODE await_startup) and accepts connections; it logs how long that
// took. At cleanup its processes are SIGKILLed (the script's whole process group and the
// Erlang VM's port programs; never the shared epmd) and its directory is removed. Where
// RabbitMQ is not installed the test fails in CI and is skipped elsewhere.
func StartBroker(t testing.TB) *Broker {
	t.Helper()
	needServices(t, "a private RabbitMQ node")
	if _, err := rabbitScript("rabbitmq-server"); err != nil {
		unavailable(t, "RabbitMQ's own scripts, for a private node (the rabbitmq-server package; `make up` installs it)", err)
	}
	began := time.Now()
	n, err := StartBrokerNode(t.TempDir()) // removed after the cleanup below, which runs first
	if n != nil {
		t.Cleanup(n.Stop)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("private RabbitMQ node %s on 127.0.0.1:%d started in %v", n.node, n.port, time.Since(began).Round(time.Millisecond))
	return &Broker{n: n}
}

// StartBrokerNode starts a RabbitMQ node in dir (which it fills: data, logs,
// configuration, a HOME with the cookie) and returns once it has booted and accepts
// connections. Stop it with Stop. On an error after the node's process started, the
// node is returned too, for Stop.
func StartBrokerNode(dir string) (*BrokerNode, error) {
	server, err := rabbitScript("rabbitmq-server")
	var ctl string
	if err == nil {
		ctl, err = rabbitScript("rabbitmqctl")
	}
	if err != nil {
		return nil, fmt.Errorf("RabbitMQ's own scripts (the rabbitmq-server package): %w", err)
	}
	n := &BrokerNode{server: server, ctl: ctl, dir: dir}
	if err := n.setup(); err != nil {
		return nil, err
	}
	if _, err := n.start(); err != nil {
		return n, err
	}
	return n, nil
}

// rabbitScript finds one of RabbitMQ's scripts. Debian's and Ubuntu's package keep the
// real ones in /usr/lib/rabbitmq/bin: those in /usr/sbin are wrappers which, for root,
// run them as the rabbitmq user through su, dropping the environment this node is
// configured by.
func rabbitScript(name string) (string, error) {
	p := filepath.Join("/usr/lib/rabbitmq/bin", name)
	if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
		return p, nil
	}
	return exec.LookPath(name)
}

// setup picks the node's name and ports and writes its directory: an Erlang cookie of
// its own in a HOME of its own (rabbitmqctl, given the same HOME, reads the same), an
// empty enabled-plugins file and configuration files that replace the machine's.
func (b *BrokerNode) setup() error {
	b.node = Unique("extworker-test") + "@localhost"
	var err error
	if b.port, err = freePort(); err != nil {
		return err
	}
	for b.distPort == 0 || b.distPort == b.port {
		if b.distPort, err = freePort(); err != nil {
			return err
		}
	}
	home := filepath.Join(b.dir, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return err
	}
	files := map[string]string{
		filepath.Join(home, ".erlang.cookie"):     cookie(),
		filepath.Join(b.dir, "enabled_plugins"):   "[].\n",
		filepath.Join(b.dir, "rabbitmq.conf"):     "# private test node (internal/testenv/broker.go): its listener comes from RABBITMQ_NODE_IP_ADDRESS and RABBITMQ_NODE_PORT\n",
		filepath.Join(b.dir, "rabbitmq-env.conf"): "# replaces /etc/rabbitmq/rabbitmq-env.conf, which would configure the shared node\n",
		filepath.Join(b.dir, "advanced.config"):   "[].\n",
	}
	for p, content := range files {
		if err := os.WriteFile(p, []byte(content), 0o400); err != nil {
			return err
		}
	}
	for _, sub := range []string{"mnesia", "log"} {
		if err := os.MkdirAll(filepath.Join(b.dir, sub), 0o700); err != nil {
			return err
		}
	}
	mnesia := filepath.Join(b.dir, "mnesia")
	vars := map[string]string{
		"HOME":                                home,
		"RABBITMQ_NODENAME":                   b.node,
		"RABBITMQ_NODE_IP_ADDRESS":            "127.0.0.1",
		"RABBITMQ_NODE_PORT":                  strconv.Itoa(b.port),
		"RABBITMQ_DIST_PORT":                  strconv.Itoa(b.distPort),
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
		"RABBITMQ_MNESIA_BASE":                mnesia,
		"RABBITMQ_MNESIA_DIR":                 filepath.Join(mnesia, "node"),
		"RABBITMQ_LOG_BASE":                   filepath.Join(b.dir, "log"),
		"RABBITMQ_LOGS":                       filepath.Join(b.dir, "log", "node.log"),
		"RABBITMQ_PID_FILE":                   filepath.Join(b.dir, "node.pid"),
		"RABBITMQ_ENABLED_PLUGINS_FILE":       filepath.Join(b.dir, "enabled_plugins"),
		"RABBITMQ_CONFIG_FILE":                filepath.Join(b.dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE":       filepath.Join(b.dir, "advanced.config"),
		"RABBITMQ_CONF_ENV_FILE":              filepath.Join(b.dir, "rabbitmq-env.conf"),
	}
	b.env = brokerEnv(vars)
	return nil
}

// brokerEnv is the tests' environment without any RABBITMQ_* variable or HOME (which
// might configure the shared node, or systemd's NOTIFY_SOCKET), plus vars.
func brokerEnv(vars map[string]string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "RABBITMQ_") || name == "HOME" || name == "NOTIFY_SOCKET" {
			continue
		}
		env = append(env, kv)
	}
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	return env
}

// cookie is a random Erlang cookie: 20 capital letters.
func cookie() string {
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = 'A' + b[i]%26
	}
	return string(b)
}

// freePort returns a loopback TCP port nobody listens on just now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// URL is the node's AMQP URL: user guest on the default virtual host.
func (b *Broker) URL() string { return b.n.URL() }

// Node is the node's Erlang name, for rabbitmqctl -n.
func (b *Broker) Node() string { return b.n.node }

// URL is the node's AMQP URL: user guest on the default virtual host.
func (b *BrokerNode) URL() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", b.port) }

// Node is the node's Erlang name, for rabbitmqctl -n.
func (b *BrokerNode) Node() string { return b.node }

// start runs rabbitmq-server and waits for the node to boot; it returns how long that
// took.
func (b *BrokerNode) start() (time.Duration, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.proc != nil {
		return 0, fmt.Errorf("RabbitMQ node %s is running already", b.node)
	}
	began := time.Now()
	out, err := os.OpenFile(filepath.Join(b.dir, "server.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(b.server)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = b.dir, b.env, out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		out.Close()
		return 0, fmt.Errorf("start %s: %w", b.server, err)
	}
	p := &brokerProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	b.proc = p
	// The AMQP listener opens late in the boot; then rabbitmqctl confirms the boot is
	// complete (and that it can talk to the node). Polling rabbitmqctl alone costs a CLI
	// VM's start per poll, and it fails at once while the node is not yet registered.
	for deadline := time.Now().Add(brokerStartTimeout); !listening(b.port); time.Sleep(50 * time.Millisecond) {
		if p.exited() {
			return 0, fmt.Errorf("RabbitMQ node %s exited while starting (%v):\n%s", b.node, p.cmd.ProcessState, b.logs())
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("RabbitMQ node %s did not listen on 127.0.0.1:%d within %v:\n%s", b.node, b.port, brokerStartTimeout, b.logs())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), brokerStartTimeout)
	defer cancel()
	ctl := exec.CommandContext(ctx, b.ctl, "-q", "-n", b.node, "await_startup", "--timeout", "60")
	ctl.Dir, ctl.Env = b.dir, b.env
	if out, err := ctl.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("rabbitmqctl -n %s await_startup: %v\n%s\n%s", b.node, err, out, b.logs())
	}
	for _, c := range procTree()[cmd.Process.Pid] {
		if comm(c) == "beam.smp" {
			p.beam = c
		}
	}
	if p.beam == 0 {
		return 0, fmt.Errorf("RabbitMQ node %s booted but no beam.smp is a child of rabbitmq-server (pid %d)", b.node, cmd.Process.Pid)
	}
	return time.Since(began), nil
}

// BrokerKill is what Broker.Kill did.
type BrokerKill struct {
	PID int       // the Erlang VM (beam.smp) that was killed
	At  time.Time // when SIGKILL was sent
	// Dead is how long after the signal the VM was gone (reaped) and the AMQP port
	// refused connections.
	Dead time.Duration
}

// Kill SIGKILLs the node's Erlang VM, the real fault (no shutdown, nothing flushed but
// what the broker had written already), and returns once the VM is gone and the AMQP
// port refuses connections; it logs how long that took. The VM's port programs
// (erl_child_setup and what it started, in sessions of their own) are SIGKILLed with it.
func (b *Broker) Kill(t testing.TB) BrokerKill {
	t.Helper()
	k, err := b.n.kill()
	if err != nil {
		t.Fatalf("Kill: %v", err)
	}
	t.Logf("private RabbitMQ node %s killed (SIGKILL to beam.smp pid %d); dead and its port closed %v later", b.n.node, k.PID, k.Dead.Round(time.Millisecond))
	return k
}

// Restart starts the killed node again, on the same data directory, name and ports, and
// returns once it has booted, with how long that took; it logs it too. Durable queues
// and the persistent messages the broker confirmed are there again.
func (b *Broker) Restart(t testing.TB) time.Duration {
	t.Helper()
	d, err := b.n.start()
	if err != nil {
		t.Fatalf("Restart: %v", err)
	}
	t.Logf("private RabbitMQ node %s restarted in %v", b.n.node, d.Round(time.Millisecond))
	return d
}

// Kill SIGKILLs the node's Erlang VM as Broker.Kill does.
func (b *BrokerNode) Kill() error {
	_, err := b.kill()
	return err
}

// Restart starts the killed node again as Broker.Restart does.
func (b *BrokerNode) Restart() error {
	_, err := b.start()
	return err
}

func (b *BrokerNode) kill() (BrokerKill, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.proc
	if p == nil || p.exited() {
		return BrokerKill{}, fmt.Errorf("RabbitMQ node %s is not running", b.node)
	}
	// The signal first, at once (a test times it against a publish under way); the pid
	// is checked to be still the VM of this node. Then its port programs.
	beam := p.beam
	if _, parent, ok := procStat(beam); !ok || parent != p.cmd.Process.Pid || comm(beam) != "beam.smp" {
		return BrokerKill{}, fmt.Errorf("pid %d is no longer the beam.smp of rabbitmq-server (pid %d)", beam, p.cmd.Process.Pid)
	}
	k := BrokerKill{PID: beam, At: time.Now()}
	if err := syscall.Kill(beam, syscall.SIGKILL); err != nil {
		return k, fmt.Errorf("SIGKILL beam.smp (pid %d): %w", beam, err)
	}
	for _, pid := range descendants(procTree(), beam) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(20 * time.Second); !p.exited() || listening(b.port); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return k, fmt.Errorf("RabbitMQ node %s (beam.smp pid %d) still alive or port %d still open 20s after SIGKILL", b.node, beam, b.port)
		}
	}
	b.proc = nil
	k.Dead = time.Since(k.At)
	return k, nil
}

// Stop SIGKILLs whatever runs of the node: the script's process group (the script and
// the VM) and the VM's port programs, which run in sessions of their own.
func (b *BrokerNode) Stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.proc
	b.proc = nil
	if p == nil || p.exited() {
		return
	}
	pid := p.cmd.Process.Pid
	ports := descendants(procTree(), pid)
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	for _, c := range ports {
		_ = syscall.Kill(c, syscall.SIGKILL)
	}
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
	}
}

// logs is the end of the node's output and log, for a failure message.
func (b *BrokerNode) logs() string {
	var s strings.Builder
	for _, name := range []string{"server.out", filepath.Join("log", "node.log")} {
		raw, err := os.ReadFile(filepath.Join(b.dir, name))
		if err != nil {
			continue
		}
		if len(raw) > 3000 {
			raw = raw[len(raw)-3000:]
		}
		fmt.Fprintf(&s, "--- %s (end) ---\n%s\n", name, raw)
	}
	return s.String()
}

// listening reports whether 127.0.0.1:port accepts a connection.
func listening(port int) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// procTree maps each live process's parent pid to its children, in one pass over /proc.
func procTree() map[int][]int {
	tree := map[int][]int{}
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err != nil {
			continue
		}
		if state, parent, ok := procStat(pid); ok && state != 'Z' && state != 'X' {
			tree[parent] = append(tree[parent], pid)
		}
	}
	return tree
}

// descendants lists pid's children in tree, theirs, and so on.
func descendants(tree map[int][]int, pid int) []int {
	var out []int
	for _, c := range tree[pid] {
		out = append(out, c)
		out = append(out, descendants(tree, c)...)
	}
	return out
}

// comm is the command name of pid ("beam.smp").
func comm(pid int) string {
	raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(raw))
}
