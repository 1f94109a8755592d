package console

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
)

// This file is the Host allow-list. A page of another site whose name an attacker
// points at the console's address (DNS rebinding) is same-origin with itself, not with
// the console: the browser sends the attacker's name in Host, and the console refuses
// it (421) before anything else, so such a page can read nothing and post nothing.

// loopbackNames are what a browser on the console's own machine calls it.
var loopbackNames = []string{"localhost", "127.0.0.1", "::1"}

// allowedHosts is the set of host names the console answers to: list (Options.
// AllowedHosts) when given, else derived from the listen address: loopback's names on
// loopback (and when there is no address: an embedded handler, the tests), the address
// itself on another, and on every interface (0.0.0.0, [::], :port) loopback's, the
// machine's name and its interfaces' addresses.
func allowedHosts(list []string, addr string) (map[string]bool, error) {
	out := map[string]bool{}
	add := func(hosts ...string) {
		for _, h := range hosts {
			if n := normalHost(h); n != "" {
				out[n] = true
			}
		}
	}
	for _, h := range list {
		if normalHost(h) == "" {
			return nil, fmt.Errorf("console: allowed host %q: want a host name or an address", visiblePlain(h))
		}
		add(h)
	}
	if len(list) > 0 {
		return out, nil
	}
	derived, err := listenNames(addr)
	add(derived...)
	return out, err
}

// listenNames are the names a console listening on addr answers to by default.
func listenNames(addr string) ([]string, error) {
	host := ""
	if addr != "" {
		var err error
		if host, _, err = net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("console: listen address %q: %w", addr, err)
		}
	}
	a, err := netip.ParseAddr(host)
	switch {
	case addr == "" || host == "localhost" || err == nil && a.IsLoopback():
		return append([]string{host}, loopbackNames...), nil
	case host == "" || err == nil && a.IsUnspecified():
		return append(machineNames(), loopbackNames...), nil
	}
	return []string{host}, nil
}

// machineNames are this machine's name and its interfaces' addresses.
func machineNames() []string {
	var out []string
	if name, err := os.Hostname(); err == nil {
		out = append(out, name)
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().String())
		}
	}
	return out
}

// normalHost is a Host header's (or an allowed host's) name as compared: without the
// port, brackets or a final dot, lower case, an address in its canonical form; "" for
// nothing usable.
func normalHost(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	h = strings.ToLower(strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"), "."))
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Unmap().WithZone("").String()
	}
	if h == "" || strings.ContainsAny(h, "/@ \t\\") {
		return ""
	}
	return h
}

// hostAllowed reports whether a request naming host is the console's.
func (h *handler) hostAllowed(host string) bool {
	n := normalHost(host)
	return n != "" && h.hosts[n]
}
