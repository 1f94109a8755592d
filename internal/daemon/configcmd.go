package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"reflect"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/internal/termsafe"
	"github.com/extworker/extworker/internal/tracing"
)

// masked replaces a secret's value in `extworker config`.
const masked = "***"

// ConfigCommand prints the effective configuration: every EXTWORKER_ variable with its
// value (defaults applied) and where it came from, secrets masked, then whether traces
// are on and where they go (the OTEL_* variables, package tracing; the endpoint without
// credentials). With an invalid configuration it prints what it could read, then returns
// every problem.
func ConfigCommand(args []string, stdout, stderr io.Writer, specs ...any) error {
	fs := flag.NewFlagSet("config", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print a JSON object of variable: value")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, err := LoadConfig()
	var ce ConfigError
	if err != nil && !errors.As(err, &ce) {
		return err
	}
	ops, opsInvalid, _ := ReadOpsConfig() // its problems are in err already
	sets := []VarSet{{Vars: c.vars(), FromFile: c.fromFile, Invalid: c.invalid, Derived: c.derived()}, {Vars: SpecVars(&ops), Invalid: opsInvalid}}
	for _, spec := range specs {
		sets = append(sets, VarSet{Vars: SpecVars(spec)})
	}
	traces, terr := tracing.Read(os.LookupEnv)
	tracesLine := traces.String()
	if terr != nil {
		tracesLine = "invalid: " + terr.Error()
		err = errors.Join(err, ConfigError{terr})
	}
	if perr := printConfig(sets, os.LookupEnv, tracesLine, *asJSON, stdout); perr != nil {
		return perr
	}
	return c.ScrubError(err)
}

// VarSet is the variables of one configuration struct (config, opsConfig) with the
// secrets read from files, the values that did not parse, and the values derived from
// other variables for those left unset.
type VarSet struct {
	Vars     []ConfigVar
	FromFile map[string]string
	Invalid  map[string]string
	Derived  map[string]Derived
}

// Effective is one variable as `extworker config` shows it.
type Effective struct {
	Name, Value, Source string
}

// EffectiveConfig lists the variables with their masked values and sources: "env",
// "file PATH", "default", "derived from VARIABLE" for an unset variable whose value the
// program derives, or "env (invalid)" for a value that did not parse (shown as given,
// unless it is a secret).
func EffectiveConfig(sets []VarSet, lookup func(string) (string, bool)) []Effective {
	var out []Effective
	for _, set := range sets {
		for _, cv := range set.Vars {
			e := Effective{Name: cv.Name, Value: formatValue(cv.field), Source: "default"}
			if v, ok := lookup(cv.Name); ok && v != "" {
				e.Source = "env"
			}
			if path, ok := set.FromFile[cv.Name]; ok {
				e.Source = "file " + path
			}
			if d, ok := set.Derived[cv.Name]; ok && e.Value == "" && e.Source == "default" {
				e.Value, e.Source = d.Value, "derived from "+d.From
			}
			if raw, ok := set.Invalid[cv.Name]; ok {
				e.Value, e.Source = raw, "env (invalid)"
			}
			switch {
			case e.Value == "":
			case cv.secret == "true":
				e.Value = masked
			case cv.secret == "url" || strings.Contains(e.Value, "://"):
				// Every URL, tagged secret or not (the OAuth2 token endpoint's, Cockpit's),
				// may carry a password in its user info.
				e.Value = MaskURL(e.Value)
			}
			out = append(out, e)
		}
	}
	return out
}

func formatValue(v reflect.Value) string {
	switch x := v.Interface().(type) {
	case []string:
		return strings.Join(x, ",")
	case time.Duration:
		return x.String()
	}
	return fmt.Sprint(v.Interface())
}

// MaskURL keeps a URL or connection string readable (user, host, database, parameters)
// and masks its password and password-like parameters. A URL that does not parse is not
// shown at all (its password cannot be told from the rest: a # or / in it), nor one with
// an @ past its user info (a password with an unescaped @, /, ? or # that Go reads as
// the host, path, query or fragment). An http(s) URL's user name alone is masked too: it
// is sent as Basic authentication, often a token.
func MaskURL(s string) string {
	i := strings.Index(s, "://")
	if i < 0 {
		return MaskParams(s) // key=value connection string
	}
	u, err := url.Parse(s)
	if err != nil {
		return notAURL
	}
	rest := s[i+3:]
	userinfo := ""
	if u.User != nil {
		at := strings.LastIndex(rest, "@")
		if at < 0 {
			return notAURL
		}
		userinfo, rest = rest[:at], rest[at+1:]
	}
	if strings.Contains(rest, "@") {
		return notAURL
	}
	if u.User != nil {
		_, hasPassword := u.User.Password()
		switch {
		case hasPassword:
			user, _, _ := strings.Cut(userinfo, ":")
			userinfo = user + ":" + masked
		case u.Scheme == "http" || u.Scheme == "https":
			userinfo = masked
		}
		rest = userinfo + "@" + rest
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		rest = maskQuery(rest) // a token or client secret as a parameter
	}
	return MaskParams(s[:i+3] + rest)
}

// maskQuery masks every value of a URL's query string and drops its fragment: outside a
// connection string (whose parameters MaskParams knows), any of them may be a token.
func maskQuery(rest string) string {
	rest, _, _ = strings.Cut(rest, "#")
	base, query, ok := strings.Cut(rest, "?")
	if !ok {
		return rest
	}
	params := strings.Split(query, "&")
	for j, kv := range params {
		if k, _, hasValue := strings.Cut(kv, "="); hasValue {
			params[j] = k + "=" + masked
		}
	}
	return base + "?" + strings.Join(params, "&")
}

// notAURL is what `extworker config` shows for a URL variable whose value does not parse.
const notAURL = "(not shown: not a URL)"

// printConfig prints the variables, then traces (a line, or the JSON object's "traces").
func printConfig(sets []VarSet, lookup func(string) (string, bool), traces string, asJSON bool, w io.Writer) error {
	vars := EffectiveConfig(sets, lookup)
	if asJSON {
		m := make(map[string]string, len(vars)+1)
		for _, v := range vars {
			m[v.Name] = v.Value
		}
		m["traces"] = traces
		return printJSON(w, m)
	}
	tw := newTabWriter(w)
	fmt.Fprintln(tw, "VARIABLE\tVALUE\tFROM")
	for _, v := range vars {
		// Values come from the environment: print control characters as escapes, as the
		// JSON encoder does.
		fmt.Fprintf(tw, "%s\t%s\t%s\n", v.Name, termsafe.Value(v.Value), termsafe.Value(v.Source))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\ntraces: %s\n", traces)
	return err
}

// CheckEngine asks the engine for its version before the worker starts, so that rejected
// credentials (or a token endpoint refusing the client) end the start at once with a
// message saying which variables to check, instead of a worker failing every fetch.
func CheckEngine(ctx context.Context, c Config, logger *slog.Logger) error {
	client, err := NewClient(c, logger)
	if err != nil {
		return ConfigError{err}
	}
	defer client.CloseIdleConnections()
	return CheckClient(ctx, c, client, logger)
}

// CheckClient is CheckEngine with the client the process goes on to use (its OAuth2
// token, once fetched, serves the worker too).
func CheckClient(ctx context.Context, c Config, client *camunda7.Client, logger *slog.Logger) error {
	v, err := client.Version(ctx)
	if err == nil {
		logger.Info("engine reachable", slog.String("engine_url", RedactURL(c.EngineURL)), slog.String("version", v))
		return nil
	}
	where := RedactURL(c.EngineURL)
	if err := EngineError(c, err); errors.As(err, new(ConfigError)) {
		return err
	}
	if errors.Is(err, camunda7.ErrNotSent) || errors.Is(err, camunda7.ErrUnknownOutcome) {
		// Unreachable is not misconfigured: start anyway, and let the fetch loop back off
		// until the engine answers, instead of exiting into a supervisor's restart loop.
		logger.Warn("engine not reachable at start; the worker will keep trying", slog.String("engine_url", where), slog.Any("error", err))
		return nil
	}
	return fmt.Errorf("engine at %s: %w", where, err)
}

// EngineError is err, from a request to the engine, for a message: a ConfigError (exit
// 78), saying which variables to check, when the engine rejected the credentials or asks
// for some, or the token endpoint rejected the client; otherwise err naming the engine.
func EngineError(c Config, err error) error {
	where := RedactURL(c.EngineURL)
	methods := c.authMethods()
	var ce *camunda7.Error
	switch {
	case errors.As(err, &ce) && errors.Is(err, camunda7.ErrUnauthorized) && len(methods) == 0:
		return ConfigError{fmt.Errorf("engine at %s requires authentication (%d): set %s, %s, or %s: %w",
			where, ce.StatusCode, AuthVars["basic"], AuthVars["bearer"], AuthVars["oauth2"], err)}
	case errors.As(err, &ce) && errors.Is(err, camunda7.ErrUnauthorized):
		return ConfigError{fmt.Errorf("engine at %s rejected the credentials (%d): check %s: %w",
			where, ce.StatusCode, AuthVars[methods[0]], err)}
	case TokenRejected(err):
		return ConfigError{fmt.Errorf("engine at %s: the token endpoint rejected the client: check %s: %w",
			where, AuthVars["oauth2"], err)}
	}
	return fmt.Errorf("engine at %s: %w", where, err)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newTabWriter(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }
