package daemon

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"path"
	"strings"
)

// consoleProblems checks the operator console's variables, which matter only when
// EXTWORKER_CONSOLE_ADDR turns it on: exactly one way of authenticating operators, TLS
// files in pairs, proxies that parse.
func (c Config) consoleProblems() []error {
	if c.ConsoleAddr == "" {
		return nil
	}
	var errs []error
	if _, _, err := net.SplitHostPort(c.ConsoleAddr); err != nil {
		errs = append(errs, fmt.Errorf("EXTWORKER_CONSOLE_ADDR %q: want host:port: %w", c.ConsoleAddr, err))
	}
	switch {
	case c.ConsoleOperatorsFile == "" && c.ConsoleAuthHeader == "":
		errs = append(errs, errors.New("EXTWORKER_CONSOLE_ADDR needs a way to authenticate operators: "+
			"EXTWORKER_CONSOLE_OPERATORS_FILE (name:bcrypt-hash lines) or EXTWORKER_CONSOLE_AUTH_HEADER (a reverse proxy's user header); see docs/console.md"))
	case c.ConsoleOperatorsFile != "" && c.ConsoleAuthHeader != "":
		errs = append(errs, errors.New("EXTWORKER_CONSOLE_OPERATORS_FILE and EXTWORKER_CONSOLE_AUTH_HEADER: set one, not both"))
	}
	if c.ConsoleAuthHeader != "" && len(c.ConsoleTrustedProxies) == 0 {
		errs = append(errs, errors.New("EXTWORKER_CONSOLE_AUTH_HEADER needs EXTWORKER_CONSOLE_TRUSTED_PROXIES: "+
			"the addresses of the proxy that sets it, so that nobody else can name an operator"))
	}
	if _, err := ConsoleTrustedProxies(c.ConsoleTrustedProxies); err != nil {
		errs = append(errs, err)
	}
	if (c.ConsoleTLSCertFile == "") != (c.ConsoleTLSKeyFile == "") {
		errs = append(errs, errors.New("EXTWORKER_CONSOLE_TLS_CERT_FILE and EXTWORKER_CONSOLE_TLS_KEY_FILE must be set together"))
	}
	if c.parsed("EXTWORKER_CONSOLE_SESSION_TTL") && c.ConsoleSessionTTL <= 0 {
		errs = append(errs, fmt.Errorf("EXTWORKER_CONSOLE_SESSION_TTL %v: must be positive", c.ConsoleSessionTTL))
	}
	if c.ConsoleDatabaseURL != "" {
		if err := CheckDatabaseURL(c.ConsoleDatabaseURL); err != nil {
			errs = append(errs, fmt.Errorf("EXTWORKER_CONSOLE_DATABASE_URL: %w", err))
		}
	}
	return errs
}

// ConsoleTrustedProxies parses EXTWORKER_CONSOLE_TRUSTED_PROXIES: CIDRs, or single
// addresses.
func ConsoleTrustedProxies(list []string) ([]netip.Prefix, error) {
	return trustedProxies("EXTWORKER_CONSOLE_TRUSTED_PROXIES", list)
}

// trustedProxies parses variable's list of CIDRs or single addresses.
func trustedProxies(variable string, list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%s %q: want CIDRs (10.0.0.0/8) or addresses, comma-separated", variable, s)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

// ConsoleDatabase is the console's login to the ledger: EXTWORKER_CONSOLE_DATABASE_URL,
// or the worker's.
func (c Config) ConsoleDatabase() string {
	if c.ConsoleDatabaseURL != "" {
		return c.ConsoleDatabaseURL
	}
	return c.DatabaseURL
}

// Derived is a value the program derives for a variable left unset, and the variable it
// derives it from, as `extworker config` shows it.
type Derived struct {
	Value, From string
}

// derived is what `extworker config` shows for the variables whose default is derived
// from another one: EXTWORKER_CONSOLE_COCKPIT_URL from the engine's URL, or why none is.
func (c Config) derived() map[string]Derived {
	if c.ConsoleCockpitURL != "" {
		return nil
	}
	v := c.CockpitURL()
	if v == "" {
		v = noCockpitURL
	}
	return map[string]Derived{"EXTWORKER_CONSOLE_COCKPIT_URL": {Value: v, From: "EXTWORKER_ENGINE_URL"}}
}

// noCockpitURL is what `extworker config` shows when no Cockpit link is derived.
const noCockpitURL = "(none: EXTWORKER_ENGINE_URL's path does not end in /engine-rest; set EXTWORKER_CONSOLE_COCKPIT_URL)"

// CockpitURL is where the console links into Cockpit: EXTWORKER_CONSOLE_COCKPIT_URL, or
// the engine's address with /camunda in place of a final /engine-rest (the
// distribution's layout), without credentials, query or fragment. An engine URL whose
// path (cleaned) does not end in /engine-rest derives none: "" (no Cockpit links).
func (c Config) CockpitURL() string {
	if c.ConsoleCockpitURL != "" {
		return strings.TrimSuffix(c.ConsoleCockpitURL, "/")
	}
	u, err := url.Parse(c.EngineURL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return ""
	}
	p := path.Clean("/" + u.EscapedPath())
	if p != "/engine-rest" && !strings.HasSuffix(p, "/engine-rest") {
		return ""
	}
	return u.Scheme + "://" + u.Host + strings.TrimSuffix(p, "engine-rest") + "camunda"
}
