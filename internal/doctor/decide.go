package doctor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/migrations"
)

// Check names, as printed.
const (
	NameEngineReachable  = "engine reachable"
	NameEngineVersion    = "engine version"
	NameEngineCreds      = "engine credentials"
	NameClock            = "clock skew"
	NameDatabase         = "database reachable"
	NameDatabaseTLS      = "database TLS"
	NameMigrated         = "ledger migrated"
	NameRoles            = "ledger roles"
	NameLogin            = "database login"
	NameGrants           = "worker role grants"
	NamePublicConnect    = "database CONNECT"
	NameAMQP             = "broker reachable"
	NameKafka            = "kafka reachable"
	NameLockLongPoll     = "lock vs long poll"
	NameShutdownLongPoll = "shutdown vs long poll"
	NameConsole          = "operator console"
)

// NameQueue is the check of one queue the inbox consumes from.
func NameQueue(q string) string { return "queue " + q }

// NameAddress is the check of a listening address's variable.
func NameAddress(variable string) string { return "address " + variable }

// testedEngines are the Camunda 7 minor releases CI runs against (docs/engine-facts.md).
var testedEngines = []int{20, 22, 24}

// EngineVersion judges the engine's version: a Camunda 7 release older than the oldest
// one tested is a warning; the forks (Operaton, CIB seven), which number their releases
// anew below 7, are taken as newer.
func EngineVersion(v string) Check {
	major, minor, read := majorMinor(v)
	switch {
	case !read:
		return warn(NameEngineVersion, fmt.Sprintf("%q is not a version this tool reads", v),
			"check that EXTWORKER_ENGINE_URL is a Camunda 7 engine's REST root (…/engine-rest)")
	case major == 7 && minor < testedEngines[0]:
		return warn(NameEngineVersion, v+": older than every release extworker is tested against (7.20, 7.22, 7.24)",
			"upgrade the engine to Camunda 7.20 or later")
	}
	return ok(NameEngineVersion, v)
}

func majorMinor(v string) (int, int, bool) {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	return major, minor, err1 == nil && err2 == nil
}

// Clock skew thresholds: the engine's Date header has a resolution of a second, so
// below WarnSkew nothing is said; from FailSkew on the clocks are not synchronised at all.
const (
	WarnSkew = 2 * time.Second
	FailSkew = time.Minute
)

// ClockSkew judges how far the engine's and the database's clocks are from this host's
// (each nil when it could not be read): Clock with both known or absent.
func ClockSkew(engine, database *time.Duration) Check {
	return Clock(ClockFacts{Engine: engine, Database: database})
}

// ClockFacts are the clocks read, each against this host's (nil: not read).
type ClockFacts struct {
	Engine, Database *time.Duration
	// EngineUnknown says why the engine's clock could not be read although it answered
	// (no Date header, or one that is not a date); "" otherwise. DatabaseUnknown, the
	// same of the database's (its clock_timestamp() failed).
	EngineUnknown, DatabaseUnknown string
}

// Clock judges the clocks. The ledger's leases run on the database's clock and the locks
// on the engine's, so skew breaks no guarantee; it makes the times in logs, Cockpit and
// the ledger disagree, and a callback's signed timestamp (EXTWORKER_CALLBACK_TOLERANCE)
// is judged on this host's clock. An engine whose clock cannot be read is a warning:
// nothing is known of it, which is not the same as it being right.
func Clock(f ClockFacts) Check {
	var parts []string
	worst := time.Duration(0)
	note := func(what string, d time.Duration) {
		parts = append(parts, what+" "+skew(d))
		worst = max(worst, d.Abs())
	}
	if f.EngineUnknown != "" {
		parts = append(parts, "engine unknown ("+f.EngineUnknown+")")
	}
	if f.Engine != nil {
		note("engine", *f.Engine)
	}
	if f.DatabaseUnknown != "" {
		parts = append(parts, "database unknown ("+f.DatabaseUnknown+")")
	}
	if f.Database != nil {
		note("database", *f.Database)
	}
	if f.Engine != nil && f.Database != nil {
		note("engine-database", *f.Engine-*f.Database)
	}
	if len(parts) == 0 {
		return skipped(NameClock, NameEngineReachable+" or "+NameDatabase)
	}
	found := strings.Join(parts, ", ") + " (against this host)"
	fix := "synchronise the clocks of this host, the engine's and the database's hosts with NTP (chrony, systemd-timesyncd)"
	switch {
	case worst >= FailSkew:
		return fail(NameClock, found, fix)
	case worst >= WarnSkew:
		return warn(NameClock, found, fix)
	case f.EngineUnknown != "":
		return warn(NameClock, found, "compare the engine host's clock with this host's by hand (date -u on each), and check that nothing "+
			"in front of the engine (a proxy) strips or rewrites its Date header")
	case f.DatabaseUnknown != "":
		return warn(NameClock, found, "compare the database host's clock with this host's by hand (date -u on each); the error says why it could not be read")
	}
	return ok(NameClock, found)
}

