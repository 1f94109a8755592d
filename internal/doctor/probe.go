package doctor

import (
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/console"
	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/migrations"
)

// Options are what the configuration does not say.
type Options struct {
	// Timeout bounds each probe (one service). Default 5s.
	Timeout time.Duration
	// Queues are the RabbitMQ queues this host's inbox consumers read (their retry and
	// dead-letter companions are checked too).
	Queues []string
}

// Run runs every check against cfg and ops and returns them in a fixed order. The
// engine, the database, the brokers and the addresses are probed concurrently, each
// within opts.Timeout; a probe that fails makes the checks that need it skipped.
func Run(ctx context.Context, cfg daemon.Config, ops daemon.OpsConfig, opts Options) []Check {
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	probe := func(f func(context.Context)) func() {
		return func() {
			pctx, cancel := context.WithTimeout(ctx, opts.Timeout)
			defer cancel()
			f(pctx)
		}
	}
	var (
		eng   engineFacts
		db    []Check
		dbAt  dbClock
		amqpC []Check
		kafka []Check
		cons  []Check
		addrs []Check
		wg    sync.WaitGroup
	)
	wg.Go(probe(func(ctx context.Context) { eng = probeEngine(ctx, cfg) }))
	wg.Go(probe(func(ctx context.Context) { db, dbAt = probeDatabase(ctx, cfg) }))
	wg.Go(probe(func(ctx context.Context) { amqpC = probeAMQP(ctx, cfg, opts.Queues) }))
	wg.Go(probe(func(ctx context.Context) { kafka = probeKafka(ctx, cfg) }))
	wg.Go(probe(func(ctx context.Context) { cons = probeConsole(ctx, cfg) }))
	wg.Go(func() { addrs = probeAddresses(ctx, cfg, ops) })
	wg.Wait()

	out := eng.checks(cfg)
	out = append(out, db...)
	out = append(out, Clock(ClockFacts{Engine: eng.offset, EngineUnknown: eng.plain.unknown, Database: dbAt.offset, DatabaseUnknown: dbAt.unknown}))
	out = append(out, amqpC...)
	out = append(out, kafka...)
	out = append(out, cons...)
	out = append(out, Relations(cfg)...)
	out = append(out, addrs...)
	// Errors from the services may quote what they were given: no secret of the
	// configuration is printed.
	for i := range out {
		out[i].Found = scrub(&cfg, out[i].Found)
		out[i].Fix = scrub(&cfg, out[i].Fix)
	}
	return out
}

func scrub(cfg *daemon.Config, s string) string {
	if s == "" {
		return s
	}
	return cfg.ScrubError(errors.New(s)).Error()
}

// engineFacts is what the engine answered.
type engineFacts struct {
	where   string
	version string
	err     error          // the version call's
	creds   error          // daemon.CheckClient's verdict on err
	token   error          // the OAuth2 token endpoint's, when the version call was not sent
	offset  *time.Duration // the engine's clock against this host's
	plain   clockAnswer    // the unauthenticated GET /version
}

func probeEngine(ctx context.Context, cfg daemon.Config) engineFacts {
	f := engineFacts{where: daemon.RedactURL(cfg.EngineURL)}
	quiet := slog.New(slog.DiscardHandler)
	client, err := daemon.NewClient(cfg, quiet)
	if err != nil {
		f.err = err
		return f
	}
	defer client.CloseIdleConnections()
	f.version, f.err = client.Version(ctx)
	if f.err != nil {
		f.creds = daemon.CheckClient(ctx, cfg, client, quiet)
	}
	if f.err != nil && unreachable(f.err) && cfg.EngineOAuthTokenURL != "" {
		// Not sent may be the token's fault: ask the token endpoint on its own.
		if tc, err := cfg.EngineTLS(); err == nil {
			_, f.token = daemon.NewOAuthTokenSource(cfg, tc).Token(ctx)
		}
	}
	f.plain = engineClock(ctx, cfg)
	f.offset = f.plain.offset
	return f
}

