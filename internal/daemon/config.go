package daemon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/kelseyhightower/envconfig"
	"github.com/lmittmann/tint"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/migrations"
	"github.com/extworker/extworker/tasks"
)

// Config is the daemon's configuration, read from EXTWORKER_* variables.
//
// Fields tagged secret:"true" are masked by `extworker Config` and may also be read from a
// file named by EXTWORKER_<NAME>_FILE (secrets.go); secret:"url" fields are URLs whose
// password is masked, and they too may come from a file.
type Config struct {
	EngineURL      string `envconfig:"ENGINE_URL" default:"http://127.0.0.1:8080/engine-rest" secret:"url"`
	EngineUser     string `envconfig:"ENGINE_USER"`
	EnginePassword string `envconfig:"ENGINE_PASSWORD" secret:"true"`
	EngineToken    string `envconfig:"ENGINE_TOKEN" secret:"true"`
	// OAuth2 client credentials: a token from EngineOAuthTokenURL, cached until shortly
	// before it expires, is sent as the bearer token.
	EngineOAuthTokenURL     string   `envconfig:"ENGINE_OAUTH_TOKEN_URL"`
	EngineOAuthClientID     string   `envconfig:"ENGINE_OAUTH_CLIENT_ID"`
	EngineOAuthClientSecret string   `envconfig:"ENGINE_OAUTH_CLIENT_SECRET" secret:"true"`
	EngineOAuthScopes       []string `envconfig:"ENGINE_OAUTH_SCOPES"` // comma-separated
	// EngineAllowPlaintextAuth allows credentials over plain http:// to a host that is not
	// loopback: the password or token to EXTWORKER_ENGINE_URL, the OAuth2 client secret to
	// EXTWORKER_ENGINE_OAUTH_TOKEN_URL. Without it that is a configuration problem; with it,
	// a warning at start.
	EngineAllowPlaintextAuth bool `envconfig:"ENGINE_ALLOW_PLAINTEXT_AUTH"`
	// HTTPS to the engine (and to the token endpoint): a CA bundle replacing the system
	// roots, a client certificate.
	EngineCAFile   string        `envconfig:"ENGINE_CA_FILE"`
	EngineCertFile string        `envconfig:"ENGINE_CERT_FILE"`
	EngineKeyFile  string        `envconfig:"ENGINE_KEY_FILE"`
	EngineTimeout  time.Duration `envconfig:"ENGINE_TIMEOUT" default:"30s"`

	// DatabaseURL is the ledger's PostgreSQL (pgx URL; TLS with sslmode=verify-full and
	// sslrootcert=..., client certificates with sslcert/sslkey). Without sslmode, a host
	// that is not loopback or a unix socket gets verify-full (databaseConfig).
	DatabaseURL     string `envconfig:"DATABASE_URL" default:"postgres://extworker:extworker@127.0.0.1:5432/extworker" secret:"url"`
	LedgerNamespace string `envconfig:"LEDGER_NAMESPACE" default:"default"`
	// LedgerLease is how long one attempt owns an intent; it must leave each effect's
	// call its whole timeout (idempotency.Effect.Timeout, checked by the ledger's Do).
	LedgerLease time.Duration `envconfig:"LEDGER_LEASE" default:"2m"`
	// LedgerMaxConns caps the ledger's connection pool, whatever MaxConcurrency is
	// (pool_max_conns in DatabaseURL wins); see openLedger.
	LedgerMaxConns int `envconfig:"LEDGER_MAX_CONNS" default:"10"`
	// LedgerRetention is how long settled intents are kept; `run` prunes older ones hourly
	// into tombstones. Orphaned, unknown and held intents are never pruned. 0 keeps
	// everything; otherwise at least ProviderWindow plus a day (idempotency.MinRetention).
	LedgerRetention time.Duration `envconfig:"LEDGER_RETENTION" default:"720h"`
	// ApprovalThreshold is the two-person rule's (docs/operators.md): an operator's
	// confirmed or retry verdict on an intent whose amount is above it (minor units), or
	// not recorded, waits for a second operator's approval.
	ApprovalThreshold int64 `envconfig:"APPROVAL_THRESHOLD" default:"0"`
	// DatabaseRolePrefix names the ledger database's roles: PREFIX_worker,
	// PREFIX_operator and PREFIX_console (docs/operators.md#database-roles). Roles are
	// cluster-wide: each ledger database on a cluster (each tenant) takes its own prefix,
	// so one tenant's logins are never trusted in another's ledger. `extworker migrate`
	// records it, with ApprovalThreshold, in the database, which enforces both.
	DatabaseRolePrefix string `envconfig:"DATABASE_ROLE_PREFIX" default:"extworker"`
	// AMQPURL is the RabbitMQ broker the outbox relay publishes to (amqps://user:password@
	// host/vhost; amqp:// only to a loopback host unless AMQPAllowPlaintext). Empty: no
	// relay runs in this process (another process's may).
	AMQPURL string `envconfig:"AMQP_URL" secret:"url"`
	// AMQPAllowPlaintext allows amqp:// (credentials and events in clear) to a host that
	// is not loopback.
	AMQPAllowPlaintext bool `envconfig:"AMQP_ALLOW_PLAINTEXT"`
	// KafkaBrokers are the Kafka brokers (host:port, comma-separated) App.ConsumeKafka
	// consumes from and, with OutboxBroker kafka, the outbox relay publishes to.
	KafkaBrokers []string `envconfig:"KAFKA_BROKERS"`
	// KafkaTLS connects to the brokers with TLS, verified against the system's roots;
	// without it, only loopback brokers are accepted unless KafkaAllowPlaintext.
	KafkaTLS            bool `envconfig:"KAFKA_TLS"`
	KafkaAllowPlaintext bool `envconfig:"KAFKA_ALLOW_PLAINTEXT"`
	// KafkaReplay says this process's Kafka consumers read history on purpose (their
	// group's offsets were reset): every message is a historical replay, which
	// correlates at most once and never starts a process (inbox.KafkaConfig.Replay).
	KafkaReplay bool `envconfig:"KAFKA_REPLAY"`
	// KafkaSessionTimeout is how long a Kafka consumer group waits for a member that
	// died before its partitions go to the others (inbox.KafkaConfig.SessionTimeout).
	KafkaSessionTimeout time.Duration `envconfig:"KAFKA_SESSION_TIMEOUT" default:"10s"`
	// OutboxBroker is where the outbox relay publishes: amqp or kafka. Empty: amqp with
	// AMQPURL, else kafka with KafkaBrokers, else no relay runs in this process.
	OutboxBroker string `envconfig:"OUTBOX_BROKER"`
	// CallbackAddr is the listener of the provider callbacks (App.Callback,
	// docs/callbacks.md): off when empty. Each source's signing secrets are in
	// EXTWORKER_CALLBACK_SECRETS_<SOURCE> (or its _FILE), space-separated whsec_ keys.
	CallbackAddr      string        `envconfig:"CALLBACK_ADDR"`
	CallbackTolerance time.Duration `envconfig:"CALLBACK_TOLERANCE" default:"5m"`
	CallbackMaxBody   int64         `envconfig:"CALLBACK_MAX_BODY" default:"1048576"`
	// ProviderWindow is how long the providers keep idempotency keys (Stripe: 24h), for
	// the ledger (idempotency.Config.ProviderWindow): past it an unknown outcome is looked
	// up by business search only, never by key, and no settled intent is pruned within it.
	ProviderWindow time.Duration `envconfig:"PROVIDER_WINDOW" default:"24h"`

	WorkerID       string        `envconfig:"WORKER_ID"`
	MaxConcurrency int           `envconfig:"MAX_CONCURRENCY" default:"16"`
	LongPoll       time.Duration `envconfig:"LONG_POLL" default:"20s"`
	LockDuration   time.Duration `envconfig:"LOCK_DURATION" default:"20s"`
	// ReportRetryFor, IdlePollInterval, ShutdownGrace: tasks.Config's fields of the same
	// names; 0 means none (no retrying past the minimum attempts, no pause between empty
	// polls, no grace), not tasks' default.
	ReportRetryFor   time.Duration `envconfig:"REPORT_RETRY_FOR" default:"5m"`
	IdlePollInterval time.Duration `envconfig:"IDLE_POLL_INTERVAL" default:"1s"`
	// LockWatch is tasks.Config.LockWatch: unset, the worker derives it; 0 turns the
	// watch off (lockWatchSet tells the two apart).
	LockWatch     time.Duration `envconfig:"LOCK_WATCH"`
	ShutdownGrace time.Duration `envconfig:"SHUTDOWN_GRACE" default:"30s"`
	// ShutdownTimeout bounds the whole shutdown (tasks.Config.ShutdownTimeout). Unset, it
	// is ShutdownGrace + defaultShutdownSlack (45s with the default grace), so raising the
	// grace alone stays valid.
	ShutdownTimeout time.Duration `envconfig:"SHUTDOWN_TIMEOUT"`

	LogFormat string `envconfig:"LOG_FORMAT" default:"auto"` // auto (text on a terminal, else JSON), text, json
	LogLevel  string `envconfig:"LOG_LEVEL" default:"info"`  // debug, info, warn, error

	// The operator console (internal/console, docs/console.md): off unless ConsoleAddr is
	// set, on a listener of its own, never the operations endpoint's.
	ConsoleAddr string `envconfig:"CONSOLE_ADDR"`
	// ConsoleOperatorsFile lists the operators who log in with a password, one
	// name:bcrypt-hash per line (`extworker console hash-password`, or htpasswd -nBC 10).
	ConsoleOperatorsFile string `envconfig:"CONSOLE_OPERATORS_FILE"`
	// ConsoleAuthHeader instead trusts a reverse proxy that authenticated the operator to
	// name them in this header (X-Forwarded-User, say); the console must then be reachable
	// only through that proxy, which ConsoleTrustedProxies enforces by remote address.
	ConsoleAuthHeader     string   `envconfig:"CONSOLE_AUTH_HEADER"`
	ConsoleTrustedProxies []string `envconfig:"CONSOLE_TRUSTED_PROXIES"` // comma-separated CIDRs or addresses
	// ConsoleSessionKeyFile holds the key that signs session cookies, shared by replicas
	// behind one address; without it each process draws a random key, and its sessions
	// end with it.
	ConsoleSessionKeyFile string        `envconfig:"CONSOLE_SESSION_KEY_FILE"`
	ConsoleSessionTTL     time.Duration `envconfig:"CONSOLE_SESSION_TTL" default:"8h"`
	// ConsoleSecureCookies marks the console's cookies Secure behind a proxy that
	// terminates TLS (with the console's own TLS they are anyway).
	ConsoleSecureCookies bool `envconfig:"CONSOLE_SECURE_COOKIES" default:"false"`
	// ConsoleAllowedHosts are the Host names the console answers to (comma-separated);
	// empty derives them from ConsoleAddr. Any other Host is refused (421).
	ConsoleAllowedHosts []string `envconfig:"CONSOLE_ALLOWED_HOSTS"`
	ConsoleTLSCertFile  string   `envconfig:"CONSOLE_TLS_CERT_FILE"`
	ConsoleTLSKeyFile   string   `envconfig:"CONSOLE_TLS_KEY_FILE"`
	// ConsoleDatabaseURL is the console's login to the ledger: a member of
	// extworker_console (docs/console.md), which may take intents out of operator hold
	// and is told apart from other operators by name. Empty: DatabaseURL.
	ConsoleDatabaseURL string `envconfig:"CONSOLE_DATABASE_URL" secret:"url"`
	// ConsoleCockpitURL is where the console links into Cockpit. Empty: the engine's
	// address with /camunda in place of /engine-rest.
	ConsoleCockpitURL string `envconfig:"CONSOLE_COCKPIT_URL"`

	// The human-task completion service (package humantask, docs/humantasks.md): off
	// unless TasksAddr is set; its variables are checked in humantasks.go.
	TasksAddr           string   `envconfig:"TASKS_ADDR"`
	TasksAuthHeader     string   `envconfig:"TASKS_AUTH_HEADER"`
	TasksGroupsHeader   string   `envconfig:"TASKS_GROUPS_HEADER"`
	TasksTrustedProxies []string `envconfig:"TASKS_TRUSTED_PROXIES"` // comma-separated CIDRs or addresses
	TasksJWTIssuer      string   `envconfig:"TASKS_JWT_ISSUER"`
	TasksJWKSURL        string   `envconfig:"TASKS_JWT_JWKS_URL"`
	TasksJWTAudience    string   `envconfig:"TASKS_JWT_AUDIENCE"`
	TasksJWTUserClaim   string   `envconfig:"TASKS_JWT_USER_CLAIM" default:"sub"`
	TasksJWTGroupsClaim string   `envconfig:"TASKS_JWT_GROUPS_CLAIM"`
	TasksTLSCertFile    string   `envconfig:"TASKS_TLS_CERT_FILE"`
	TasksTLSKeyFile     string   `envconfig:"TASKS_TLS_KEY_FILE"`
	TasksPage           bool     `envconfig:"TASKS_PAGE"`
	TasksNamespace      string   `envconfig:"TASKS_NAMESPACE" default:"humantask"`

	lockWatchSet bool
	// fromFile maps a secret's variable (EXTWORKER_ENGINE_PASSWORD) to the file it was read
	// from, for `extworker config`.
	fromFile map[string]string
	// invalid maps each variable whose value did not parse to that value: its field is left
	// zero, and problems() skips the checks that involve it.
	invalid map[string]string
}

