// Package testenv connects tests to the real engine and PostgreSQL that `make up` starts,
// and gives them isolated process models to work on.
//
// Where the engine or the database cannot be reached, a test fails when CI=true and is
// skipped otherwise, with the command that would bring them up. Each test deploys its own
// process with a unique key and topic, so tests run in parallel on one shared engine.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
)

// Defaults match services/engine-up.sh and services/pg-up.sh.
const (
	DefaultEngineURL   = "http://127.0.0.1:8080/engine-rest"
	DefaultEngineDBURL = "postgres://camunda:camunda@127.0.0.1:5432/camunda"
	DefaultDBURL       = "postgres://extworker:extworker@127.0.0.1:5432/extworker"
)

// EngineURL is EXTWORKER_TEST_ENGINE_URL or the local engine.
func EngineURL() string { return env("EXTWORKER_TEST_ENGINE_URL", DefaultEngineURL) }

// EngineDBURL is the engine's own database (EXTWORKER_TEST_ENGINE_DB_URL).
func EngineDBURL() string { return env("EXTWORKER_TEST_ENGINE_DB_URL", DefaultEngineDBURL) }

// DBURL is the worker's database (EXTWORKER_TEST_DB_URL).
func DBURL() string { return env("EXTWORKER_TEST_DB_URL", DefaultDBURL) }

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// InCI reports whether CI=true: then a missing engine or database fails the test.
func InCI() bool { return os.Getenv("CI") == "true" }

// NoServices reports whether EXTWORKER_TEST_SERVICES=none, which `make check` sets: the
// helpers that reach a service (an engine, PostgreSQL, the broker, a RabbitMQ node or a
// Jaeger of the test's own) then skip the test at once, with no connection attempt.
func NoServices() bool { return os.Getenv("EXTWORKER_TEST_SERVICES") == "none" }

// needServices skips the test at once when NoServices; with CI=true it fails it instead,
// as a missing service does there: CI runs every test against its services.
func needServices(t testing.TB, what string) {
	t.Helper()
	if !NoServices() {
		return
	}
	msg := what + " not reached: EXTWORKER_TEST_SERVICES=none (make check); make test runs it against the services"
	if InCI() {
		t.Fatal(msg + " (CI=true: unset EXTWORKER_TEST_SERVICES)")
	}
	t.Skip(msg)
}

// unavailable fails the test in CI and skips it elsewhere.
func unavailable(t testing.TB, what string, err error) {
	t.Helper()
	msg := fmt.Sprintf("%s unreachable: %v (run `make up`)", what, err)
	if InCI() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// DefaultQuietEngineURL is the fourth engine `make up` starts (port 8083, database
// camunda_quiet): only the conformance tests that time when a pending long poll is handed
// a task use it, one at a time. Any request from any other client (a new task, an unlock,
// a new long poll) wakes an engine's long-poll handler and would hand the task over early.
const DefaultQuietEngineURL = "http://127.0.0.1:8083/engine-rest"

// QuietEngineURL is EXTWORKER_TEST_QUIET_ENGINE_URL or the local quiet engine.
func QuietEngineURL() string { return env("EXTWORKER_TEST_QUIET_ENGINE_URL", DefaultQuietEngineURL) }

// QuietEngine returns a client for the quiet engine after checking it answers; like
// Engine, it fails in CI and skips elsewhere when that engine is not there.
func QuietEngine(t testing.TB) *admin.Client {
	t.Helper()
	return engine(t, "quiet engine (make up starts it on port 8083)", camunda7.Config{BaseURL: QuietEngineURL()})
}

// Engine returns a client for the engine under test, after checking it answers.
func Engine(t testing.TB) *admin.Client {
	t.Helper()
	return engine(t, "engine", camunda7.Config{BaseURL: EngineURL()})
}

// engine returns a client for cfg after checking the engine answers; what names it in
// the failure or skip.
func engine(t testing.TB, what string, cfg camunda7.Config) *admin.Client {
	t.Helper()
	needServices(t, what+" at "+cfg.BaseURL)
	c, err := camunda7.New(cfg)
	if err != nil {
		t.Fatalf("engine client: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Version(ctx); err != nil {
		unavailable(t, what+" at "+cfg.BaseURL, err)
	}
	return admin.New(c)
}

// pool opens a pgx pool after checking the database answers; closed at cleanup.
func pool(t testing.TB, what, url string) *pgxpool.Pool {
	t.Helper()
	needServices(t, what)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := pgxpool.New(ctx, url)
	if err == nil {
		err = p.Ping(ctx)
	}
	if err != nil {
		if p != nil {
			p.Close()
		}
		unavailable(t, what, err)
	}
	t.Cleanup(p.Close)
	return p
}

// EngineDB returns a pool on the engine's own PostgreSQL database, to check what the
// engine stored.
func EngineDB(t testing.TB) *pgxpool.Pool { return pool(t, "engine database", EngineDBURL()) }

// DB returns a pool on the worker's PostgreSQL database.
func DB(t testing.TB) *pgxpool.Pool { return pool(t, "worker database", DBURL()) }

// Unique returns prefix plus a random suffix, for process keys, topics and worker ids
// that no other test (or earlier run against the same engine) uses.
func Unique(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// Context returns a context that ends with the test or after d.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Eventually polls cond every interval until it returns true or the deadline passes,
// then fails the test with what. It waits on a condition; it does not paper over a race.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond()
		if ok {
			return
		}
		lastErr = err
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s (last error: %v)", timeout, what, lastErr)
		}
		<-tick.C
	}
}