// skew prints a clock's offset: in seconds to a tenth when small ("+0.3s"), and readably
// when large ("26y behind", "3m20s ahead").
func skew(d time.Duration) string {
	if d.Abs() < FailSkew {
		return fmt.Sprintf("%+.1fs", d.Seconds())
	}
	way := "ahead"
	if d < 0 {
		way = "behind"
	}
	a := d.Abs()
	const day, year = 24 * time.Hour, 8766 * time.Hour // a year of 365.25 days
	var size string
	switch {
	case a >= year:
		size = fmt.Sprintf("%dy", a/year)
		if rest := (a % year) / day; rest > 0 && a < 10*year {
			size += fmt.Sprintf("%dd", rest)
		}
	case a >= day:
		size = fmt.Sprintf("%dd", a/day)
		if rest := (a % day).Round(time.Hour); rest > 0 {
			size += strings.TrimSuffix(strings.TrimSuffix(rest.String(), "0s"), "0m")
		}
	default:
		size = a.Round(time.Second).String()
	}
	return size + " " + way
}

// Relations judges the relations between durations that the configuration accepts but
// that cost something (the ones that cannot be safe are refused by daemon.LoadConfig).
func Relations(c daemon.Config) []Check {
	var out []Check
	ext := c.LockDuration / 3
	found := fmt.Sprintf("EXTWORKER_LOCK_DURATION %v (extended every %v), EXTWORKER_LONG_POLL %v", c.LockDuration, ext.Round(time.Millisecond), c.LongPoll)
	if c.LongPoll > c.LockDuration {
		out = append(out, warn(NameLockLongPoll, found+": a task the engine locks late in a long poll arrives with its lock "+
			"short or run out, and must be extended (or locked again) at once",
			fmt.Sprintf("set EXTWORKER_LOCK_DURATION to at least EXTWORKER_LONG_POLL (%v), or shorten the long poll", c.LongPoll)))
	} else {
		out = append(out, ok(NameLockLongPoll, found))
	}
	found = fmt.Sprintf("EXTWORKER_SHUTDOWN_TIMEOUT %v, EXTWORKER_SHUTDOWN_GRACE %v, EXTWORKER_LONG_POLL %v, EXTWORKER_LEDGER_LEASE %v",
		c.ShutdownTimeout, c.ShutdownGrace, c.LongPoll, c.LedgerLease)
	if c.LongPoll > 0 && c.ShutdownTimeout <= c.LongPoll {
		out = append(out, warn(NameShutdownLongPoll, found+": a stopping worker gives up its pending long poll, "+
			"for which the engine may still lock tasks that then wait out a whole lock",
			fmt.Sprintf("set EXTWORKER_SHUTDOWN_TIMEOUT longer than EXTWORKER_LONG_POLL (%v), or shorten the long poll", c.LongPoll)))
	} else {
		out = append(out, ok(NameShutdownLongPoll, found))
	}
	return out
}

