package console

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The throttle's memory stays bounded under a flood of keys, and the flood evicts its
// own kind: an entry with more failures (a name being guessed) outlives any number of
// entries with fewer, and the operators' names are never evicted.
func TestThrottleBoundedUnderFlood(t *testing.T) {
	th := newThrottle([]string{"bob"}, 1000)
	now := time.Now()
	bob, mallory := throttleKey{"name:bob", nameRule}, throttleKey{"name:mallory", nameRule}
	for range 6 {
		th.fail(now, bob, mallory)
	}
	for i := range 100000 {
		th.fail(now, throttleKey{fmt.Sprintf("name:flood-%d", i), nameRule}, throttleKey{fmt.Sprintf("addr:flood-%d", i), addressRule})
	}
	assert.LessOrEqual(t, th.size(), 1000)
	assert.Equal(t, 8*time.Second, th.wait(now, bob))
	assert.Equal(t, 8*time.Second, th.wait(now, mallory))
	assert.Equal(t, time.Duration(0), th.wait(now.Add(forgetAfter+time.Second), bob), "failures are forgotten")
}

// The delays: free failures, then 1s doubling, at most two minutes.
func TestThrottleDelays(t *testing.T) {
	for n, want := range map[int]time.Duration{0: 0, 2: 0, 3: time.Second, 4: 2 * time.Second, 9: 64 * time.Second, 10: 2 * time.Minute, 1000: 2 * time.Minute} {
		assert.Equal(t, want, nameRule.delay(n), n)
	}
	assert.Equal(t, time.Duration(0), addressRule.delay(9))
}

func TestAge(t *testing.T) {
	for d, want := range map[time.Duration]string{
		45 * time.Second: "45s", 26 * time.Minute: "26m", 90 * time.Second: "1m30s", 5 * time.Hour: "5h", 5*time.Hour + 4*time.Minute: "5h4m",
		72 * time.Hour: "3d", 74*time.Hour + 59*time.Minute: "3d2h", 26*time.Minute + 900*time.Millisecond: "26m",
	} {
		assert.Equal(t, want, age(d), d.String())
	}
	now := time.Now()
	assert.Equal(t, "26m ago", ago(now, now.Add(-26*time.Minute)))
	assert.Equal(t, "in 5s", ago(now, now.Add(5*time.Second)))
	assert.Equal(t, "just now", ago(now, now))
}

func TestVisible(t *testing.T) {
	assert.Equal(t, `S-<span class="ctl">\u202E</span>2001 &lt;b&gt;`, string(visibleHTML("S-\u202E2001 <b>")))
	assert.Equal(t, `a<span class="ctl">\x80</span>b<span class="ctl">\u0000</span>`, string(visibleHTML("a\x80b\x00")))
	assert.Equal(t, `<span class="ws">tab<span class="ctl">\u0009</span>and`+"\n"+`line</span>`, string(visibleHTML("tab\tand\nline")))
	assert.Equal(t, `<span class="ws">a  b</span>`, string(visibleHTML("a  b")))
	assert.Equal(t, `<span class="ctl">\u0020</span>a b<span class="ctl">\u0020</span>`, string(visibleHTML(" a b ")))
	assert.Equal(t, `x<span class="ctl">\u3164</span><span class="ctl">\u2800</span><span class="ctl">\uFE0F</span>`, string(visibleHTML("x\u3164\u2800\uFE0F")))
	assert.Equal(t, `x<span class="ctl">\U000E0001</span>`, string(visibleHTML("x\U000E0001")))
	assert.Equal(t, `S-\u202E2001`, visiblePlain("S-\u202E2001"))
	assert.Error(t, fieldReason.check("seen \u202E"))
	assert.Error(t, fieldProviderRef.check("a\nb"))
	assert.NoError(t, fieldReason.check("two\nlines"))
	assert.EqualError(t, fieldProviderRef.check("ch_\u31641"), `U+3164 HANGUL FILLER is not allowed in the provider reference (character 4, shown as \u3164: a reader could not see it for what it is); type it again without it`)
	assert.ErrorContains(t, fieldReason.check("a\U000E0021"), "U+E0021 (a tag character) is not allowed in the reason")
	assert.ErrorContains(t, fieldProviderRef.check("ch  1"), "two spaces in a row")
	assert.NoError(t, fieldReason.check("two  spaces"))
	assert.Error(t, fieldReason.check("bad \xff"))
}

func TestNormalHost(t *testing.T) {
	for in, want := range map[string]string{
		"Console.Example.COM:443": "console.example.com", "[::1]:80": "::1", "localhost.": "localhost", "127.0.0.1": "127.0.0.1",
		"": "", "a b": "", "[::ffff:127.0.0.1]:8080": "127.0.0.1",
	} {
		assert.Equal(t, want, normalHost(in), in)
	}
}

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"/intent?scope=a&key=b": "/intent?scope=a&key=b", "//evil.example/": "", "https://evil.example/": "", `/\evil.example`: "",
		"/login?next=/": "", "intent": "", "/\u202E": "",
	} {
		assert.Equal(t, want, safeNext(in), in)
	}
}

func TestShorten(t *testing.T) {
	assert.Equal(t, "abc", shorten("abc", 3))
	assert.Equal(t, "ab […]", shorten("ab€x", 3), "cut at a character's start")
}

// Ages are short and rounded down: no zero units, no fractions.
func TestAgo(t *testing.T) {
	now := time.Now()
	for d, want := range map[time.Duration]string{
		12*time.Second + 700*time.Millisecond: "12s ago", 26 * time.Minute: "26m ago", 26*time.Minute + 400*time.Millisecond: "26m ago",
		2*time.Hour + 5*time.Minute + 59*time.Second: "2h5m ago", 3 * 24 * time.Hour: "3d ago", 3*24*time.Hour + 59*time.Minute: "3d ago",
		500 * time.Millisecond: "just now", -5 * time.Second: "in 5s",
	} {
		assert.Equal(t, want, Ago(now, now.Add(-d)), d.String())
	}
}
