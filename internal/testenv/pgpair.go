package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgreSQL ports of the pair StartPGPair starts: its own, apart from the main cluster
// (5432) and the lanes' (5433-5435).
const (
	PGPairPrimaryPort = 5437
	PGPairStandbyPort = 5438
)

// The pair's ledger database, its owner (password = name, as services/pg-up.sh makes
// them), and the standby's name in synchronous_standby_names.
const (
	pgPairDB      = "extworker"
	pgPairOwner   = "extworker"
	pgPairRepl    = "extworker_replicator"
	pgPairStandby = "standby1"
)

// pgStartTimeout bounds a start, a base backup or a promotion (a second or two on an
// idle machine; far more under a loaded -race suite).
const pgStartTimeout = 2 * time.Minute

// PGPair is a PostgreSQL primary (127.0.0.1:5437) with a streaming-replication standby
// (127.0.0.1:5438) of the test's own, for failover tests: the primary may be SIGKILLed
// (KillPrimary) and the standby promoted (Promote). Both are clusters of their own,
// initdb'd into a temporary directory from the installed PostgreSQL's binaries and run
// as the postgres user when the test runs as root (initdb refuses root), as the test's
// user otherwise. The standby replicates through a proxy of the test's own, so that a
// test can make it lag (PauseReplication). The shared cluster (DBURL) is never touched.
// The ports are fixed: one pair at a time on a machine (a lock file serializes test
// processes).
type PGPair struct {
	t    testing.TB
	bin  string // the PostgreSQL binaries
	dir  string // data directories, logs and the unix sockets
	sync bool
	cred *syscall.Credential // nil: run as this process's user

	// proxy carries the standby's replication connection to the primary, so that a test
	// can hold the WAL back (PauseReplication): replication lag on demand.
	proxy *replProxy

	mu                 sync.Mutex
	primaryUp, standUp bool
}

// StartPGPair initdb's a primary (wal_level replica, a replication role and pg_hba
// entry for 127.0.0.1, synchronous_standby_names naming the standby when sync), creates
// the ledger's database and roles as services/pg-up.sh does (owner extworker, password
// extworker; roles extworker_worker and extworker_operator, which `extworker migrate`
// grants to), takes a standby with pg_basebackup -R, starts it, and returns once the
// primary's pg_stat_replication shows it streaming (and, when sync, as the synchronous
// standby). The ledger is not migrated: the test does that through URL. At cleanup both
// servers are stopped (SIGKILL where a stop does not do) and the directory removed.
// Without PostgreSQL's binaries the test fails in CI and is skipped elsewhere.
func StartPGPair(t testing.TB, sync bool) *PGPair {
	t.Helper()
	needServices(t, "a private PostgreSQL primary and standby")
	bin, err := pgBinDir()
	if err != nil {
		unavailable(t, "PostgreSQL's binaries (initdb, pg_ctl, pg_basebackup; the postgresql package, `make up` installs it)", err)
	}
	p := &PGPair{t: t, bin: bin, sync: sync}
	// The ports are fixed, and go test runs packages side by side: one pair at a time.
	unlock, err := lockPGPair(t)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unlock) // after stop, which is registered later and runs first
	if os.Geteuid() == 0 {
		if p.cred, err = postgresCredential(); err != nil {
			unavailable(t, "the postgres user (initdb refuses to run as root)", err)
		}
	}
	p.dir, err = os.MkdirTemp("", "extworker-pgpair-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.stop)
	if p.cred != nil {
		if err := os.Chown(p.dir, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	began := time.Now()
	if err := p.start(); err != nil {
		t.Fatalf("PostgreSQL pair: %v\n%s", err, p.Logs())
	}
	mode := "asynchronous"
	if sync {
		mode = "synchronous"
	}
	t.Logf("private PostgreSQL pair (%s replication): primary 127.0.0.1:%d, standby 127.0.0.1:%d streaming, in %v",
		mode, PGPairPrimaryPort, PGPairStandbyPort, time.Since(began).Round(time.Millisecond))
	return p
}

// pgPairLockWait bounds the wait for another test's pair to be done.
const pgPairLockWait = 10 * time.Minute

// lockPGPair takes an exclusive lock (flock) on a file in the temporary directory,
// which every test process starting a pair takes first, and returns its release.
func lockPGPair(t testing.TB) (func(), error) {
	path := filepath.Join(os.TempDir(), "extworker-pgpair.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL pair lock %s: %w", path, err)
	}
	began, logged := time.Now(), false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if err != syscall.EWOULDBLOCK || time.Since(began) > pgPairLockWait {
			_ = f.Close()
			return nil, fmt.Errorf("PostgreSQL pair lock %s (ports %d and %d) not taken within %v: %w", path, PGPairPrimaryPort, PGPairStandbyPort, pgPairLockWait, err)
		}
		if !logged {
			t.Logf("waiting for another test's PostgreSQL pair (lock %s)", path)
			logged = true
		}
		if err := pgWait(context.Background()); err != nil {
			_ = f.Close()
			return nil, err
		}
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	}, nil
}