// unreachable reports whether a call never got an answer.
func unreachable(err error) bool {
	return errors.Is(err, camunda7.ErrNotSent) || errors.Is(err, camunda7.ErrUnknownOutcome)
}

func (f engineFacts) checks(cfg daemon.Config) []Check {
	var refused daemon.ConfigError
	reachable := ok(NameEngineReachable, f.where+" answers")
	engineFix := "check EXTWORKER_ENGINE_URL (scheme, host, port, the path …/engine-rest) and that the engine runs: curl " + f.where + "/version"
	if f.plain.err != nil {
		reachable = fail(NameEngineReachable, f.where+": "+f.plain.err.Error(), engineFix)
	}
	switch {
	case f.err != nil && f.token != nil && !daemon.TokenRejected(f.token):
		// The token endpoint did not give a token: the engine was never asked.
		return []Check{reachable, fail(NameEngineCreds, "no OAuth2 token: "+f.token.Error(),
			"check EXTWORKER_ENGINE_OAUTH_TOKEN_URL (scheme, host, port, path) and that the identity provider runs: the token request failed, not the engine"),
			skipped(NameEngineVersion, NameEngineCreds)}
	case f.err != nil && f.creds != nil && errors.As(f.creds, &refused):
		if f.plain.err != nil && daemon.TokenRejected(f.creds) {
			reachable = Check{Name: NameEngineReachable, Status: Skip, Found: "not known: the token endpoint refused the client"}
		} else {
			reachable = ok(NameEngineReachable, f.where+" answers")
		}
		return []Check{reachable, fail(NameEngineCreds, "refused", f.creds.Error()), skipped(NameEngineVersion, NameEngineCreds)}
	case f.err != nil: // no answer, or not an engine's (a wrong path: 404)
		found := f.where + ": " + f.err.Error()
		return []Check{fail(NameEngineReachable, found, engineFix),
			skipped(NameEngineCreds, NameEngineReachable), skipped(NameEngineVersion, NameEngineReachable)}
	}
	creds := "none configured; the engine asks for none"
	switch {
	case cfg.EngineUser != "":
		creds = "accepted (basic, user " + cfg.EngineUser + ")"
	case cfg.EngineToken != "":
		creds = "accepted (bearer token)"
	case cfg.EngineOAuthTokenURL != "":
		creds = "accepted (OAuth2 client " + cfg.EngineOAuthClientID + ")"
	}
	return []Check{ok(NameEngineReachable, f.where+" answers"), ok(NameEngineCreds, creds), EngineVersion(f.version)}
}

// clockAnswer is what the unauthenticated GET /version gave: the engine's clock against
// this host's, or why it is unknown.
type clockAnswer struct {
	offset  *time.Duration
	err     error  // no answer at all
	unknown string // an answer without a readable Date header
}

// engineClock reads the engine's clock from the Date header of an unauthenticated
// GET /version (any answer carries one), against the middle of the request on this
// host's clock. The header has a resolution of a second: its middle is taken.
func engineClock(ctx context.Context, cfg daemon.Config) clockAnswer {
	tc, err := cfg.EngineTLS()
	if err != nil {
		return clockAnswer{err: err}
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, Proxy: http.ProxyFromEnvironment}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(cfg.EngineURL, "/")+"/version", nil)
	if err != nil {
		return clockAnswer{err: err}
	}
	sent := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return clockAnswer{err: err}
	}
	received := time.Now()
	_ = resp.Body.Close()
	date := resp.Header.Get("Date")
	if date == "" {
		return clockAnswer{unknown: "its answer has no Date header"}
	}
	at, err := http.ParseTime(date)
	if err != nil {
		return clockAnswer{unknown: fmt.Sprintf("its Date header %.40q is not an HTTP date", date)}
	}
	d := at.Add(500 * time.Millisecond).Sub(sent.Add(received.Sub(sent) / 2))
	return clockAnswer{offset: &d}
}

// dbClock is the database's clock against this host's, or why it is unknown although
// the database answered.
type dbClock struct {
	offset  *time.Duration
	unknown string
}

