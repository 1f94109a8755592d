package console

import (
	"fmt"
	"net/http"
	"time"
)

// SetClock makes h (from New) read the time from now: the tests move it past a
// throttle's delay or a session's expiry. Call it before h serves.
func SetClock(h http.Handler, now func() time.Time) { h.(*handler).now = now }

// FloodLoginFailures records n failed logins, each for a name and from an address of its
// own, as a flood from many clients would.
func FloodLoginFailures(h http.Handler, n int) {
	hh := h.(*handler)
	for i := range n {
		hh.limits.fail(hh.now(), throttleKey{fmt.Sprintf("name:flood-%d", i), nameRule},
			throttleKey{fmt.Sprintf("addr:10.%d.%d.%d", i>>16&255, i>>8&255, i&255), addressRule})
	}
}

// Visible is how a page shows s in its text.
func Visible(s string) string { return string(visibleHTML(s)) }

// CheckProviderRef is why the resolve form refuses s as a provider reference, or nil.
func CheckProviderRef(s string) error { return fieldProviderRef.check(s) }