// pgBinDir is the newest installed PostgreSQL's bin directory (Debian's layout), or the
// directory of initdb on PATH.
func pgBinDir() (string, error) {
	vs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(vs, func(i, j int) bool { return pgMajor(vs[i]) < pgMajor(vs[j]) })
	if len(vs) > 0 {
		return filepath.Dir(vs[len(vs)-1]), nil
	}
	p, err := exec.LookPath("initdb")
	if err != nil {
		return "", err
	}
	return filepath.Dir(p), nil
}

func pgMajor(initdb string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return n
}

func postgresCredential() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, err
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func (p *PGPair) primaryDir() string { return filepath.Join(p.dir, "primary") }
func (p *PGPair) standbyDir() string { return filepath.Join(p.dir, "standby") }

// run runs one of PostgreSQL's programs as the servers' user, returning its output in
// the error.
func (p *PGPair) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(p.bin, name), args...)
	cmd.Dir = p.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGPASSWORD="+pgPairRepl)
	if p.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// appendConf appends lines to a data directory's postgresql.conf (later settings win).
func appendConf(dataDir string, lines ...string) error {
	f, err := os.OpenFile(filepath.Join(dataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString("\n# StartPGPair\n" + strings.Join(lines, "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (p *PGPair) start() (err error) {
	ctx, cancel := context.WithTimeout(context.Background(), pgStartTimeout)
	defer cancel()
	// Local (unix socket) connections are trusted, for the setup as the superuser; TCP
	// ones need a password, the replication connection included (initdb's pg_hba.conf
	// lets replication in from 127.0.0.1 with the host method).
	if err := p.run(ctx, "initdb", "-D", p.primaryDir(), "-U", "postgres", "--auth-local=trust", "--auth-host=scram-sha-256",
		"--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
		return err
	}
	// fsync off: the tests SIGKILL PostgreSQL's processes, never the machine, and the page
	// cache survives a process's death; it spares a shared CI machine's disk.
	if err := appendConf(p.primaryDir(), "listen_addresses = '127.0.0.1'", fmt.Sprintf("port = %d", PGPairPrimaryPort),
		"unix_socket_directories = '"+p.dir+"'", "wal_level = replica", "max_wal_senders = 5", "wal_keep_size = '256MB'",
		"hot_standby = on", "max_connections = 100", "shared_buffers = '32MB'", "fsync = off",
		"synchronous_commit = on", "logging_collector = off"); err != nil {
		return err
	}
	if err := p.pgctl(ctx, p.primaryDir(), "primary.log", "start"); err != nil {
		return err
	}
	p.mu.Lock()
	p.primaryUp = true
	p.mu.Unlock()
	if err := p.setup(ctx); err != nil {
		return err
	}
	if err := p.run(ctx, "pg_basebackup", "-D", p.standbyDir(), "-R", "-X", "stream", "--no-sync", "-c", "fast",
		"-d", fmt.Sprintf("host=127.0.0.1 port=%d user=%s application_name=%s", PGPairPrimaryPort, pgPairRepl, pgPairStandby)); err != nil {
		return err
	}
	if p.proxy, err = startReplProxy(fmt.Sprintf("127.0.0.1:%d", PGPairPrimaryPort)); err != nil {
		return err
	}
	// The standby names itself in primary_conninfo (pg_basebackup -R writes one without
	// an application_name in some versions). It names no synchronous standby of its own:
	// promoted, with none left to wait for, it would never acknowledge a commit.
	// wal_retrieve_retry_interval (5s by default) is how long the standby waits between
	// attempts to reach the primary; a promotion requested during that wait can wait for
	// it too. 1s keeps the measured outage the test's own.
	if err := appendConf(p.standbyDir(), fmt.Sprintf("port = %d", PGPairStandbyPort), "synchronous_standby_names = ''",
		"wal_retrieve_retry_interval = '1s'",
		fmt.Sprintf("primary_conninfo = 'host=127.0.0.1 port=%d user=%s password=%s application_name=%s'",
			p.proxy.port(), pgPairRepl, pgPairRepl, pgPairStandby)); err != nil {
		return err
	}
	// postgresql.auto.conf (pg_basebackup -R) is read after postgresql.conf: drop its
	// primary_conninfo so that the one above, with the application_name, is used.
	if err := dropAutoConninfo(p.standbyDir()); err != nil {
		return err
	}
	if err := p.pgctl(ctx, p.standbyDir(), "standby.log", "start"); err != nil {
		return err
	}
	p.mu.Lock()
	p.standUp = true
	p.mu.Unlock()
	if err := p.waitStreaming(ctx, false); err != nil {
		return err
	}
	if !p.sync {
		return nil
	}
	// Named only now: until the standby streams, every commit on the primary (the setup's
	// too) would wait for it.
	c, err := p.superuser(ctx, PGPairPrimaryPort, "postgres")
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '"+pgPairStandby+"'"); err != nil {
		return err
	}
	if _, err := c.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return err
	}
	return p.waitStreaming(ctx, true)
}

func dropAutoConninfo(dataDir string) error {
	path := filepath.Join(dataDir, "postgresql.auto.conf")
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "primary_conninfo") {
			keep = append(keep, l)
		}
	}
	return os.WriteFile(path, []byte(strings.Join(keep, "\n")), 0o600)
}

// pgctl runs pg_ctl action on a data directory, waiting for it, with the server's log
// in the pair's directory.
func (p *PGPair) pgctl(ctx context.Context, dataDir, log, action string, extra ...string) error {
	args := append([]string{"-D", dataDir, "-l", filepath.Join(p.dir, log), "-w", "-t", strconv.Itoa(int(pgStartTimeout.Seconds()))}, extra...)
	return p.run(ctx, "pg_ctl", append(args, action)...)
}

// superuser connects to one of the pair's servers as postgres over its unix socket.
func (p *PGPair) superuser(ctx context.Context, port int, db string) (*pgx.Conn, error) {
	return pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=%s", p.dir, port, db))
}

// setup creates the replication role, the ledger's owner and database, and the ledger's
// roles, as services/pg-up.sh does on the shared cluster.
func (p *PGPair) setup(ctx context.Context) error {
	c, err := p.superuser(ctx, PGPairPrimaryPort, "postgres")
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	for _, q := range []string{
		fmt.Sprintf("CREATE ROLE %s LOGIN REPLICATION PASSWORD '%s'", pgPairRepl, pgPairRepl),
		fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", pgPairOwner, pgPairOwner),
		fmt.Sprintf("CREATE DATABASE %s OWNER %s", pgPairDB, pgPairOwner),
		"CREATE ROLE extworker_worker NOLOGIN",
		"CREATE ROLE extworker_operator NOLOGIN",
		fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s' IN ROLE extworker_worker", WorkerLogin, WorkerLogin),
	} {
		if _, err := c.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// waitStreaming waits until the primary's pg_stat_replication shows the standby
// streaming, as the synchronous standby when sync.
func (p *PGPair) waitStreaming(ctx context.Context, sync bool) error {
	var last string
	for {
		state, syncState, err := p.replication(ctx)
		switch {
		case err != nil:
			last = err.Error()
		case state == "streaming" && (!sync || syncState == "sync"):
			return nil
		default:
			last = fmt.Sprintf("state %q, sync_state %q", state, syncState)
		}
		if err := pgWait(ctx); err != nil {
			return fmt.Errorf("the standby did not stream from the primary: %s", last)
		}
	}
}

// replication is the standby's row in the primary's pg_stat_replication ("" when there
// is none).
func (p *PGPair) replication(ctx context.Context) (state, syncState string, err error) {
	c, err := p.superuser(ctx, PGPairPrimaryPort, "postgres")
	if err != nil {
		return "", "", err
	}
	defer c.Close(context.Background())
	err = c.QueryRow(ctx, `SELECT coalesce(max(state), ''), coalesce(max(sync_state), '') FROM pg_stat_replication WHERE application_name = $1`,
		pgPairStandby).Scan(&state, &syncState)
	return state, syncState, err
}

func pgWait(ctx context.Context) error {
	t := time.NewTimer(50 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// URL is the ledger's multi-host URL, as its owner: pgx tries the primary, then the
// standby, and takes the first that accepts writes (target_session_attrs=read-write), so
// after a promotion new connections reach the new primary with no change of
// configuration.
func (p *PGPair) URL() string { return p.URLAs(pgPairOwner) }

// URLAs is URL as login (one whose password is its name: the owner, or WorkerLogin).
func (p *PGPair) URLAs(login string) string {
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d,127.0.0.1:%d/%s?target_session_attrs=read-write",
		login, login, PGPairPrimaryPort, PGPairStandbyPort, pgPairDB)
}

// PrimaryURL and StandbyURL reach one server each, as the owner (no target_session_attrs:
// the standby answers reads while it is one).
func (p *PGPair) PrimaryURL() string { return p.hostURL(PGPairPrimaryPort) }

// StandbyURL: see PrimaryURL.
func (p *PGPair) StandbyURL() string { return p.hostURL(PGPairStandbyPort) }

func (p *PGPair) hostURL(port int) string {
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s", pgPairOwner, pgPairOwner, port, pgPairDB)
}

// Replication is the standby's state and sync_state in the primary's pg_stat_replication.
func (p *PGPair) Replication(ctx context.Context) (state, syncState string, err error) {
	return p.replication(ctx)
}

// KillPrimary SIGKILLs the primary's postmaster (its pid from postmaster.pid) and every
// process of it, as a crash of the server would: no checkpoint, no goodbye to the
// clients or the standby. It returns when the kill was sent; the primary stays down.
func (p *PGPair) KillPrimary() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.primaryUp {
		p.t.Fatal("KillPrimary: the primary is not running")
	}
	pid, err := postmasterPID(p.primaryDir())
	if err != nil {
		p.t.Fatalf("KillPrimary: %v", err)
	}
	children := childPIDs(pid)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		p.t.Fatalf("KillPrimary: SIGKILL %d: %v", pid, err)
	}
	for _, c := range children {
		_ = syscall.Kill(c, syscall.SIGKILL)
	}
	p.primaryUp = false
	// What the proxy held back dies with the primary, as it would in the primary's
	// socket buffers: the standby never receives it.
	p.proxy.dropAll()
}

// postmasterPID reads the first line of a data directory's postmaster.pid.
func postmasterPID(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}

// childPIDs lists the processes whose parent is pid (/proc).
func childPIDs(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after its ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, n)
		}
	}
	return out
}

