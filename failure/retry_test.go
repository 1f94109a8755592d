package failure

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func ptr(n int) *int { return &n }

func TestRetryPolicyNext(t *testing.T) {
	defaults := RetryPolicy{}
	cases := []struct {
		name      string
		policy    RetryPolicy
		retries   *int
		wantLeft  int
		wantDelay time.Duration
	}{
		// Defaults: 3 attempts, 1s, x2, 5m.
		{"defaults first failure", defaults, nil, 2, time.Second},
		{"defaults second failure", defaults, ptr(2), 1, 2 * time.Second},
		{"defaults third failure exhausts", defaults, ptr(1), 0, 0},
		{"explicit defaults equal zero value", defaults.WithDefaults(), nil, 2, time.Second},

		{"single attempt", RetryPolicy{MaxAttempts: 1}, nil, 0, 0},
		{"single attempt with retries 1", RetryPolicy{MaxAttempts: 1}, ptr(1), 0, 0},

		// Engine retries of 0 or below: nothing left.
		{"retries 0", defaults, ptr(0), 0, 0},
		{"retries -1", defaults, ptr(-1), 0, 0},
		{"retries MinInt", defaults, ptr(math.MinInt), 0, 0},

		// An operator raised the retries above MaxAttempts: honoured, at the initial delay.
		{"operator raised 10 of 3", defaults, ptr(10), 9, time.Second},
		{"operator raised 4 of 3", defaults, ptr(4), 3, time.Second},
		{"operator raised MaxInt", defaults, ptr(math.MaxInt), math.MaxInt - 1, time.Second},

		// Backoff grows and is capped at MaxDelay.
		{"backoff attempt 1", RetryPolicy{MaxAttempts: 10, InitialDelay: time.Second, Multiplier: 3, MaxDelay: time.Minute}, nil, 9, time.Second},
		{"backoff attempt 2", RetryPolicy{MaxAttempts: 10, InitialDelay: time.Second, Multiplier: 3, MaxDelay: time.Minute}, ptr(9), 8, 3 * time.Second},
		{"backoff attempt 4", RetryPolicy{MaxAttempts: 10, InitialDelay: time.Second, Multiplier: 3, MaxDelay: time.Minute}, ptr(7), 6, 27 * time.Second},
		{"backoff attempt 5 capped", RetryPolicy{MaxAttempts: 10, InitialDelay: time.Second, Multiplier: 3, MaxDelay: time.Minute}, ptr(6), 5, time.Minute},
		{"backoff attempt 9 capped", RetryPolicy{MaxAttempts: 10, InitialDelay: time.Second, Multiplier: 3, MaxDelay: time.Minute}, ptr(2), 1, time.Minute},
		{"default cap 5m", RetryPolicy{MaxAttempts: 20}, ptr(2), 1, 5 * time.Minute},
		{"initial above max", RetryPolicy{InitialDelay: time.Hour, MaxDelay: time.Minute}, nil, 2, time.Minute},
		{"multiplier 1 is constant", RetryPolicy{MaxAttempts: 5, Multiplier: 1, InitialDelay: 10 * time.Second}, ptr(2), 1, 10 * time.Second},
		{"fractional multiplier", RetryPolicy{MaxAttempts: 5, Multiplier: 1.5, InitialDelay: time.Second}, ptr(3), 2, 2250 * time.Millisecond},
		{"huge attempt saturates", RetryPolicy{MaxAttempts: math.MaxInt, MaxDelay: time.Hour}, ptr(2), 1, time.Hour},

		// Invalid policies do not panic: fields are clamped.
		{"negative MaxAttempts acts as 1", RetryPolicy{MaxAttempts: -5}, nil, 0, 0},
		{"multiplier below 1 acts as 1", RetryPolicy{MaxAttempts: 5, Multiplier: 0.5}, ptr(2), 1, time.Second},
		{"NaN multiplier acts as 1", RetryPolicy{MaxAttempts: 5, Multiplier: math.NaN()}, ptr(2), 1, time.Second},
		{"infinite multiplier caps", RetryPolicy{MaxAttempts: 5, Multiplier: math.Inf(1)}, ptr(3), 2, 5 * time.Minute},
		{"negative InitialDelay acts as 0", RetryPolicy{InitialDelay: -time.Second}, nil, 2, 0},
		{"negative MaxDelay acts as 0", RetryPolicy{MaxDelay: -time.Second}, nil, 2, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var left int
			var delay time.Duration
			require.NotPanics(t, func() { left, delay = c.policy.Next(c.retries) })
			assert.Equal(t, c.wantLeft, left, "left")
			assert.Equal(t, c.wantDelay, delay, "delay")
		})
	}
}

// TestRetryPolicyNextSequence replays the engine: each reported left becomes the next
// fetched retries, until an incident.
func TestRetryPolicyNextSequence(t *testing.T) {
	cases := []struct {
		name   string
		policy RetryPolicy
		start  *int
		want   []time.Duration // the delays reported, in order; the last report is (0, 0)
	}{
		{"defaults", RetryPolicy{}, nil, []time.Duration{time.Second, 2 * time.Second}},
		{"single attempt", RetryPolicy{MaxAttempts: 1}, nil, nil},
		{"five attempts capped", RetryPolicy{MaxAttempts: 5, InitialDelay: 10 * time.Second, Multiplier: 4, MaxDelay: time.Minute},
			nil, []time.Duration{10 * time.Second, 40 * time.Second, time.Minute, time.Minute}},
		{"operator raised to 5 of 3", RetryPolicy{}, ptr(5), []time.Duration{time.Second, time.Second, time.Second, 2 * time.Second}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []time.Duration
			retries := c.start
			for i := 0; ; i++ {
				require.Less(t, i, 100, "the count-down must end")
				left, delay := c.policy.Next(retries)
				if left == 0 {
					assert.Zero(t, delay)
					break
				}
				got = append(got, delay)
				retries = ptr(left)
			}
			assert.Equal(t, c.want, got)
		})
	}
}