// probeDatabase checks the ledger's database and returns its clock against this host's.
func probeDatabase(ctx context.Context, cfg daemon.Config) ([]Check, dbClock) {
	where := daemon.RedactURL(cfg.DatabaseURL)
	needDB := func(names ...string) []Check {
		var out []Check
		for _, n := range names {
			out = append(out, skipped(n, NameDatabase))
		}
		return out
	}
	dependents := []string{NameMigrated, NameRoles, NameLogin, NameGrants, NamePublicConnect}
	pcfg, err := daemon.DatabaseConfig(cfg.DatabaseURL)
	if err != nil {
		return append([]Check{fail(NameDatabase, where+": "+err.Error(), "correct EXTWORKER_DATABASE_URL")}, needDB(dependents...)...), dbClock{}
	}
	pcfg.MaxConns, pcfg.MinConns = 1, 0
	// A check never writes: every transaction of the doctor's session is read-only, so a
	// statement that would write (goose creating its version table) fails instead.
	pcfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	var out []Check
	if w := daemon.DatabaseTLSWarning(cfg.DatabaseURL, pcfg); w != "" {
		out = append(out, warn(NameDatabaseTLS, w, "set sslmode=verify-full in EXTWORKER_DATABASE_URL (sslrootcert= for a private CA)"))
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err == nil {
		defer pool.Close()
		err = pool.Ping(ctx)
	}
	if err != nil {
		found := where + ": " + err.Error()
		return append(append(out, fail(NameDatabase, found, DatabaseFix(err))), needDB(dependents...)...), dbClock{}
	}
	var dbNow time.Time
	sent := time.Now()
	err = pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&dbNow)
	received := time.Now()
	var offset dbClock
	if err == nil {
		d := dbNow.Sub(sent.Add(received.Sub(sent) / 2))
		offset.offset = &d
	} else {
		offset.unknown = "SELECT clock_timestamp(): " + err.Error()
	}
	out = append([]Check{ok(NameDatabase, where+" answers")}, out...)

	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	mig := migrationFacts(ctx, db)
	out = append(out, Migrated(mig, migrations.Versions()))
	if out[len(out)-1].Status != OK {
		for _, n := range dependents[1:] {
			out = append(out, skipped(n, NameMigrated))
		}
		return out, offset
	}
	return append(out, roleChecks(ctx, db, cfg)...), offset
}

// migrationFacts reads the ledger's migrations without writing (migrations.Applied).
func migrationFacts(ctx context.Context, db *sql.DB) MigrationFacts {
	var f MigrationFacts
	if f.Err = db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, migrations.VersionTable).Scan(&f.Table); f.Err != nil || !f.Table {
		return f
	}
	if f.Applied, f.Err = migrations.Applied(ctx, db); f.Err != nil {
		return f
	}
	f.Err = migrations.CheckApplied(f.Applied)
	return f
}