// defaultShutdownSlack is what EXTWORKER_SHUTDOWN_TIMEOUT adds to EXTWORKER_SHUTDOWN_GRACE
// when it is not set: time for reporting the last results and releasing the rest.
const defaultShutdownSlack = 15 * time.Second

// envPrefix starts every variable's name.
const envPrefix = "EXTWORKER_"

// LoadConfig reads the environment: EXTWORKER_* variables (config's and opsConfig's),
// then the secrets named by EXTWORKER_*_FILE, then validates. Every problem is listed
// together, each naming its variable: values that do not parse (a duration of "abc")
// as well as values out of range and relations between variables that cannot be safe.
// The returned config is filled in as far as it could be even when an error is returned,
// for `extworker config`.
func LoadConfig() (Config, error) {
	var c Config
	invalid, errs := processEnv(&c)
	c.invalid = invalid
	_, c.lockWatchSet = os.LookupEnv(envPrefix + "LOCK_WATCH")
	if _, set := os.LookupEnv(envPrefix + "SHUTDOWN_TIMEOUT"); !set && c.parsed("EXTWORKER_SHUTDOWN_GRACE") {
		c.ShutdownTimeout = c.ShutdownGrace + defaultShutdownSlack
	}
	errs = append(errs, c.readSecretFiles(os.LookupEnv)...)
	for i, b := range c.KafkaBrokers {
		c.KafkaBrokers[i] = strings.TrimSpace(b) // "a:9092, b:9092" as written
	}
	errs = append(errs, c.problems()...)
	// The operations endpoint's variables are read again by `run` (loadOpsConfig); their
	// problems are listed here too, so that one start shows every problem.
	_, _, opsErrs := ReadOpsConfig()
	errs = append(errs, opsErrs...)
	if len(errs) > 0 {
		return c, ConfigError{fmt.Errorf("configuration: %w", errors.Join(errs...))}
	}
	return c, nil
}