// MigrationFacts is what the database says of the ledger's migrations.
type MigrationFacts struct {
	Table   bool    // the version table (migrations.VersionTable) is on the search path
	Applied []int64 // the versions it records as applied
	Err     error   // reading them, or migrations.Check's verdict
}

// Migrated judges the ledger's migrations against the versions this binary carries. The
// fix depends on the cause: a ledger behind is migrated; a login that may not read it
// or a database that does not answer in time is not fixed by migrating.
func Migrated(f MigrationFacts, binary []int64) Check {
	latest := binary[len(binary)-1]
	migrate := "run `extworker migrate` with EXTWORKER_DATABASE_URL naming the ledger's owner"
	switch {
	case f.Err != nil && errors.Is(f.Err, migrations.ErrNotMigrated):
		var missing []string
		for _, v := range binary {
			if !slices.Contains(f.Applied, v) {
				missing = append(missing, strconv.FormatInt(v, 10))
			}
		}
		at := int64(0)
		if len(f.Applied) > 0 {
			at = slices.Max(f.Applied)
		}
		return fail(NameMigrated, fmt.Sprintf("behind by %d %s (database at version %d, this binary needs %d; missing %s)",
			len(missing), plural(len(missing), "migration", "migrations"), at, latest, strings.Join(missing, ", ")), migrate)
	case f.Err != nil:
		return fail(NameMigrated, "cannot be read: "+f.Err.Error(), databaseErrorFix(f.Err))
	case !f.Table:
		return fail(NameMigrated, "not migrated: no table "+migrations.VersionTable+" on the search path (an empty database or schema, or not the ledger's)",
			migrate+"; or, if the ledger is elsewhere, correct the database (and search_path) in EXTWORKER_DATABASE_URL")
	}
	return ok(NameMigrated, fmt.Sprintf("at version %d", latest))
}

// databaseErrorFix is the fix for a query that failed on a database that answers: what
// the error says is the cause, never blindly "migrate".
func databaseErrorFix(err error) string {
	var pg *pgconn.PgError
	code := ""
	if errors.As(err, &pg) {
		code = pg.Code
	}
	switch {
	case code == "42501" || strings.HasPrefix(code, "28"): // insufficient_privilege, invalid authorization
		return "the login may not read the ledger: check that EXTWORKER_DATABASE_URL names the ledger's database (and search_path) " +
			"and a login in the worker's role (docs/operators.md#database-roles); migrating does not fix this"
	case code == "57014" || errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err): // query_canceled: statement_timeout
		return "the database did not answer in time: it is overloaded or slow, or a statement_timeout (in EXTWORKER_DATABASE_URL's options " +
			"or the login's settings) is too short; lengthen it, or the doctor's --timeout"
	case code == "25006": // read_only_sql_transaction
		return "the check needed a write, which the doctor never makes: report this; `extworker migrate` as the ledger's owner may help"
	}
	return "check the database's log for this error, and that EXTWORKER_DATABASE_URL names the ledger's database"
}

// RoleFacts is what the database says of the ledger's roles.
type RoleFacts struct {
	Ledger     migrations.Roles // the names the ledger records (migrations.ReadRoles)
	Configured migrations.Roles // migrations.RolesFor(EXTWORKER_DATABASE_ROLE_PREFIX)
	Exists     map[string]bool  // role name -> present in the cluster
	Console    bool             // the operator console is configured (EXTWORKER_CONSOLE_ADDR)
}

