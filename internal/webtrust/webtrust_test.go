package webtrust_test

import (
	"crypto/tls"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/webtrust"
)

func TestCheckProxies(t *testing.T) {
	got, err := webtrust.CheckProxies([]netip.Prefix{netip.MustParsePrefix("10.1.2.3/8"), netip.MustParsePrefix("::ffff:192.168.1.0/120")})
	require.NoError(t, err)
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.1.0/24")}, got)
	for _, wide := range []string{"0.0.0.0/0", "10.0.0.0/7", "::/0", "2001:db8::/31", "::ffff:0.0.0.0/96"} {
		_, err := webtrust.CheckProxies([]netip.Prefix{netip.MustParsePrefix(wide)})
		assert.ErrorContains(t, err, "too wide", wide)
	}
}

func TestFromProxy(t *testing.T) {
	ps := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for remote, want := range map[string]bool{"10.1.1.1:5000": true, "[::ffff:10.1.1.1]:5000": true, "10.1.1.1": true,
		"11.0.0.1:5000": false, "garbage": false, "": false} {
		assert.Equal(t, want, webtrust.FromProxy(ps, remote), remote)
	}
}

func TestSameOrigin(t *testing.T) {
	plain := httptest.NewRequest("POST", "http://tasks.example.com/ui/tasks/1", nil)
	overTLS := httptest.NewRequest("POST", "https://tasks.example.com/ui/tasks/1", nil)
	overTLS.TLS = &tls.ConnectionState{}
	for _, c := range []struct {
		origin    string
		plain, ok bool
	}{
		{"https://tasks.example.com", true, true},
		{"http://tasks.example.com", true, false}, // over TLS, a plain-HTTP page is another origin
		{"HTTPS://TASKS.example.com/ui/", true, true},
		{"https://evil.example.com", false, false},
		{"ftp://tasks.example.com", false, false},
		{"javascript://tasks.example.com", false, false},
		{"null", false, false},
		{"//tasks.example.com", false, false},
	} {
		assert.Equal(t, c.plain, webtrust.SameOrigin(plain, c.origin), "plain HTTP: "+c.origin)
		assert.Equal(t, c.ok, webtrust.SameOrigin(overTLS, c.origin), "TLS: "+c.origin)
	}
}
