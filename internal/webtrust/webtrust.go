// Package webtrust holds the rules by which the operator console and the human-task
// page trust a web request: a reverse proxy's identity header only from the proxy's
// own addresses, and a form only from a page of the same site.
package webtrust

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
)

// CheckProxies refuses trusted-proxy prefixes so wide that they name no proxy: shorter
// than /8 for IPv4 (0.0.0.0/0 believes the header from anyone) or /32 for IPv6.
// IPv4-mapped IPv6 prefixes are taken as the IPv4 prefixes they are, and every prefix
// comes back masked.
func CheckProxies(ps []netip.Prefix) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		least := 8
		if p.Addr().Is6() {
			least = 32
		}
		if !p.IsValid() || p.Bits() < least {
			return nil, fmt.Errorf("trusted proxy %s is too wide to name a proxy (at least /%d)", p, least)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// FromProxy reports whether remote (a request's RemoteAddr, host:port) is in one of ps.
func FromProxy(ps []netip.Prefix, remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	a = a.Unmap()
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// SameOrigin reports whether u (an Origin or a Referer header) names r's own site: an
// http or https address of r's host, and https when r came over TLS. Over plain HTTP
// either scheme is taken: behind a proxy that terminates TLS the server sees HTTP while
// the browser says https.
func SameOrigin(r *http.Request, u string) bool {
	p, err := url.Parse(u)
	if err != nil || p.Host == "" || !strings.EqualFold(p.Host, r.Host) {
		return false
	}
	switch strings.ToLower(p.Scheme) {
	case "https":
		return true
	case "http":
		return r.TLS == nil
	}
	return false
}