// Roles judges whether the ledger's roles are the configured ones and exist: the worker's
// and the operators' must; the console's only when the console runs.
func Roles(f RoleFacts) Check {
	found := fmt.Sprintf("%s, %s, %s", f.Ledger.Worker, f.Ledger.Operator, f.Ledger.Console)
	if f.Ledger != f.Configured {
		return fail(NameRoles, "the ledger names its roles "+found+", EXTWORKER_DATABASE_ROLE_PREFIX names "+
			fmt.Sprintf("%s, %s, %s", f.Configured.Worker, f.Configured.Operator, f.Configured.Console),
			"run `extworker migrate` with this EXTWORKER_DATABASE_ROLE_PREFIX as the ledger's owner, or set the prefix the ledger uses")
	}
	var missing []string
	for _, r := range []string{f.Ledger.Worker, f.Ledger.Operator} {
		if !f.Exists[r] {
			missing = append(missing, r)
		}
	}
	consoleMissing := !f.Exists[f.Ledger.Console]
	if consoleMissing && f.Console {
		missing = append(missing, f.Ledger.Console)
	}
	create := func(names []string) string {
		return "as a role with CREATEROLE: CREATE ROLE " + strings.Join(names, " NOLOGIN; CREATE ROLE ") +
			" NOLOGIN; then `extworker migrate` as the ledger's owner grants them their rights (docs/operators.md#database-roles)"
	}
	switch {
	case len(missing) > 0:
		return fail(NameRoles, "missing: "+strings.Join(missing, ", "), create(missing))
	case consoleMissing:
		return ok(NameRoles, found+" ("+f.Ledger.Console+" absent: needed only with the operator console)")
	}
	return ok(NameRoles, found+" present")
}

// LoginFacts is who the configured database login is.
type LoginFacts struct {
	Login      string // current_user
	Owner      bool   // owns the ledger's tables
	WorkerRole string
	Member     bool // a member of WorkerRole
}

// Login judges the configured login: a member of the worker role is right; the owner
// works but may do what the worker's role may not (take an intent out of operator hold,
// change events); any other login cannot run a worker.
func Login(f LoginFacts) Check {
	switch {
	case f.Member && !f.Owner:
		return ok(NameLogin, f.Login+" is in role "+f.WorkerRole)
	case f.Owner:
		return warn(NameLogin, f.Login+" owns the ledger's tables: a worker running as the owner may do what "+f.WorkerRole+" may not",
			"run workers as a login IN ROLE "+f.WorkerRole+" (docs/operators.md#database-roles); keep the owner for `extworker migrate`")
	}
	return fail(NameLogin, f.Login+" is not in role "+f.WorkerRole,
		"as a role with CREATEROLE: GRANT "+f.WorkerRole+" TO "+f.Login)
}

// Grant is one right the worker's role needs: a privilege on a table, or EXECUTE on a
// function (Object with its argument types).
type Grant struct {
	Object, Privilege string
}

func (g Grant) String() string { return g.Privilege + " ON " + g.Object }

// WorkerGrants are the rights `extworker migrate` gives the worker's role
// (migrations/00009's extworker_apply_grants and its outbox and inbox companions; the
// table in docs/operators.md#database-roles). A worker lacking one fails at the first
// statement that needs it.
var WorkerGrants = func() []Grant {
	var g []Grant
	add := func(object string, privs ...string) {
		for _, p := range privs {
			g = append(g, Grant{object, p})
		}
	}
	add("extworker_intents", "SELECT", "INSERT", "UPDATE")
	add("extworker_intent_events", "SELECT", "INSERT")
	for _, t := range []string{"extworker_intent_tombstones", "extworker_schema_migrations", "extworker_ledger_roles", "extworker_ledger_settings"} {
		add(t, "SELECT")
	}
	for _, t := range []string{"extworker_outbox", "extworker_inbox", "extworker_inbox_conflicts", "extworker_inbox_starts", "extworker_inbox_callbacks"} {
		add(t, "SELECT", "INSERT", "UPDATE", "DELETE")
	}
	add("extworker_prune(text, interval, integer)", "EXECUTE")
	return g
}()