// ReadOpsConfig reads opsConfig's variables (loadOpsConfig) and returns every problem,
// with the values that did not parse.
func ReadOpsConfig() (OpsConfig, map[string]string, []error) {
	var c OpsConfig
	invalid, errs := processEnv(&c)
	if _, bad := invalid["EXTWORKER_READY_TIMEOUT"]; !bad && c.ReadyTimeout <= 0 {
		errs = append(errs, fmt.Errorf("EXTWORKER_READY_TIMEOUT %v: must be positive", c.ReadyTimeout))
	}
	return c, invalid, errs
}

// processEnv fills spec (a pointer to a struct with envconfig tags) from the environment
// as envconfig.Process("extworker", spec) would, but one variable at a time, so that every
// value that does not parse is reported, not only the first. Each problem names its
// variable and its type's syntax, and shows the value unless the field is a secret. A field
// whose value does not parse is left zero and listed in invalid (variable -> value).
//
// Each variable is looked up by its full name only (EXTWORKER_LOCK_DURATION): unlike
// envconfig.Process with a prefix, the unprefixed name (LOCK_DURATION) is never used
// instead, so another program's variables cannot configure the worker unnoticed.
func processEnv(spec any) (invalid map[string]string, errs []error) {
	for _, cv := range SpecVars(spec) {
		f := cv.structField
		tag := fmt.Sprintf("envconfig:%q", cv.Name)
		if cv.def != "" {
			tag += fmt.Sprintf(" default:%q", cv.def)
		}
		one := reflect.New(reflect.StructOf([]reflect.StructField{{Name: f.Name, Type: f.Type, Tag: reflect.StructTag(tag)}}))
		if err := envconfig.Process("", one.Interface()); err != nil {
			var pe *envconfig.ParseError
			value := ""
			if errors.As(err, &pe) { // it has no Unwrap
				value, err = pe.Value, pe.Err
			}
			if invalid == nil {
				invalid = map[string]string{}
			}
			invalid[cv.Name] = value
			errs = append(errs, parseProblem(cv, value, err))
			continue
		}
		cv.field.Set(one.Elem().Field(0))
	}
	return invalid, errs
}

var durationType = reflect.TypeFor[time.Duration]()

// parseProblem describes a value that does not parse as its field's type, naming the
// variable and never showing a secret.
func parseProblem(cv ConfigVar, value string, err error) error {
	shown := fmt.Sprintf("%q", value)
	if cv.secret != "" {
		shown = "(value not shown)"
	}
	var want string
	t := cv.field.Type()
	switch {
	case t == durationType:
		want = "not a duration: a number with a unit, such as 500ms, 20s, 2m or 1h"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64 || t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uint64:
		want = "not a whole number"
		if errors.Is(err, strconv.ErrRange) {
			want = "out of range"
		}
	case t.Kind() == reflect.Bool:
		want = "want true or false"
	default:
		want = "cannot be read as " + t.String()
	}
	return fmt.Errorf("%s %s: %s", cv.Name, shown, want)
}

// parsed reports whether every one of the named variables parsed (or was not set).
func (c Config) parsed(names ...string) bool {
	for _, n := range names {
		if _, bad := c.invalid[n]; bad {
			return false
		}
	}
	return true
}

// ConfigError is a configuration the worker cannot start with, or credentials the engine
// rejected: retrying cannot help, so main exits with exitConfig.
type ConfigError struct{ Err error }

func (e ConfigError) Error() string { return e.Err.Error() }
func (e ConfigError) Unwrap() error { return e.Err }

// ExitConfig is EX_CONFIG from sysexits.h: a supervisor can refuse to restart on it
// (systemd: RestartPreventExitStatus=78).
const ExitConfig = 78

// problems returns every problem with c, each naming its variable and never a secret.
func (c Config) problems() []error {
	var errs []error
	errs = append(errs, c.logProblems()...)
	errs = append(errs, c.engineProblems()...)
	errs = append(errs, c.databaseProblems()...)
	errs = append(errs, c.consoleProblems()...)
	errs = append(errs, c.tasksProblems()...)
	errs = append(errs, c.ledgerProblems()...)
	errs = append(errs, c.pollProblems()...)
	errs = append(errs, c.shutdownProblems()...)
	// No rule relates EXTWORKER_ENGINE_TIMEOUT to EXTWORKER_LONG_POLL: a fetch's HTTP
	// timeout is the long poll plus a margin (camunda7.Client.LongPollTimeout), never
	// ENGINE_TIMEOUT alone. Nor LONG_POLL to LOCK_DURATION: a task that arrives with
	// little of its lock left is extended at once.
	return errs
}

// logProblems: the log's format and level. In the functions below, a variable that did
// not parse is reported once, as such (processEnv): the checks that involve it are
// skipped (c.parsed) rather than complain about its zero value.
func (c Config) logProblems() []error {
	var errs []error
	switch c.LogFormat {
	case "auto", "text", "json":
	default:
		errs = append(errs, fmt.Errorf("EXTWORKER_LOG_FORMAT %q: want auto, text or json", c.LogFormat))
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.LogLevel)); err != nil {
		errs = append(errs, fmt.Errorf("EXTWORKER_LOG_LEVEL %q: want debug, info, warn or error", c.LogLevel))
	}
	return errs
}

