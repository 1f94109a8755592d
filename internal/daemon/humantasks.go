package daemon

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/extworker/extworker/humantask"
)

// tasksProblems checks the human-task service's variables, which matter only when
// EXTWORKER_TASKS_ADDR turns it on: exactly one identity source (a proxy's header with
// the proxy's addresses, or a JWT issuer with its key set and audience), TLS files in
// pairs.
func (c Config) tasksProblems() []error {
	if c.TasksAddr == "" {
		return nil
	}
	var errs []error
	if _, _, err := net.SplitHostPort(c.TasksAddr); err != nil {
		errs = append(errs, fmt.Errorf("EXTWORKER_TASKS_ADDR %q: want host:port: %w", c.TasksAddr, err))
	}
	header, jwt := c.TasksAuthHeader != "", c.TasksJWTIssuer != "" || c.TasksJWKSURL != "" || c.TasksJWTAudience != ""
	switch {
	case !header && !jwt:
		errs = append(errs, errors.New("EXTWORKER_TASKS_ADDR needs a way to tell who sends a request: "+
			"EXTWORKER_TASKS_AUTH_HEADER (a reverse proxy's user header) or EXTWORKER_TASKS_JWT_ISSUER (bearer tokens); see docs/humantasks.md"))
	case header && jwt:
		errs = append(errs, errors.New("EXTWORKER_TASKS_AUTH_HEADER and EXTWORKER_TASKS_JWT_*: set one, not both"))
	case header:
		proxies, err := trustedProxies("EXTWORKER_TASKS_TRUSTED_PROXIES", c.TasksTrustedProxies)
		switch {
		case err != nil:
			errs = append(errs, err)
		case len(proxies) == 0:
			errs = append(errs, errors.New("EXTWORKER_TASKS_AUTH_HEADER needs EXTWORKER_TASKS_TRUSTED_PROXIES: "+
				"the addresses of the proxy that sets it, so that nobody else can name a user"))
		default:
			if _, err := humantask.NewProxyHeader(humantask.ProxyHeader{UserHeader: c.TasksAuthHeader, TrustedProxies: proxies}); err != nil {
				errs = append(errs, fmt.Errorf("EXTWORKER_TASKS_TRUSTED_PROXIES: %s", strings.TrimPrefix(err.Error(), "humantask: ")))
			}
		}
	case jwt:
		if c.TasksJWTIssuer == "" || c.TasksJWKSURL == "" || c.TasksJWTAudience == "" {
			errs = append(errs, errors.New("EXTWORKER_TASKS_JWT_ISSUER, EXTWORKER_TASKS_JWT_JWKS_URL and EXTWORKER_TASKS_JWT_AUDIENCE must be set together"))
		}
		if c.TasksJWKSURL != "" {
			if u, err := url.Parse(c.TasksJWKSURL); err != nil || u.Host == "" || (u.Scheme != "https" && !(u.Scheme == "http" && loopbackHost(u.Hostname()))) {
				errs = append(errs, fmt.Errorf("EXTWORKER_TASKS_JWT_JWKS_URL %q: want an https:// URL (http:// only on loopback)", c.TasksJWKSURL))
			}
		}
		if c.TasksJWTUserClaim == "" {
			errs = append(errs, errors.New("EXTWORKER_TASKS_JWT_USER_CLAIM: must not be empty (default sub)"))
		}
	}
	if (c.TasksTLSCertFile == "") != (c.TasksTLSKeyFile == "") {
		errs = append(errs, errors.New("EXTWORKER_TASKS_TLS_CERT_FILE and EXTWORKER_TASKS_TLS_KEY_FILE must be set together"))
	}
	if c.TasksNamespace == "" {
		errs = append(errs, errors.New("EXTWORKER_TASKS_NAMESPACE: must not be empty (default humantask)"))
	}
	return errs
}

// TasksIdentity is the human-task service's identity source, as the EXTWORKER_TASKS_*
// variables (checked by LoadConfig) describe it.
func (c Config) TasksIdentity() (humantask.IdentitySource, error) {
	if c.TasksAuthHeader != "" {
		proxies, err := trustedProxies("EXTWORKER_TASKS_TRUSTED_PROXIES", c.TasksTrustedProxies)
		if err != nil {
			return nil, err
		}
		return humantask.NewProxyHeader(humantask.ProxyHeader{UserHeader: c.TasksAuthHeader, GroupsHeader: c.TasksGroupsHeader, TrustedProxies: proxies})
	}
	return humantask.NewJWT(humantask.JWTConfig{Issuer: c.TasksJWTIssuer, Audience: c.TasksJWTAudience, JWKSURL: c.TasksJWKSURL,
		UserClaim: c.TasksJWTUserClaim, GroupsClaim: c.TasksJWTGroupsClaim})
}