// Promote promotes the standby (pg_ctl promote, waiting for it) and returns once it
// accepts writes: a read-write session to it sees transaction_read_only off. It returns
// how long that took.
func (p *PGPair) Promote() time.Duration {
	p.t.Helper()
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), pgStartTimeout)
	defer cancel()
	if err := p.pgctl(ctx, p.standbyDir(), "standby.log", "promote"); err != nil {
		p.t.Fatalf("Promote: %v\n%s", err, p.Logs())
	}
	var last error
	for {
		c, err := p.superuser(ctx, PGPairStandbyPort, pgPairDB)
		if err == nil {
			var ro string
			err = c.QueryRow(ctx, "SHOW transaction_read_only").Scan(&ro)
			_ = c.Close(context.Background())
			if err == nil && ro == "off" {
				break
			}
			if err == nil {
				err = fmt.Errorf("transaction_read_only %s", ro)
			}
		}
		last = err
		if pgWait(ctx) != nil {
			p.t.Fatalf("Promote: the standby does not accept writes: %v\n%s", last, p.Logs())
		}
	}
	return time.Since(began)
}

// Logs returns the tails of both servers' logs, for a failing test's message.
func (p *PGPair) Logs() string {
	var b strings.Builder
	for _, name := range []string{"primary.log", "standby.log"} {
		data, err := os.ReadFile(filepath.Join(p.dir, name))
		if err != nil {
			continue
		}
		if len(data) > 4000 {
			data = data[len(data)-4000:]
		}
		fmt.Fprintf(&b, "--- %s (tail) ---\n%s\n", name, data)
	}
	return b.String()
}

