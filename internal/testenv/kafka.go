package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
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

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DefaultKafkaBrokers is the Kafka broker services/kafka-up.sh starts (make up): Apache
// Kafka 4.1.1, one KRaft node (broker and controller) on loopback.
const DefaultKafkaBrokers = "127.0.0.1:9092"

// KafkaBrokers is EXTWORKER_TEST_KAFKA_BROKERS (comma-separated host:port) or the local
// broker.
func KafkaBrokers() string { return env("EXTWORKER_TEST_KAFKA_BROKERS", DefaultKafkaBrokers) }

// Kafka returns the shared broker's address (KafkaBrokers) after checking that it answers
// a metadata request listing a broker; where it does not, the test fails in CI and is
// skipped elsewhere. Tests on the shared broker use topics and groups of their own
// (Unique), since other tests use it at the same time.
func Kafka(t testing.TB) string {
	t.Helper()
	brokers := KafkaBrokers()
	needServices(t, "Kafka at "+brokers)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := kafkaAnswers(ctx, strings.Split(brokers, ",")); err != nil {
		unavailable(t, "Kafka at "+brokers, err)
	}
	return brokers
}

// kafkaAnswers asks seeds for the cluster's metadata until a broker answers with at least
// one broker in it (a KRaft broker lists itself once it is unfenced: it serves clients)
// or ctx ends. Nothing listening fails at once.
func kafkaAnswers(ctx context.Context, seeds []string) error {
	c, err := net.DialTimeout("tcp", seeds[0], 2*time.Second)
	if err != nil {
		return err
	}
	c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.DialTimeout(2*time.Second))
	if err != nil {
		return err
	}
	defer cl.Close()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err = kafkaMetadata(ctx, cl)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// kafkaMetadata asks for the cluster's brokers, for one attempt of at most 3 seconds.
func kafkaMetadata(ctx context.Context, cl *kgo.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	req.Topics = []kmsg.MetadataRequestTopic{} // none: the brokers only
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	if len(resp.Brokers) == 0 {
		return errors.New("the metadata lists no broker yet")
	}
	return nil
}

// KafkaNode is an Apache Kafka broker of its own (its own ports, data directory and
// cluster), for a test (StartKafka), which may SIGKILL it and start it again, or for a
// harness outside tests (StartKafkaNode, the soak): the shared broker is never touched.
// It is one KRaft node, broker and controller in one JVM, with the settings of the shared
// one (services/kafka/broker.properties: topics created on first use with 3 partitions,
// one replica), listening on loopback only, run from the class path services/kafka-up.sh
// resolves.
type KafkaNode struct {
	dir                  string // server.properties, data/, server.out
	port, controllerPort int
	java                 []string // java and its arguments up to the main class

	mu   sync.Mutex
	proc *kafkaProc // nil while killed or stopped
}

// kafkaProc is one run of the broker's JVM, the direct child of the test's process.
type kafkaProc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the JVM has exited and been reaped
}