func TestRetryPolicyAttempt(t *testing.T) {
	cases := []struct {
		name    string
		policy  RetryPolicy
		retries *int
		want    int
	}{
		{"nil is the first attempt", RetryPolicy{}, nil, 1},
		{"retries 2 of 3", RetryPolicy{}, ptr(2), 2},
		{"retries 1 of 3", RetryPolicy{}, ptr(1), 3},
		{"retries 0 of 3", RetryPolicy{}, ptr(0), 4},
		{"negative counts as 0", RetryPolicy{}, ptr(-3), 4},
		{"raised above MaxAttempts", RetryPolicy{}, ptr(10), 1},
		{"equal to MaxAttempts", RetryPolicy{MaxAttempts: 5}, ptr(5), 1},
		{"MaxAttempts 1, retries 0", RetryPolicy{MaxAttempts: 1}, ptr(0), 2},
		{"no overflow", RetryPolicy{MaxAttempts: math.MaxInt}, ptr(0), math.MaxInt},
		{"no overflow MinInt", RetryPolicy{MaxAttempts: math.MaxInt}, ptr(math.MinInt), math.MaxInt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, c.policy.Attempt(c.retries))
		})
	}
}

func TestRetryPolicyWithDefaults(t *testing.T) {
	p := RetryPolicy{}
	d := p.WithDefaults()
	assert.Equal(t, RetryPolicy{MaxAttempts: 3, InitialDelay: time.Second, Multiplier: 2, MaxDelay: 5 * time.Minute}, d)
	assert.Equal(t, RetryPolicy{}, p, "a copy: the receiver is unchanged")
	require.NoError(t, d.Validate())

	custom := RetryPolicy{MaxAttempts: 7, InitialDelay: time.Millisecond, Multiplier: 1.5, MaxDelay: time.Hour}
	assert.Equal(t, custom, custom.WithDefaults(), "set fields are kept")

	partial := RetryPolicy{MaxAttempts: 5}.WithDefaults()
	assert.Equal(t, RetryPolicy{MaxAttempts: 5, InitialDelay: time.Second, Multiplier: 2, MaxDelay: 5 * time.Minute}, partial)

	invalid := RetryPolicy{MaxAttempts: -1, Multiplier: 0.5}.WithDefaults()
	assert.Equal(t, -1, invalid.MaxAttempts, "invalid fields are kept for Validate")
	assert.Equal(t, 0.5, invalid.Multiplier)
}

func TestRetryPolicyValidate(t *testing.T) {
	valid := RetryPolicy{}.WithDefaults()
	cases := []struct {
		name   string
		policy RetryPolicy
		fields []string // the fields the error must name; none: valid
	}{
		{"defaults", valid, nil},
		{"zero delays", RetryPolicy{MaxAttempts: 1, Multiplier: 1}, nil},
		{"one attempt", RetryPolicy{MaxAttempts: 1, InitialDelay: time.Second, Multiplier: 1, MaxDelay: time.Second}, nil},
		{"max below initial is allowed: it caps", RetryPolicy{MaxAttempts: 2, InitialDelay: time.Hour, Multiplier: 2, MaxDelay: time.Second}, nil},
		{"zero value", RetryPolicy{}, []string{"MaxAttempts", "Multiplier"}},
		{"MaxAttempts 0", func() RetryPolicy { p := valid; p.MaxAttempts = 0; return p }(), []string{"MaxAttempts"}},
		{"MaxAttempts negative", func() RetryPolicy { p := valid; p.MaxAttempts = -2; return p }(), []string{"MaxAttempts"}},
		{"InitialDelay negative", func() RetryPolicy { p := valid; p.InitialDelay = -time.Second; return p }(), []string{"InitialDelay"}},
		{"MaxDelay negative", func() RetryPolicy { p := valid; p.MaxDelay = -1; return p }(), []string{"MaxDelay"}},
		{"Multiplier below 1", func() RetryPolicy { p := valid; p.Multiplier = 0.99; return p }(), []string{"Multiplier"}},
		{"Multiplier NaN", func() RetryPolicy { p := valid; p.Multiplier = math.NaN(); return p }(), []string{"Multiplier"}},
		{"Multiplier +Inf", func() RetryPolicy { p := valid; p.Multiplier = math.Inf(1); return p }(), []string{"Multiplier"}},
		{"everything", RetryPolicy{MaxAttempts: -1, InitialDelay: -1, Multiplier: -1, MaxDelay: -1},
			[]string{"MaxAttempts", "InitialDelay", "Multiplier", "MaxDelay"}},
	}
	all := []string{"MaxAttempts", "InitialDelay", "Multiplier", "MaxDelay"}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.policy.Validate()
			if c.fields == nil {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, f := range all {
				named := strings.Contains(err.Error(), "RetryPolicy."+f+" ")
				want := false
				for _, w := range c.fields {
					want = want || w == f
				}
				assert.Equal(t, want, named, "field %s named in %q", f, err.Error())
			}
		})
	}
}