// Model is a process deployed for one test: one external task with a boundary error
// event for errorCode BUSINESS_ERROR, then a message catch ("go-<key>") before the end.
//
//	start -> task(topic) -> waitMsg -> endOk
//	             \-(BUSINESS_ERROR)-> endError
type Model struct {
	Key          string // process definition key
	Topic        string // the external task's topic
	ActivityID   string // "task"
	MessageName  string
	DeploymentID string
	DefinitionID string
}

// ModelOptions tweak the deployed model.
type ModelOptions struct {
	// NoMessageWait goes from the task straight to the end event.
	NoMessageWait bool
	// ExtensionProperties are camunda:properties on the external task.
	ExtensionProperties map[string]string
	// Priority is camunda:taskPriority.
	Priority int
	// VersionTag is camunda:versionTag on the process.
	VersionTag string
}

// Deploy deploys a fresh model and deletes it (cascading to its instances) at cleanup.
func Deploy(t testing.TB, c *admin.Client, opts ModelOptions) Model {
	t.Helper()
	m := Model{Key: Unique("p"), Topic: Unique("topic"), ActivityID: "task"}
	m.MessageName = "go-" + m.Key
	ctx := Context(t, 30*time.Second)
	res, err := c.Deploy(ctx, admin.Deployment{
		Name:      m.Key,
		Resources: []admin.Resource{{Name: m.Key + ".bpmn", Content: []byte(BPMN(m, opts))}},
	})
	if err != nil {
		t.Fatalf("deploy %s: %v", m.Key, err)
	}
	m.DeploymentID = res.ID
	for id := range res.DeployedProcessDefinitions {
		m.DefinitionID = id
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.DeleteDeployment(ctx, m.DeploymentID, true); err != nil {
			t.Logf("cleanup: delete deployment %s: %v", m.DeploymentID, err)
		}
	})
	return m
}