// engineProblems: how the engine is reached.
func (c Config) engineProblems() []error {
	var errs []error
	if err := checkHTTPURL(c.EngineURL); err != nil {
		errs = append(errs, fmt.Errorf("EXTWORKER_ENGINE_URL %s: %w", RedactURL(c.EngineURL), err))
	} else {
		errs = append(errs, engineURLProblems(c.EngineURL)...)
	}
	errs = append(errs, c.authProblems()...)
	if (c.EngineCertFile == "") != (c.EngineKeyFile == "") {
		errs = append(errs, errors.New("EXTWORKER_ENGINE_CERT_FILE and EXTWORKER_ENGINE_KEY_FILE must be set together"))
	} else if _, err := c.engineTLS(); err != nil {
		errs = append(errs, err)
	}
	ok := c.parsed
	if ok("EXTWORKER_ENGINE_TIMEOUT") && c.EngineTimeout <= 0 {
		errs = append(errs, fmt.Errorf("EXTWORKER_ENGINE_TIMEOUT %v: must be positive", c.EngineTimeout))
	}
	return errs
}

// databaseProblems: how PostgreSQL and the broker are reached.
func (c Config) databaseProblems() []error {
	var errs []error
	ok := c.parsed
	if err := CheckDatabaseURL(c.DatabaseURL); err != nil {
		errs = append(errs, err)
	}
	if err := checkRolePrefix(c.DatabaseRolePrefix); err != nil {
		errs = append(errs, err)
	}
	if ok("EXTWORKER_AMQP_URL") && c.AMQPURL != "" {
		if err := checkAMQPURL(c.AMQPURL, c.AMQPAllowPlaintext); err != nil {
			errs = append(errs, fmt.Errorf("EXTWORKER_AMQP_URL %s: %w", RedactURL(c.AMQPURL), err))
		}
	}
	return append(errs, c.channelProblems()...)
}

// ledgerProblems: the effect ledger's pool, retention, lease and approvals.
func (c Config) ledgerProblems() []error {
	var errs []error
	ok := c.parsed
	// The namespace by the ledger's own rule, so that a namespace it would refuse at start
	// is a configuration problem here.
	if err := (idempotency.Config{Namespace: c.LedgerNamespace}).Validate(); err != nil {
		errs = append(errs, fmt.Errorf("EXTWORKER_LEDGER_NAMESPACE: %w", err))
	}
	if ok("EXTWORKER_LEDGER_MAX_CONNS") && c.LedgerMaxConns < 1 {
		errs = append(errs, fmt.Errorf("EXTWORKER_LEDGER_MAX_CONNS %d: must be at least 1", c.LedgerMaxConns))
	}
	if ok("EXTWORKER_LEDGER_RETENTION") && c.LedgerRetention < 0 {
		errs = append(errs, fmt.Errorf("EXTWORKER_LEDGER_RETENTION %v: must not be negative", c.LedgerRetention))
	}
	if ok("EXTWORKER_APPROVAL_THRESHOLD") && c.ApprovalThreshold < 0 {
		errs = append(errs, fmt.Errorf("EXTWORKER_APPROVAL_THRESHOLD %d: must not be negative", c.ApprovalThreshold))
	}
	// A settled intent is pruned only once the provider has forgotten its key for a day:
	// until then its row is what answers a late re-delivery (a tombstone after that).
	if ok("EXTWORKER_LEDGER_RETENTION") && ok("EXTWORKER_PROVIDER_WINDOW") && c.LedgerRetention > 0 && c.ProviderWindow > 0 {
		if min := idempotency.MinRetention(c.ProviderWindow); c.LedgerRetention < min {
			errs = append(errs, fmt.Errorf("EXTWORKER_LEDGER_RETENTION %v: must be 0 (keep everything) or at least EXTWORKER_PROVIDER_WINDOW %v plus %v, %v",
				c.LedgerRetention, c.ProviderWindow, idempotency.PruneMargin, min))
		}
	}
	if ok("EXTWORKER_PROVIDER_WINDOW") && c.ProviderWindow <= 0 {
		errs = append(errs, fmt.Errorf("EXTWORKER_PROVIDER_WINDOW %v: must be positive", c.ProviderWindow))
	}
	if ok("EXTWORKER_LEDGER_LEASE") && c.LedgerLease < time.Second {
		errs = append(errs, fmt.Errorf("EXTWORKER_LEDGER_LEASE %v: must be at least 1s", c.LedgerLease))
	}
	// The lease against each effect's own timeout (idempotency.Effect.Timeout,
	// httpeffect.Spec.Timeout) is checked where both are known: by the ledger's Do.
	return errs
}

// pollProblems: how tasks are fetched, locked and reported.
func (c Config) pollProblems() []error {
	var errs []error
	ok := c.parsed
	if ok("EXTWORKER_MAX_CONCURRENCY") && c.MaxConcurrency < 1 {
		errs = append(errs, fmt.Errorf("EXTWORKER_MAX_CONCURRENCY %d: must be at least 1", c.MaxConcurrency))
	}
	// The engine's lock has millisecond precision and every extension is a round trip:
	// under a second there is no room for one.
	if ok("EXTWORKER_LOCK_DURATION") && c.LockDuration < minLockDuration {
		errs = append(errs, fmt.Errorf("EXTWORKER_LOCK_DURATION %v: must be at least %v: the lock is extended every third of it, "+
			"and each extension is a round trip to the engine", c.LockDuration, minLockDuration))
	}
	if ok("EXTWORKER_LONG_POLL") && (c.LongPoll < 0 || c.LongPoll > camunda7.MaxAsyncResponseTimeout) {
		errs = append(errs, fmt.Errorf("EXTWORKER_LONG_POLL %v: must be between 0 and 30m", c.LongPoll))
	}
	// Without a long poll, idle polls are paced by the idle interval alone.
	if ok("EXTWORKER_LONG_POLL") && ok("EXTWORKER_IDLE_POLL_INTERVAL") && c.LongPoll == 0 && c.IdlePollInterval < minIdlePollInterval {
		errs = append(errs, fmt.Errorf("EXTWORKER_IDLE_POLL_INTERVAL %v with EXTWORKER_LONG_POLL 0: must be at least %v, "+
			"or idle polls follow each other back to back", c.IdlePollInterval, minIdlePollInterval))
	}
	if ok("EXTWORKER_REPORT_RETRY_FOR") && c.ReportRetryFor < 0 {
		errs = append(errs, fmt.Errorf("EXTWORKER_REPORT_RETRY_FOR %v: must not be negative", c.ReportRetryFor))
	}
	if ok("EXTWORKER_LOCK_WATCH") && (c.LockWatch < 0 || (c.LockWatch > 0 && c.LockWatch < time.Second)) {
		errs = append(errs, fmt.Errorf("EXTWORKER_LOCK_WATCH %v: must be at least 1s (each watch is a query per topic), or 0 to turn the lock watch off", c.LockWatch))
	}
	if ok("EXTWORKER_IDLE_POLL_INTERVAL") && c.IdlePollInterval < 0 {
		errs = append(errs, fmt.Errorf("EXTWORKER_IDLE_POLL_INTERVAL %v: must not be negative", c.IdlePollInterval))
	}
	return errs
}

// shutdownProblems: the grace for running handlers and the bound on the whole stop.
func (c Config) shutdownProblems() []error {
	var errs []error
	ok := c.parsed
	graceOK := ok("EXTWORKER_SHUTDOWN_GRACE") && c.ShutdownGrace >= 0
	if ok("EXTWORKER_SHUTDOWN_GRACE") && !graceOK {
		errs = append(errs, fmt.Errorf("EXTWORKER_SHUTDOWN_GRACE %v: must not be negative", c.ShutdownGrace))
	}
	// Past the timeout the worker stops waiting for handlers; at or under the grace it
	// would cut the grace short.
	if graceOK && ok("EXTWORKER_SHUTDOWN_TIMEOUT") && c.ShutdownTimeout <= c.ShutdownGrace {
		errs = append(errs, fmt.Errorf("EXTWORKER_SHUTDOWN_TIMEOUT %v must be longer than EXTWORKER_SHUTDOWN_GRACE %v: "+
			"it bounds the whole shutdown, the grace for running handlers included", c.ShutdownTimeout, c.ShutdownGrace))
	}
	return errs
}

// minLockDuration is the shortest EXTWORKER_LOCK_DURATION accepted. Short locks are for
// tests of lock loss; production locks are tens of seconds (default 20s).
const minLockDuration = time.Second

// minIdlePollInterval is the shortest pause between idle polls accepted without a long
// poll.
const minIdlePollInterval = 100 * time.Millisecond

// authMethod names the engine authentication configured: "", "basic", "bearer" or "oauth2".
func (c Config) authMethods() []string {
	var m []string
	if c.EngineUser != "" || c.EnginePassword != "" {
		m = append(m, "basic")
	}
	if c.EngineToken != "" {
		m = append(m, "bearer")
	}
	if c.EngineOAuthTokenURL != "" || c.EngineOAuthClientID != "" || c.EngineOAuthClientSecret != "" || len(c.EngineOAuthScopes) > 0 {
		m = append(m, "oauth2")
	}
	return m
}

// AuthVars names the variables of an authentication method, for messages.
var AuthVars = map[string]string{
	"basic":  "EXTWORKER_ENGINE_USER and EXTWORKER_ENGINE_PASSWORD",
	"bearer": "EXTWORKER_ENGINE_TOKEN",
	"oauth2": "EXTWORKER_ENGINE_OAUTH_TOKEN_URL, EXTWORKER_ENGINE_OAUTH_CLIENT_ID and EXTWORKER_ENGINE_OAUTH_CLIENT_SECRET (scopes: EXTWORKER_ENGINE_OAUTH_SCOPES)",
}

// authProblems checks that at most one authentication method is configured, completely.
func (c Config) authProblems() []error {
	var errs []error
	methods := c.authMethods()
	if len(methods) > 1 {
		var vars []string
		for _, m := range methods {
			vars = append(vars, m+" ("+AuthVars[m]+")")
		}
		errs = append(errs, fmt.Errorf("engine authentication: choose one of %s", strings.Join(vars, ", ")))
	}
	if c.EngineUser != "" && c.EnginePassword == "" {
		errs = append(errs, errors.New("EXTWORKER_ENGINE_PASSWORD (or EXTWORKER_ENGINE_PASSWORD_FILE) is required with EXTWORKER_ENGINE_USER"))
	}
	if c.EnginePassword != "" && c.EngineUser == "" {
		errs = append(errs, errors.New("EXTWORKER_ENGINE_USER is required with EXTWORKER_ENGINE_PASSWORD"))
	}
	if slices.Contains(methods, "oauth2") {
		if c.EngineOAuthTokenURL == "" {
			errs = append(errs, errors.New("EXTWORKER_ENGINE_OAUTH_TOKEN_URL is required for OAuth2 client credentials"))
		} else if err := checkHTTPURL(c.EngineOAuthTokenURL); err != nil {
			errs = append(errs, fmt.Errorf("EXTWORKER_ENGINE_OAUTH_TOKEN_URL %s: %w", RedactURL(c.EngineOAuthTokenURL), err))
		} else if hasUserInfo(c.EngineOAuthTokenURL) {
			errs = append(errs, errors.New("EXTWORKER_ENGINE_OAUTH_TOKEN_URL has credentials in its user part (not shown): "+
				"put the client credentials in EXTWORKER_ENGINE_OAUTH_CLIENT_ID and EXTWORKER_ENGINE_OAUTH_CLIENT_SECRET"))
		}
		if plaintextAuthURL(c.EngineOAuthTokenURL) && !c.EngineAllowPlaintextAuth {
			errs = append(errs, fmt.Errorf("EXTWORKER_ENGINE_OAUTH_TOKEN_URL %s is plain http to a host that is not loopback: "+
				"the client secret (EXTWORKER_ENGINE_OAUTH_CLIENT_SECRET) would travel in clear; use https, "+
				"or set EXTWORKER_ENGINE_ALLOW_PLAINTEXT_AUTH=true", RedactURL(c.EngineOAuthTokenURL)))
		}
		if c.EngineOAuthClientID == "" {
			errs = append(errs, errors.New("EXTWORKER_ENGINE_OAUTH_CLIENT_ID is required for OAuth2 client credentials"))
		}
		if c.EngineOAuthClientSecret == "" {
			errs = append(errs, errors.New("EXTWORKER_ENGINE_OAUTH_CLIENT_SECRET (or EXTWORKER_ENGINE_OAUTH_CLIENT_SECRET_FILE) is required for OAuth2 client credentials"))
		}
	}
	if len(methods) == 1 && plaintextAuthURL(c.EngineURL) && !c.EngineAllowPlaintextAuth {
		errs = append(errs, fmt.Errorf("EXTWORKER_ENGINE_URL %s is plain http to a host that is not loopback: %s would travel in clear; "+
			"use https, or set EXTWORKER_ENGINE_ALLOW_PLAINTEXT_AUTH=true", RedactURL(c.EngineURL), plaintextSecrets[methods[0]]))
	}
	return errs
}

// plaintextSecrets names what each authentication method sends to the engine, for messages.
var plaintextSecrets = map[string]string{
	"basic":  "the password (EXTWORKER_ENGINE_PASSWORD)",
	"bearer": "the bearer token (EXTWORKER_ENGINE_TOKEN)",
	"oauth2": "the OAuth2 access token",
}