// roleChecks checks the ledger's roles, the login, the worker role's grants and who may
// connect, on a migrated ledger.
func roleChecks(ctx context.Context, db *sql.DB, cfg daemon.Config) []Check {
	roles, err := migrations.ReadRoles(ctx, db)
	if err != nil {
		return []Check{fail(NameRoles, err.Error(), "run `extworker migrate` as the ledger's owner"),
			skipped(NameLogin, NameRoles), skipped(NameGrants, NameRoles), publicCheck(ctx, db, roles)}
	}
	facts := RoleFacts{Ledger: roles, Configured: migrations.RolesFor(cfg.DatabaseRolePrefix), Exists: map[string]bool{}, Console: cfg.ConsoleAddr != ""}
	for _, r := range []string{roles.Worker, roles.Operator, roles.Console} {
		var exists bool
		if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1)`, r).Scan(&exists); err != nil {
			return []Check{fail(NameRoles, err.Error(), "check that the login may read pg_roles"),
				skipped(NameLogin, NameRoles), skipped(NameGrants, NameRoles), publicCheck(ctx, db, roles)}
		}
		facts.Exists[r] = exists
	}
	out := []Check{Roles(facts)}
	if !facts.Exists[roles.Worker] {
		return append(out, skipped(NameLogin, roles.Worker), skipped(NameGrants, roles.Worker), publicCheck(ctx, db, roles))
	}
	login := LoginFacts{WorkerRole: roles.Worker}
	err = db.QueryRowContext(ctx, `SELECT current_user, pg_has_role(current_user, $1, 'MEMBER'),
			EXISTS (SELECT FROM pg_class WHERE oid = to_regclass('extworker_intents') AND pg_has_role(current_user, relowner, 'USAGE'))`,
		roles.Worker).Scan(&login.Login, &login.Member, &login.Owner)
	if err != nil {
		out = append(out, fail(NameLogin, err.Error(), "check EXTWORKER_DATABASE_URL's user"))
	} else {
		out = append(out, Login(login))
	}
	out = append(out, grantsCheck(ctx, db, roles.Worker))
	return append(out, publicCheck(ctx, db, roles))
}

// grantsCheck asks, in one statement, which of WorkerGrants the worker's role holds.
func grantsCheck(ctx context.Context, db *sql.DB, role string) Check {
	objects, privs := make([]string, len(WorkerGrants)), make([]string, len(WorkerGrants))
	for i, g := range WorkerGrants {
		objects[i], privs[i] = g.Object, g.Privilege
	}
	rows, err := db.QueryContext(ctx, `SELECT o, p, CASE WHEN p = 'EXECUTE' THEN has_function_privilege($1, o, p)
			ELSE has_table_privilege($1, o, p) END
		FROM unnest($2::text[], $3::text[]) AS g(o, p)`, role, objects, privs)
	if err != nil {
		return fail(NameGrants, err.Error(), "run `extworker migrate` as the ledger's owner")
	}
	defer rows.Close()
	held := map[Grant]bool{}
	for rows.Next() {
		var g Grant
		var has bool
		if err := rows.Scan(&g.Object, &g.Privilege, &has); err != nil {
			return fail(NameGrants, err.Error(), "run `extworker migrate` as the ledger's owner")
		}
		held[g] = has
	}
	if err := rows.Err(); err != nil {
		return fail(NameGrants, err.Error(), "run `extworker migrate` as the ledger's owner")
	}
	return Grants(role, WorkerGrants, held)
}

func publicCheck(ctx context.Context, db *sql.DB, roles migrations.Roles) Check {
	public, name, err := migrations.PublicCanConnect(ctx, db)
	if err != nil {
		return fail(NamePublicConnect, err.Error(), "check that the login may read pg_database")
	}
	return PublicConnect(name, public, roles)
}

// probeAMQP checks the RabbitMQ broker, when one is configured, and the queues named.
func probeAMQP(ctx context.Context, cfg daemon.Config, queues []string) []Check {
	if cfg.AMQPURL == "" {
		if len(queues) == 0 {
			return nil
		}
		out := []Check{fail(NameAMQP, "EXTWORKER_AMQP_URL is not set, but queues were named", "set EXTWORKER_AMQP_URL to the broker the inbox consumes from")}
		for _, q := range queues {
			out = append(out, skipped(NameQueue(q), "EXTWORKER_AMQP_URL"))
		}
		return out
	}
	where := daemon.RedactURL(cfg.AMQPURL)
	deadline, _ := ctx.Deadline()
	conn, err := amqp.DialConfig(cfg.AMQPURL, amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
		return (&net.Dialer{Deadline: deadline}).DialContext(ctx, network, addr)
	}, TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12}})
	if err != nil {
		out := []Check{fail(NameAMQP, where+": "+err.Error(),
			"check EXTWORKER_AMQP_URL (host, port, user, password, virtual host) and that RabbitMQ runs")}
		for _, q := range queues {
			out = append(out, skipped(NameQueue(q), NameAMQP))
		}
		return out
	}
	defer conn.Close()
	out := []Check{ok(NameAMQP, where+" answers")}
	for _, q := range queues {
		if err := ValidQueue(q); err != nil {
			out = append(out, fail(NameQueue(q), err.Error(), "name the queue as its consumer does (inbox.Config.Queue)"))
			continue
		}
		f := QueueFacts{Queue: q}
		var errs [3]error
		f.Main, errs[0] = queueDepth(conn, q)
		f.Retry, errs[1] = queueDepth(conn, inbox.RetryQueue(q))
		f.Parked, errs[2] = queueDepth(conn, inbox.DeadLetterQueue(q))
		f.Err = errors.Join(errs[:]...)
		out = append(out, Queue(f, inbox.RetryQueue(q), inbox.DeadLetterQueue(q)))
	}
	return out
}

// queueDepth declares q passively on a channel of its own (a queue that does not exist
// closes the channel) and returns its message count; nil and no error when the broker
// says it does not exist (404), an error when it could not tell (access refused, a
// channel it would not open).
func queueDepth(conn *amqp.Connection, q string) (*int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	var ae *amqp.Error
	switch {
	case err == nil:
		return &st.Messages, nil
	case errors.As(err, &ae) && ae.Code == amqp.NotFound:
		return nil, nil
	}
	return nil, err
}

// probeKafka checks the Kafka brokers, when configured.
func probeKafka(ctx context.Context, cfg daemon.Config) []Check {
	if len(cfg.KafkaBrokers) == 0 {
		return nil
	}
	brokers := strings.Join(cfg.KafkaBrokers, ",")
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.KafkaBrokers...)}, cfg.KafkaOptions()...)...)
	if err == nil {
		defer cl.Close()
		err = cl.Ping(ctx)
	}
	if err != nil {
		return []Check{fail(NameKafka, brokers+": "+err.Error(),
			"check EXTWORKER_KAFKA_BROKERS (host:port of each), EXTWORKER_KAFKA_TLS, and that the brokers run")}
	}
	return []Check{ok(NameKafka, brokers+": a broker answers")}
}

// probeConsole checks the operator console, when EXTWORKER_CONSOLE_ADDR turns it on, by
// opening it as `extworker console serve` and a worker do (console.Open: the operators
// file, the trusted proxies, the session key, the allowed hosts, its database login),
// on a read-only session, and asking it what it says of its login.
func probeConsole(ctx context.Context, cfg daemon.Config) []Check {
	if cfg.ConsoleAddr == "" {
		return nil
	}
	c := cfg
	ro, err := readOnlyURL(cfg.ConsoleDatabase())
	if err != nil {
		return []Check{Console(ConsoleFacts{OwnLogin: cfg.ConsoleDatabaseURL != "", Err: err})}
	}
	c.ConsoleDatabaseURL = ro
	srv, err := console.Open(ctx, c, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		return []Check{Console(ConsoleFacts{OwnLogin: cfg.ConsoleDatabaseURL != "", Err: err})}
	}
	defer srv.Close()
	return []Check{Console(ConsoleFacts{OwnLogin: cfg.ConsoleDatabaseURL != "", Notice: srv.Notice()})}
}

// readOnlyURL is a PostgreSQL connection string (a URL or key=value pairs) whose every
// transaction is read-only: the doctor never writes.
func readOnlyURL(s string) (string, error) {
	if !strings.HasPrefix(s, "postgres://") && !strings.HasPrefix(s, "postgresql://") {
		return s + " default_transaction_read_only=on", nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", errors.New("the database URL does not parse") // the error would quote it
	}
	q := u.Query()
	q.Set("default_transaction_read_only", "on")
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// probeAddresses binds each address this host's worker would listen on, and lets it go.
func probeAddresses(ctx context.Context, cfg daemon.Config, ops daemon.OpsConfig) []Check {
	var out []Check
	for _, a := range []struct{ variable, addr string }{
		{"EXTWORKER_HTTP_ADDR", ops.HTTPAddr}, {"EXTWORKER_CALLBACK_ADDR", cfg.CallbackAddr}, {"EXTWORKER_CONSOLE_ADDR", cfg.ConsoleAddr},
	} {
		switch a.addr {
		case "":
			continue
		case "off":
			out = append(out, ok(NameAddress(a.variable), "off"))
			continue
		}
		ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", a.addr)
		if err == nil {
			_ = ln.Close()
		}
		out = append(out, Address(a.variable, a.addr, err))
	}
	return out
}