// BPMN renders the model's XML.
func BPMN(m Model, o ModelOptions) string {
	var props strings.Builder
	if len(o.ExtensionProperties) > 0 {
		props.WriteString("<bpmn:extensionElements><camunda:properties>")
		for k, v := range o.ExtensionProperties {
			fmt.Fprintf(&props, `<camunda:property name=%q value=%q/>`, k, v)
		}
		props.WriteString("</camunda:properties></bpmn:extensionElements>")
	}
	versionTag := ""
	if o.VersionTag != "" {
		versionTag = fmt.Sprintf(` camunda:versionTag=%q`, o.VersionTag)
	}
	after := `<bpmn:sequenceFlow id="f2" sourceRef="task" targetRef="waitMsg"/>
    <bpmn:intermediateCatchEvent id="waitMsg"><bpmn:messageEventDefinition messageRef="Msg_Go"/></bpmn:intermediateCatchEvent>
    <bpmn:sequenceFlow id="f3" sourceRef="waitMsg" targetRef="endOk"/>`
	if o.NoMessageWait {
		after = `<bpmn:sequenceFlow id="f2" sourceRef="task" targetRef="endOk"/>`
	}
	return fmt.Sprintf(`<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
                  xmlns:camunda="http://camunda.org/schema/1.0/bpmn"
                  id="defs" targetNamespace="http://extworker.dev/test">
  <bpmn:error id="BusinessError" name="BusinessError" errorCode="BUSINESS_ERROR"/>
  <bpmn:message id="Msg_Go" name=%q/>
  <bpmn:process id=%q isExecutable="true" camunda:historyTimeToLive="P1D"%s>
    <bpmn:startEvent id="start"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="task"/>
    <bpmn:serviceTask id="task" name="Work" camunda:type="external" camunda:topic=%q camunda:taskPriority="%d">%s</bpmn:serviceTask>
    %s
    <bpmn:endEvent id="endOk"/>
    <bpmn:boundaryEvent id="onBusinessError" attachedToRef="task" cancelActivity="true">
      <bpmn:errorEventDefinition errorRef="BusinessError"/>
    </bpmn:boundaryEvent>
    <bpmn:sequenceFlow id="f4" sourceRef="onBusinessError" targetRef="endError"/>
    <bpmn:endEvent id="endError"/>
  </bpmn:process>
</bpmn:definitions>`, m.MessageName, m.Key, versionTag, m.Topic, o.Priority, props.String(), after)
}

// Logins services/pg-up.sh creates beside the database owner: a member of the ledger's
// worker role, two members of its operator role (the two-person rule's two people), and
// the operator console's, a member of extworker_console (itself an operator role), which
// serves every operator the console authenticates. Each one's password is its name.
const (
	WorkerLogin  = "extworker_app"
	AliceLogin   = "extworker_alice"
	BobLogin     = "extworker_bob"
	ConsoleLogin = "extworker_console_app"
	// StrangerLogin is in no role: it may do what PUBLIC may.
	StrangerLogin = "extworker_stranger"
	// TenantBConsoleLogin is a second tenant's console login on the same cluster, in
	// role tenant_b_console (EXTWORKER_DATABASE_ROLE_PREFIX=tenant_b).
	TenantBConsoleLogin = "tenant_b_console_app"
)

// DBURLAs returns DBURL with login (and its password) in place of the owner's. The login
// must be one of the logins above, which `make up` creates.
func DBURLAs(login string) string {
	u := DBURL()
	at := strings.LastIndex(u, "@")
	scheme := strings.Index(u, "://")
	if at < 0 || scheme < 0 {
		return u
	}
	return u[:scheme+3] + login + ":" + login + u[at:]
}

// DBAs returns a pool on the worker's database as login (see DBURLAs), or fails (in CI)
// or skips when the database or the login is not there.
func DBAs(t testing.TB, login string) *pgxpool.Pool {
	t.Helper()
	return pool(t, "worker database as "+login+" (make up creates the login)", DBURLAs(login))
}

// The people the tests' ledgers know (extworker_operators, migrations/00009), one name
// each across the console and the CLI: alice and bob with their own logins, carol on the
// console only.
const (
	Alice = "alice"
	Bob   = "bob"
	Carol = "carol"
)

// RegisterOperators registers Alice, Bob and Carol in the migrated ledger pool (the
// owner's) reaches, as its owner would with `extworker operators add`.
func RegisterOperators(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO extworker_operators (name, db_login) VALUES ($1, $2), ($3, $4), ($5, NULL)
		ON CONFLICT DO NOTHING`, Alice, AliceLogin, Bob, BobLogin, Carol)
	if err != nil {
		t.Fatalf("register the test operators: %v", err)
	}
}