// plaintextAuthURL reports whether raw is a plain http:// URL to a host that is not
// loopback: credentials sent there can be read on the way. A URL that does not parse is
// not one (checkHTTPURL reports it).
func plaintextAuthURL(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && u.Scheme == "http" && !loopbackHost(u.Hostname())
}

// loopbackHost reports whether host (no port, no brackets) is localhost or a loopback IP
// address: traffic to it does not leave the machine.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkAMQPURL accepts amqps://, and amqp:// to a loopback host or when allowPlaintext.
func checkAMQPURL(raw string, allowPlaintext bool) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return errors.New(notAURLHint)
	case u.Scheme != "amqp" && u.Scheme != "amqps":
		return fmt.Errorf("scheme %q: want amqps (or amqp)", u.Scheme)
	case u.Host == "":
		return errors.New("no host")
	case u.Scheme == "amqp" && !loopbackHost(u.Hostname()) && !allowPlaintext:
		return errors.New("amqp:// sends the password and the events in clear to a host that is not loopback: use amqps://, or set EXTWORKER_AMQP_ALLOW_PLAINTEXT=true")
	}
	return nil
}

// engineURLProblems refuses what EXTWORKER_ENGINE_URL must not hold: credentials in its
// user part (sent as Basic authentication past EXTWORKER_ENGINE_ALLOW_PLAINTEXT_AUTH's
// check, and shown wherever the URL is: a token as the user name is not masked as a
// password is), and a query string or fragment (the REST API is addressed by path, so
// such a URL never works, and it would end up in the derived Cockpit link). Neither is
// echoed.
func engineURLProblems(raw string) []error {
	u, err := url.Parse(raw)
	if err != nil {
		return nil // checkHTTPURL reports it
	}
	var errs []error
	// An @ anywhere is a credential: a password with an unescaped / is read as a host,
	// port and path (http://u:1234/secret@host/...), and the "path" would be logged.
	if _, rest, _ := strings.Cut(raw, "://"); u.User != nil || strings.Contains(rest, "@") {
		errs = append(errs, errors.New("EXTWORKER_ENGINE_URL has credentials in its user part (not shown): remove them, and "+
			"put the credentials in EXTWORKER_ENGINE_USER and EXTWORKER_ENGINE_PASSWORD (or the token variables)"))
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(raw, "#") {
		errs = append(errs, errors.New("EXTWORKER_ENGINE_URL has a query string or fragment (not shown): the engine's REST root "+
			"is a scheme, host and path only (a # or ? in a password must be percent-encoded, and credentials go in their own variables)"))
	}
	return errs
}

// hasUserInfo reports whether raw parses as a URL with user info.
func hasUserInfo(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && u.User != nil
}

// notAURLHint is the problem with a URL that does not parse, and its likeliest cause.
const notAURLHint = "not a URL (a #, /, ?, @ or % in a password must be percent-encoded: %23, %2F, %3F, %40, %25)"

// checkHTTPURL accepts an absolute http or https URL.
func checkHTTPURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return errors.New(notAURLHint)
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("scheme must be http or https")
	case u.Host == "":
		return errors.New("no host")
	}
	return nil
}

// SSLModes are the PostgreSQL TLS modes pgx understands, weakest first.
var SSLModes = []string{"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}

// CheckDatabaseURL checks EXTWORKER_DATABASE_URL's sslmode, then lets pgx parse it (which
// also reads sslrootcert, sslcert and sslkey). Messages show the URL without its password.
func CheckDatabaseURL(dsn string) error {
	if mode, ok := dsnParam(dsn, "sslmode"); ok && !slices.Contains(SSLModes, mode) {
		return fmt.Errorf("EXTWORKER_DATABASE_URL %s: sslmode %q: want one of %s", RedactURL(dsn), mode, strings.Join(SSLModes, ", "))
	}
	if _, err := DatabaseConfig(dsn); err != nil {
		msg := Scrub(err.Error(), dsnSecrets(dsn)...)
		if _, perr := url.Parse(dsn); perr != nil && strings.Contains(dsn, "://") {
			msg = notAURLHint // pgx's message quotes the URL, its password's tail included
		}
		return fmt.Errorf("EXTWORKER_DATABASE_URL %s: %s", RedactURL(dsn), msg)
	}
	return nil
}

// DatabaseConfig parses EXTWORKER_DATABASE_URL for pgx. When neither the URL (sslmode, or
// its URL alias ssl) nor PGSSLMODE chooses a TLS mode and a host is not loopback or a unix
// socket, the URL gets sslmode=verify-full: pgx's default, prefer, neither verifies the
// server nor refuses plaintext when TLS fails, so anyone on the path could read the
// ledger's traffic or pose as the database. An explicit sslmode is honoured
// (databaseTLSWarning warns of the weak ones).
//
// Without connect_timeout (nor PGCONNECT_TIMEOUT) each host gets defaultConnectTimeout:
// with a primary and its standby in one URL, a first host that takes connections and
// never answers would otherwise hold every connection attempt for the whole statement's
// deadline, and the promoted standby would never be tried (docs/failover.md).
func DatabaseConfig(dsn string) (*pgxpool.Config, error) {
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err == nil && sslModeChoice(dsn) == "" && !localDatabase(pcfg.ConnConfig.Config) {
		pcfg, err = pgxpool.ParseConfig(withSSLMode(dsn, "verify-full"))
	}
	if err != nil {
		return pcfg, err
	}
	if _, set := dsnParam(dsn, "connect_timeout"); !set && os.Getenv("PGCONNECT_TIMEOUT") == "" {
		pcfg.ConnConfig.ConnectTimeout = defaultConnectTimeout
	}
	return pcfg, nil
}

// defaultConnectTimeout bounds connecting to each of the ledger database's hosts when its
// URL does not say.
const defaultConnectTimeout = 5 * time.Second

// sslModeChoice names what chooses the TLS mode, for messages: "sslmode=require" (or the
// URL alias "ssl=true") in dsn, or "PGSSLMODE=require" in the environment; "" when nothing
// does and pgx's default applies.
func sslModeChoice(dsn string) string {
	if v, ok := dsnParam(dsn, "sslmode"); ok {
		return "sslmode=" + v
	}
	if v, ok := dsnParam(dsn, "ssl"); ok {
		return "ssl=" + v
	}
	if v := os.Getenv("PGSSLMODE"); v != "" {
		return "PGSSLMODE=" + v
	}
	return ""
}

// withSSLMode adds sslmode=mode to a connection URL or key=value string that has none.
func withSSLMode(dsn, mode string) string {
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return dsn + " sslmode=" + mode
	}
	frag := ""
	if i := strings.IndexByte(dsn, '#'); i >= 0 {
		dsn, frag = dsn[:i], dsn[i:]
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "sslmode=" + mode + frag
}

// DatabaseHosts lists the hosts pgx will try, with the TLS configuration of each attempt
// (nil: plaintext).
func DatabaseHosts(cc pgconn.Config) []*pgconn.FallbackConfig {
	return append([]*pgconn.FallbackConfig{{Host: cc.Host, Port: cc.Port, TLSConfig: cc.TLSConfig}}, cc.Fallbacks...)
}

// isLocalDatabaseHost reports whether a pgx host is a unix socket or loopback.
func isLocalDatabaseHost(h *pgconn.FallbackConfig) bool {
	network, _ := pgconn.NetworkAddress(h.Host, h.Port)
	return network == "unix" || loopbackHost(h.Host)
}

// localDatabase reports whether every host pgx will try is a unix socket or loopback.
func localDatabase(cc pgconn.Config) bool {
	for _, h := range DatabaseHosts(cc) {
		if !isLocalDatabaseHost(h) {
			return false
		}
	}
	return true
}

// DatabaseTLSWarning describes how an explicitly chosen sslmode leaves the connection to a
// host that is not loopback open (plaintext, or TLS without verifying the server), or
// returns "" when it does not. It names the host and the mode, never the URL's secrets.
func DatabaseTLSWarning(dsn string, pcfg *pgxpool.Config) string {
	choice := sslModeChoice(dsn)
	if choice == "" {
		choice = "its TLS settings" // a service file's, say
	}
	var unverified string
	for _, h := range DatabaseHosts(pcfg.ConnConfig.Config) {
		switch {
		case isLocalDatabaseHost(h):
		case h.TLSConfig == nil: // disable, or the fallback of allow and prefer
			return fmt.Sprintf("EXTWORKER_DATABASE_URL: %s lets the connection to the ledger database at %s go without TLS: "+
				"anyone on the path can read and change it; use sslmode=verify-full (sslrootcert= for a private CA)", choice, h.Host)
		case h.TLSConfig.InsecureSkipVerify && h.TLSConfig.VerifyPeerCertificate == nil && unverified == "": // require
			unverified = fmt.Sprintf("EXTWORKER_DATABASE_URL: %s encrypts the connection to the ledger database at %s but does not "+
				"verify the server's certificate: anyone on the path can pose as the database; use sslmode=verify-full "+
				"(sslrootcert= for a private CA)", choice, h.Host)
		}
	}
	return unverified
}

func NewLogger(c Config, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.LogLevel))
	terminal := false
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			terminal = true
		}
	}
	format := c.LogFormat
	if format == "auto" {
		format = "json"
		if terminal {
			format = "text"
		}
	}
	if format == "text" {
		// Colours only on a terminal: in a file they are escape sequences.
		// Process data in messages and attributes is escaped (termsafeHandler).
		return slog.New(termsafeHandler{tint.NewHandler(w, &tint.Options{Level: lvl, TimeFormat: time.TimeOnly, NoColor: !terminal})})
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lvl, ReplaceAttr: durationText}))
}