func (p *kafkaProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kafkaStartTimeout bounds a start, from the JVM's launch to the metadata answer (about 3
// seconds on an idle machine; far more under a loaded -race suite).
const kafkaStartTimeout = 2 * time.Minute

// StartKafka starts a Kafka broker for the test in t.TempDir() and returns once it answers
// (a metadata request lists it); it logs how long that took. At cleanup its JVM is
// SIGKILLed and its directory removed. Where the broker's jars cannot be had (no Java or
// Maven, Maven Central out of reach) the test fails in CI and is skipped elsewhere.
func StartKafka(t testing.TB) *KafkaNode {
	t.Helper()
	needServices(t, "a private Kafka broker")
	root, err := moduleRoot()
	if err == nil {
		_, err = kafkaClasspath(root)
	}
	if err != nil {
		unavailable(t, "Kafka's jars, for a private broker (services/kafka-up.sh classpath; `make up` resolves them)", err)
	}
	began := time.Now()
	n, err := StartKafkaNode(t.TempDir()) // removed after the cleanup below, which runs first
	if n != nil {
		t.Cleanup(n.Stop)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("private Kafka broker on %s started in %v", n.Addr(), time.Since(began).Round(time.Millisecond))
	return n
}

// StartKafkaNode starts a Kafka broker in dir (which it fills: its configuration, its data
// directory, formatted here, and the JVM's output in server.out) on two free loopback
// ports, and returns once it answers. Stop it with Stop. On an error after the JVM
// started, the node is returned too, for Stop. It finds services/kafka-up.sh above the
// working directory (the module's root).
func StartKafkaNode(dir string) (*KafkaNode, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	cp, err := kafkaClasspath(root)
	if err != nil {
		return nil, err
	}
	shared, err := os.ReadFile(filepath.Join(root, "services", "kafka", "broker.properties"))
	if err != nil {
		return nil, err
	}
	n := &KafkaNode{dir: dir}
	if n.port, err = freePort(); err != nil {
		return nil, err
	}
	for n.controllerPort == 0 || n.controllerPort == n.port {
		if n.controllerPort, err = freePort(); err != nil {
			return nil, err
		}
	}
	n.java = []string{"java", "-Xms64m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
		"-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile=" + filepath.Join(root, "services", "kafka", "log4j2.properties"),
		"-cp", cp}
	data := filepath.Join(dir, "data")
	conf := fmt.Sprintf("%s\n# internal/testenv: a private broker\nlisteners=PLAINTEXT://127.0.0.1:%d,CONTROLLER://127.0.0.1:%d\n"+
		"advertised.listeners=PLAINTEXT://127.0.0.1:%d\ncontroller.quorum.bootstrap.servers=127.0.0.1:%d\nlog.dirs=%s\n",
		shared, n.port, n.controllerPort, n.port, n.controllerPort, data)
	if err := os.WriteFile(n.conf(), []byte(conf), 0o600); err != nil {
		return nil, err
	}
	// A cluster of its own, this node its KRaft quorum's only voter.
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	id[0] &= 0x7f // the id's first character a letter: one starting with '-' reads as an option to StorageTool
	format := exec.Command(n.java[0], append(n.java[1:], "kafka.tools.StorageTool", "format", "--standalone",
		"-t", base64.RawURLEncoding.EncodeToString(id), "-c", n.conf())...)
	if out, err := format.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("format the private Kafka broker's data directory %s: %v\n%s", data, err, out)
	}
	if _, err := n.start(); err != nil {
		return n, err
	}
	return n, nil
}

// moduleRoot is the nearest parent of the working directory holding go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

var kafkaCP struct {
	sync.Mutex
	cp string
}

// kafkaClasspath is the broker's class path, from services/kafka-up.sh classpath (which
// resolves the jars with Maven the first time; then it reads a file), once per process.
func kafkaClasspath(root string) (string, error) {
	kafkaCP.Lock()
	defer kafkaCP.Unlock()
	if kafkaCP.cp != "" {
		return kafkaCP.cp, nil
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("bash", filepath.Join(root, "services", "kafka-up.sh"), "classpath")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("services/kafka-up.sh classpath: %v\n%s", err, stderr.Bytes())
	}
	cp := strings.TrimSpace(stdout.String())
	if cp == "" {
		return "", errors.New("services/kafka-up.sh classpath printed nothing")
	}
	kafkaCP.cp = cp
	return cp, nil
}

func (n *KafkaNode) conf() string { return filepath.Join(n.dir, "server.properties") }

// Addr is the broker's bootstrap address, 127.0.0.1:port.
func (n *KafkaNode) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port)) }