// stop stops whatever runs (immediate shutdown; SIGKILL where that fails) and removes
// the directory.
func (p *PGPair) stop() {
	p.mu.Lock()
	up := map[string]bool{p.primaryDir(): p.primaryUp, p.standbyDir(): p.standUp}
	p.primaryUp, p.standUp = false, false
	p.mu.Unlock()
	if p.t.Failed() {
		p.t.Logf("PostgreSQL pair logs:\n%s", p.Logs())
	}
	for dataDir, running := range up {
		if !running {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := p.run(ctx, "pg_ctl", "-D", dataDir, "-m", "immediate", "-w", "stop")
		cancel()
		if err != nil {
			if pid, perr := postmasterPID(dataDir); perr == nil {
				children := childPIDs(pid)
				_ = syscall.Kill(pid, syscall.SIGKILL)
				for _, c := range children {
					_ = syscall.Kill(c, syscall.SIGKILL)
				}
			}
		}
	}
	if p.proxy != nil {
		p.proxy.close()
	}
	if err := os.RemoveAll(p.dir); err != nil {
		p.t.Logf("cleanup: remove %s: %v", p.dir, err)
	}
}

// PauseReplication holds back the WAL the primary streams to the standby from now on
// (the standby's connection stays open, and it keeps acknowledging what it has): the
// standby lags behind. With asynchronous replication the primary keeps committing; with
// synchronous replication its commits wait for the standby. KillPrimary drops what was
// held back: the standby never receives it.
func (p *PGPair) PauseReplication() { p.proxy.pause(true) }

// ResumeReplication lets the held-back WAL through.
func (p *PGPair) ResumeReplication() { p.proxy.pause(false) }

// replProxy is a TCP proxy to the primary for the standby's replication connection,
// whose primary-to-standby direction can be paused.
type replProxy struct {
	ln       net.Listener
	upstream string

	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	gen    int // incremented by dropAll: connections of an older generation stop
	conns  map[net.Conn]bool
	closed bool
}

func startReplProxy(upstream string) (*replProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &replProxy{ln: ln, upstream: upstream, conns: map[net.Conn]bool{}}
	r.cond = sync.NewCond(&r.mu)
	go r.accept()
	return r, nil
}

func (r *replProxy) port() int { return r.ln.Addr().(*net.TCPAddr).Port }

func (r *replProxy) accept() {
	for {
		down, err := r.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.DialTimeout("tcp", r.upstream, 5*time.Second)
		if err != nil {
			_ = down.Close()
			continue
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			_ = down.Close()
			_ = up.Close()
			return
		}
		gen := r.gen
		r.conns[down], r.conns[up] = true, true
		r.mu.Unlock()
		go r.pipe(up, down, gen, true)
		go r.pipe(down, up, gen, false)
	}
}

// pipe copies from src to dst; gated (primary to standby) waits while paused.
func (r *replProxy) pipe(src, dst net.Conn, gen int, gated bool) {
	defer r.forget(src, dst)
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && gated {
			r.mu.Lock()
			for r.paused && r.gen == gen && !r.closed {
				r.cond.Wait()
			}
			stale := r.gen != gen || r.closed
			r.mu.Unlock()
			if stale {
				return
			}
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (r *replProxy) forget(a, b net.Conn) {
	_ = a.Close()
	_ = b.Close()
	r.mu.Lock()
	delete(r.conns, a)
	delete(r.conns, b)
	r.mu.Unlock()
}

func (r *replProxy) pause(on bool) {
	r.mu.Lock()
	r.paused = on
	r.mu.Unlock()
	r.cond.Broadcast()
}

// dropAll closes every connection, discarding what was held back, and unpauses for the
// connections to come.
func (r *replProxy) dropAll() {
	r.mu.Lock()
	r.gen++
	r.paused = false
	conns := r.conns
	r.conns = map[net.Conn]bool{}
	r.mu.Unlock()
	r.cond.Broadcast()
	for c := range conns {
		_ = c.Close()
	}
}

func (r *replProxy) close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	_ = r.ln.Close()
	r.dropAll()
}