// durationText writes a time.Duration as Go writes it ("20s", "1m30s"), not as the
// nanoseconds slog's JSON handler gives it.
func durationText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

func NewClient(c Config, logger *slog.Logger) (*camunda7.Client, error) {
	cc := camunda7.Config{BaseURL: c.EngineURL, Username: c.EngineUser, Password: c.EnginePassword,
		BearerToken: c.EngineToken, AllowPlaintextAuth: c.EngineAllowPlaintextAuth, Timeout: c.EngineTimeout, Logger: logger}
	tc, err := c.engineTLS()
	if err != nil {
		return nil, err
	}
	cc.TLS = tc
	if c.EngineOAuthTokenURL != "" {
		if plaintextAuthURL(c.EngineOAuthTokenURL) {
			if !c.EngineAllowPlaintextAuth {
				return nil, fmt.Errorf("EXTWORKER_ENGINE_OAUTH_TOKEN_URL %s is plain http to a host that is not loopback: "+
					"set EXTWORKER_ENGINE_ALLOW_PLAINTEXT_AUTH=true to send the client secret in clear", RedactURL(c.EngineOAuthTokenURL))
			}
			if logger != nil {
				logger.Warn("the OAuth2 client secret travels in clear over plain HTTP (EXTWORKER_ENGINE_ALLOW_PLAINTEXT_AUTH); use https",
					slog.String("token_url", RedactURL(c.EngineOAuthTokenURL)))
			}
		}
		cc.TokenSource = NewOAuthTokenSource(c, tc)
	}
	return camunda7.New(cc)
}