// start runs the broker's JVM and waits until it answers; it returns how long that took.
func (n *KafkaNode) start() (time.Duration, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc != nil {
		return 0, fmt.Errorf("the Kafka broker on %s is running already", n.Addr())
	}
	began := time.Now()
	out, err := os.OpenFile(filepath.Join(n.dir, "server.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(n.java[0], append(n.java[1:], "kafka.Kafka", n.conf())...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = n.dir, out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		out.Close()
		return 0, fmt.Errorf("start the Kafka broker's JVM: %w", err)
	}
	p := &kafkaProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	n.proc = p
	deadline := time.Now().Add(kafkaStartTimeout)
	for !listening(n.port) {
		if p.exited() {
			return 0, fmt.Errorf("the Kafka broker on %s exited while starting (%v):\n%s", n.Addr(), cmd.ProcessState, n.logs())
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the Kafka broker did not listen on %s within %v:\n%s", n.Addr(), kafkaStartTimeout, n.logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := kafkaAnswers(ctx, []string{n.Addr()}); err != nil {
		return 0, fmt.Errorf("the Kafka broker on %s does not answer: %v\n%s", n.Addr(), err, n.logs())
	}
	return time.Since(began), nil
}

// KafkaKill is what KafkaNode.Kill did.
type KafkaKill struct {
	PID int       // the JVM that was killed
	At  time.Time // when SIGKILL was sent
	// Dead is how long after the signal the JVM was gone (reaped) and the client port
	// refused connections.
	Dead time.Duration
}

// Kill SIGKILLs the broker's JVM, the real fault (no controlled shutdown, nothing flushed
// but what the broker had written already; what it wrote is in the operating system's
// page cache, as after a JVM crash), and returns once the JVM is gone and the client port
// refuses connections; it logs how long that took.
func (n *KafkaNode) Kill(t testing.TB) KafkaKill {
	t.Helper()
	k, err := n.KillJVM()
	if err != nil {
		t.Fatalf("Kill: %v", err)
	}
	t.Logf("private Kafka broker on %s killed (SIGKILL to its JVM, pid %d); dead and its port closed %v later", n.Addr(), k.PID, k.Dead.Round(time.Millisecond))
	return k
}

// Restart starts the killed broker again, on the same data directory and ports, and
// returns once it answers, with how long that took; it logs it too. The records the
// broker acknowledged and the groups' committed offsets are there again.
func (n *KafkaNode) Restart(t testing.TB) time.Duration {
	t.Helper()
	d, err := n.StartAgain()
	if err != nil {
		t.Fatalf("Restart: %v", err)
	}
	t.Logf("private Kafka broker on %s restarted in %v", n.Addr(), d.Round(time.Millisecond))
	return d
}

// KillJVM SIGKILLs the broker's JVM as Kill does, for a harness outside tests.
func (n *KafkaNode) KillJVM() (KafkaKill, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.proc
	if p == nil || p.exited() {
		return KafkaKill{}, fmt.Errorf("the Kafka broker on %s is not running", n.Addr())
	}
	k := KafkaKill{PID: p.cmd.Process.Pid, At: time.Now()}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return k, fmt.Errorf("SIGKILL the Kafka broker's JVM (pid %d): %w", k.PID, err)
	}
	for deadline := time.Now().Add(20 * time.Second); !p.exited() || listening(n.port); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return k, fmt.Errorf("the Kafka broker's JVM (pid %d) still alive or port %d still open 20s after SIGKILL", k.PID, n.port)
		}
	}
	n.proc = nil
	k.Dead = time.Since(k.At)
	return k, nil
}

// StartAgain starts the killed broker again as Restart does, for a harness outside tests;
// it returns how long the start took.
func (n *KafkaNode) StartAgain() (time.Duration, error) { return n.start() }

// Stop SIGKILLs the broker's JVM, if it runs, and waits for it to be gone. The directory
// stays: it is the caller's.
func (n *KafkaNode) Stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.proc
	n.proc = nil
	if p == nil || p.exited() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
	}
}

// logs is the end of the broker's output, for a failure message.
func (n *KafkaNode) logs() string {
	raw, err := os.ReadFile(filepath.Join(n.dir, "server.out"))
	if err != nil {
		return ""
	}
	if len(raw) > 3000 {
		raw = raw[len(raw)-3000:]
	}
	return fmt.Sprintf("--- server.out (end) ---\n%s\n", raw)
}