// Grants judges the worker role's rights: held maps each of want to whether the role has it.
func Grants(role string, want []Grant, held map[Grant]bool) Check {
	var missing []string
	for _, g := range want {
		if !held[g] {
			missing = append(missing, g.String())
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return fail(NameGrants, role+" lacks "+strings.Join(missing, ", "),
			"run `extworker migrate` as the ledger's owner: it grants the ledger's roles their rights on every run")
	}
	return ok(NameGrants, fmt.Sprintf("%s has the %d rights a worker needs", role, len(want)))
}

// PublicConnect judges who may connect: PUBLIC (every login of the cluster) is a warning,
// as `extworker migrate` gives it.
func PublicConnect(database string, public bool, roles migrations.Roles) Check {
	if public {
		return warn(NamePublicConnect, "every login of the cluster may connect to database "+database+" (PUBLIC has CONNECT)",
			fmt.Sprintf("REVOKE CONNECT ON DATABASE %s FROM PUBLIC; GRANT CONNECT ON DATABASE %s TO %s, %s (docs/operators.md#database-roles)",
				database, database, roles.Worker, roles.Operator))
	}
	return ok(NamePublicConnect, "only granted roles may connect to database "+database)
}

// QueueFacts is what the broker says of a queue and its companions (nil: absent).
type QueueFacts struct {
	Queue               string
	Main, Retry, Parked *int  // messages in each; nil when the queue does not exist
	Err                 error // a declaration the broker refused for another reason than absence
}

// MaxQueueName is AMQP 0-9-1's limit on a queue's name (a short string), in bytes. The
// retry and dead-letter companions add their suffixes to it.
const MaxQueueName = 255

// ValidQueue refuses a queue name the broker cannot have: empty, or (with the longest
// companion's suffix) over AMQP's 255 bytes.
func ValidQueue(q string) error {
	longest := max(len(inbox.RetryQueue(q)), len(inbox.DeadLetterQueue(q)), len(q))
	switch {
	case q == "":
		return errors.New("queue: an empty name")
	case longest > MaxQueueName:
		return fmt.Errorf("queue %.40q…: invalid: %d bytes with its companion's suffix, over AMQP's limit of %d", q, longest, MaxQueueName)
	}
	return nil
}

// Queue judges one inbox queue: it and its retry and dead-letter queues must exist
// (the consumer declares them at start, so absent ones mean it never ran against this
// broker or virtual host); parked messages are a warning.
func Queue(f QueueFacts, retry, dlq string) Check {
	name := NameQueue(f.Queue)
	if f.Err != nil { // not known to be absent: "start the worker" would not help
		return fail(name, "cannot be checked: "+f.Err.Error(),
			"check that EXTWORKER_AMQP_URL's user may use "+f.Queue+" in its virtual host (rabbitmqctl list_permissions -p VHOST)")
	}
	var missing []string
	for _, q := range []struct {
		name string
		n    *int
	}{{f.Queue, f.Main}, {retry, f.Retry}, {dlq, f.Parked}} {
		if q.n == nil {
			missing = append(missing, q.name)
		}
	}
	if len(missing) > 0 {
		return fail(name, "absent: "+strings.Join(missing, ", "),
			"start the worker that consumes "+f.Queue+" once (it declares its queues), or check the virtual host in EXTWORKER_AMQP_URL")
	}
	found := fmt.Sprintf("%d ready, %d waiting to retry, %d parked", *f.Main, *f.Retry, *f.Parked)
	if *f.Parked > 0 {
		return warn(name, found, "see `extworker inbox list --parked`; replay with `extworker inbox replay --queue "+f.Queue+"` (docs/operators.md)")
	}
	return ok(name, found)
}

// Address judges a listening address: err is what binding it gave.
func Address(variable, addr string, err error) Check {
	name := NameAddress(variable)
	if err != nil {
		return fail(name, addr+": "+err.Error(),
			"set "+variable+" to a free address (one per worker on a host), or stop what listens there (ss -ltnp)")
	}
	return ok(name, addr+" is free")
}

// ConsoleFacts is what opening the operator console gave.
type ConsoleFacts struct {
	OwnLogin bool   // EXTWORKER_CONSOLE_DATABASE_URL is set (else the console uses the worker's)
	Err      error  // console.Open's
	Notice   string // what its pages say of its database login ("" when it may do an operator's work)
}

// Console judges the operator console as `extworker console serve` and a worker with
// EXTWORKER_CONSOLE_ADDR open it: a configuration error stops either (exit 78), a
// database it cannot log in to as well; a login outside the console's role serves, with
// a notice on every page that operators' approvals will be refused.
func Console(f ConsoleFacts) Check {
	dbVar := "EXTWORKER_DATABASE_URL (the console's login without EXTWORKER_CONSOLE_DATABASE_URL)"
	if f.OwnLogin {
		dbVar = "EXTWORKER_CONSOLE_DATABASE_URL"
	}
	var ce daemon.ConfigError
	switch {
	case f.Err != nil && errors.As(f.Err, &ce):
		return fail(NameConsole, "does not start: "+f.Err.Error(),
			"correct the variable named (docs/console.md): the console, and a worker with EXTWORKER_CONSOLE_ADDR, exit 78 with it")
	case f.Err != nil:
		return fail(NameConsole, "does not start: "+f.Err.Error(),
			"check "+dbVar+" (host, port, database, user, password, sslmode) and that the login may connect; the console, and a worker with EXTWORKER_CONSOLE_ADDR, stop with it")
	case f.Notice != "" && f.OwnLogin:
		return fail(NameConsole, f.Notice, "set EXTWORKER_CONSOLE_DATABASE_URL to a login in the console's role (docs/console.md, docs/operators.md#database-roles)")
	case f.Notice != "":
		return warn(NameConsole, f.Notice, "set EXTWORKER_CONSOLE_DATABASE_URL to a login in the console's role (docs/console.md, docs/operators.md#database-roles)")
	}
	return ok(NameConsole, "its configuration loads as `extworker console serve` loads it; its database login may do an operator's work")
}

// NameConfig is the first check: the configuration itself.
const NameConfig = "configuration"

// Configuration judges daemon.LoadConfig's result: with problems nothing else is checked
// (ExitConfig), and the problems themselves follow on standard error.
func Configuration(err error) Check {
	if err != nil {
		return fail(NameConfig, "cannot be read: the problems are listed below",
			"correct each variable named below (docs/configuration.md); `extworker config` shows every value and where it came from")
	}
	return ok(NameConfig, "EXTWORKER_* variables read, every value in range")
}

// DatabaseFix is the fix for a database the doctor could not reach, by the cause err
// gives: a password refused, a host pg_hba.conf does not let in, a database or role that
// does not exist, nothing listening, no answer in time, or a TLS failure; otherwise
// every place to look.
func DatabaseFix(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch pg.Code {
		case "28P01":
			return "the password is wrong for that user: correct it in EXTWORKER_DATABASE_URL (or the file EXTWORKER_DATABASE_URL_FILE names)"
		case "28000":
			return "PostgreSQL does not let this host in as that user (pg_hba.conf has no line for it, or the role may not log in): add a line for this host, user and database, and reload PostgreSQL"
		case "3D000":
			return "no such database: create it (createdb -O <owner> <name>) or correct the database in EXTWORKER_DATABASE_URL"
		case "53300":
			return "PostgreSQL has no connection to spare (max_connections): close idle ones, or raise max_connections"
		case "57P03":
			return "PostgreSQL is starting, stopping or in recovery: wait, then run the doctor again"
		}
	}
	msg := err.Error()
	switch {
	case errors.Is(err, syscall.ECONNREFUSED) || strings.Contains(msg, "connection refused"):
		return "nothing listens at that host and port: start PostgreSQL, or correct the host and port in EXTWORKER_DATABASE_URL"
	case errors.Is(err, context.DeadlineExceeded) || strings.Contains(msg, "timeout"):
		return "no answer in time (connect_timeout): a firewall drops the connection, or the host is wrong"
	case strings.Contains(msg, "tls") || strings.Contains(msg, "x509") || strings.Contains(msg, "SSL"):
		return "the TLS handshake failed: check sslmode, sslrootcert and the server's certificate (its name must match the URL's host)"
	case strings.Contains(msg, "no such host"):
		return "the host name does not resolve: correct the host in EXTWORKER_DATABASE_URL"
	}
	return "check EXTWORKER_DATABASE_URL (host, port, database, user, password, sslmode) and that PostgreSQL runs and accepts this host (pg_hba.conf)"
}