// engineTLS is the TLS configuration for the engine and its token endpoint: nil (the
// system roots) unless a CA bundle or a client certificate is configured.
func (c Config) engineTLS() (*tls.Config, error) {
	if c.EngineCAFile == "" && c.EngineCertFile == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.EngineCAFile != "" {
		pem, err := os.ReadFile(c.EngineCAFile)
		if err != nil {
			return nil, fmt.Errorf("EXTWORKER_ENGINE_CA_FILE: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("EXTWORKER_ENGINE_CA_FILE %s: no PEM certificates", c.EngineCAFile)
		}
	}
	if c.EngineCertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.EngineCertFile, c.EngineKeyFile)
		if err != nil {
			return nil, fmt.Errorf("EXTWORKER_ENGINE_CERT_FILE/KEY_FILE: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// OpenLedger connects to the ledger database and checks it is migrated (unless migrating
// is what the caller is about to do).
func OpenLedger(ctx context.Context, c Config, logger *slog.Logger, requireMigrated bool) (*idempotency.Ledger, *pgxpool.Pool, error) {
	pcfg, err := LedgerPoolConfig(c)
	if err != nil {
		return nil, nil, err
	}
	if w := DatabaseTLSWarning(c.DatabaseURL, pcfg); w != "" {
		logger.Warn(w)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, fmt.Errorf("EXTWORKER_DATABASE_URL: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("ledger database at %s: %w", RedactURL(c.DatabaseURL), err)
	}
	if requireMigrated {
		db := stdlib.OpenDBFromPool(pool)
		err := migrations.Check(ctx, db)
		db.Close()
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
	}
	l, err := idempotency.New(pool, idempotency.Config{Namespace: c.LedgerNamespace, Lease: c.LedgerLease, ProviderWindow: c.ProviderWindow,
		ApprovalThreshold: c.ApprovalThreshold, Logger: logger})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return l, pool, nil
}

// LedgerPoolConfig is the ledger pool's configuration: EXTWORKER_DATABASE_URL, capped.
func LedgerPoolConfig(c Config) (*pgxpool.Config, error) {
	pcfg, err := DatabaseConfig(c.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("EXTWORKER_DATABASE_URL: %w", err)
	}
	// The pool is capped at EXTWORKER_LEDGER_MAX_CONNS (10), not sized to the
	// concurrency: every replica opens up to that many connections, and a pool per
	// handler (3 replicas x 200) would exhaust PostgreSQL's max_connections (100 by
	// default). Each ledger step is one short transaction (a few milliseconds; nothing
	// holds a connection across a provider call), so handlers beyond the cap queue briefly
	// for a connection, within the ledger's write timeout. pool_max_conns in the URL wins.
	// (A config built in code without it keeps pgx's default.)
	if !strings.Contains(c.DatabaseURL, "pool_max_conns") && c.LedgerMaxConns > 0 {
		pcfg.MaxConns = int32(min(c.LedgerMaxConns, math.MaxInt32))
	}
	return pcfg, nil
}

// OpenInboxPool opens a pool of conns connections to EXTWORKER_DATABASE_URL for an inbox
// consumer (package inbox): each message in hand holds a connection (its lock) across
// the engine's calls, which the ledger's handlers must not queue behind.
func OpenInboxPool(ctx context.Context, c Config, conns int) (*pgxpool.Pool, error) {
	pcfg, err := DatabaseConfig(c.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("EXTWORKER_DATABASE_URL: %w", err)
	}
	pcfg.MaxConns, pcfg.MinConns = int32(min(max(conns, 1), math.MaxInt32)), 0
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("EXTWORKER_DATABASE_URL: %w", err)
	}
	return pool, nil
}

// rolePrefix is what EXTWORKER_DATABASE_ROLE_PREFIX may be: role names stay unquoted
// identifiers.
var rolePrefix = regexp.MustCompile(`^[a-z][a-z0-9_]{0,39}$`)

// checkRolePrefix refuses a role prefix that is not one (the empty one included, which
// would name the roles _worker, _operator and _console).
func checkRolePrefix(p string) error {
	if !rolePrefix.MatchString(p) {
		return fmt.Errorf("EXTWORKER_DATABASE_ROLE_PREFIX %q: want a lower-case SQL identifier of at most 40 letters, digits and underscores, starting with a letter", p)
	}
	return nil
}

// Migrate applies the ledger's migrations, then records in the database what it
// enforces: the role names (EXTWORKER_DATABASE_ROLE_PREFIX) with their grants, and the
// namespace's approval threshold. It warns when every login of the cluster may connect.
// A Config not from LoadConfig must name its role prefix: Migrate refuses one without
// before it connects (with "", the ledger's roles would become _worker, _operator and
// _console, and the roles it named lose every right on its tables at once).
func Migrate(ctx context.Context, c Config, out io.Writer) error {
	if err := checkRolePrefix(c.DatabaseRolePrefix); err != nil {
		return err
	}
	pcfg, err := DatabaseConfig(c.DatabaseURL)
	if err != nil {
		return fmt.Errorf("EXTWORKER_DATABASE_URL: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("EXTWORKER_DATABASE_URL: %w", err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	where := RedactURL(c.DatabaseURL)
	applied, err := migrations.Up(ctx, db)
	if err != nil {
		return fmt.Errorf("ledger database at %s: %w", where, err)
	}
	if len(applied) == 0 {
		fmt.Fprintln(out, "ledger database is up to date")
	} else {
		fmt.Fprintf(out, "applied migrations %v\n", applied)
	}
	roles, err := migrations.ReadRoles(ctx, db)
	if err != nil {
		return fmt.Errorf("ledger database at %s: %w", where, err)
	}
	if want := migrations.RolesFor(c.DatabaseRolePrefix); roles != want {
		if _, err := migrations.SetRoles(ctx, db, want); err != nil {
			return fmt.Errorf("ledger database at %s: %w", where, err)
		}
		fmt.Fprintf(out, "ledger roles are now %s, %s and %s (EXTWORKER_DATABASE_ROLE_PREFIX); %s, %s and %s keep what they were granted until a DBA revokes it\n",
			want.Worker, want.Operator, want.Console, roles.Worker, roles.Operator, roles.Console)
	}
	if err := idempotency.SetApprovalThreshold(ctx, pool, c.LedgerNamespace, c.ApprovalThreshold); err != nil {
		return fmt.Errorf("ledger database at %s: %w", where, err)
	}
	if public, name, err := migrations.PublicCanConnect(ctx, db); err != nil {
		return fmt.Errorf("ledger database at %s: %w", where, err)
	} else if public {
		fmt.Fprintf(out, "warning: every login of the cluster may connect to database %s (PUBLIC has CONNECT). "+
			"Run REVOKE CONNECT ON DATABASE %s FROM PUBLIC, then GRANT CONNECT to the ledger's roles (docs/operators.md#database-roles)\n", name, name)
	}
	return nil
}

func (c Config) WorkerConfig(logger *slog.Logger) tasks.Config {
	longPoll := c.LongPoll
	if longPoll == 0 {
		longPoll = tasks.NoLongPoll // idle polls paced by EXTWORKER_IDLE_POLL_INTERVAL
	}
	return tasks.Config{WorkerID: c.WorkerID, MaxConcurrency: c.MaxConcurrency, AsyncResponseTimeout: longPoll,
		ReportRetryFor: orNone(c.ReportRetryFor), IdlePollInterval: orNone(c.IdlePollInterval),
		ShutdownGrace: orNone(c.ShutdownGrace), ShutdownTimeout: c.ShutdownTimeout, LockWatch: c.lockWatch(), Logger: logger}
}

// lockWatch is tasks.Config.LockWatch: derived by the worker when EXTWORKER_LOCK_WATCH is
// unset, off (negative) when it is 0.
func (c Config) lockWatch() time.Duration {
	if c.lockWatchSet && c.LockWatch == 0 {
		return -1
	}
	return c.LockWatch
}

// orNone passes a duration to tasks.Config, where 0 would mean its default: a variable
// set to 0 means none, so 0 becomes the shortest positive duration.
func orNone(d time.Duration) time.Duration {
	if d == 0 {
		return time.Nanosecond
	}
	return d
}

// RedactURL hides credentials (user info, and password or sslpassword parameters) in a
// URL or a key=value connection string, for messages. All user info goes, a user name
// alone too (a token), up to the last @: a password may hold an unescaped @.
func RedactURL(u string) string {
	if j := strings.Index(u, "://"); j > 0 {
		if i := strings.LastIndex(u[j+3:], "@"); i >= 0 {
			u = u[:j+3] + "***" + u[j+3+i:]
		}
	}
	return MaskParams(u)
}

// MaskParams replaces the values of password-like parameters (password=, sslpassword=)
// in a URL's query or a key=value connection string with ***.
func MaskParams(u string) string {
	for _, key := range []string{"sslpassword=", "password="} {
		from := 0
		for {
			i := strings.Index(u[from:], key)
			if i < 0 {
				break
			}
			i += from
			start := i + len(key)
			end := strings.IndexAny(u[start:], "& ")
			if strings.HasPrefix(u[start:], "'") { // key='quoted value'
				if end = strings.IndexByte(u[start+1:], '\''); end >= 0 {
					end += 2
				}
			}
			if end < 0 {
				end = len(u) - start
			}
			if u[start:start+end] != "***" {
				u = u[:start] + "***" + u[start+end:]
			}
			from = start + 3
		}
	}
	return u
}
