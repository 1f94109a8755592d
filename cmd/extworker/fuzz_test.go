package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/termsafe"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
)

// FuzzEffectsResolve (issue 23): whatever bytes an operator types into `extworker effects
// resolve` (verdict, provider reference, a value, reason, operator name), alone on her own
// login she never settles a held payment as moved or sends it again: the intent stays held
// (or, her one-person call, is rejected); nothing panics; what is printed is valid UTF-8.
func FuzzEffectsResolve(f *testing.F) {
	for _, s := range [][5]string{
		{"confirmed", "ch_1", "paymentRef=ch_1", "seen", "alice"},
		{"confirmed", "ch_1", "paymentRef=ch_1", "seen", "bob"},
		{"retry", "", "", "never got it", ""},
		{"close", "", "", "refunded", "carol"},
		{"rejected", "", "", "declined", "Alice "},
		{"confirmed", "ch_ok\u200b", "amount=1\u202e00001", "r", "\u0430lice"},
		{"confirmed", "ch\x00", "k=x\xff\xfey", "r\x00", "alice\x00"},
		{"confirmed", "ch_1", "a=1", "\x1b]8;;http://evil\x07x", "alice"},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4])
	}
	pool := testenv.DB(f)
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if _, err := migrations.Up(context.Background(), db); err != nil {
		f.Fatal(err)
	}
	testenv.RegisterOperators(f, pool)
	ns := testenv.Unique("fz")
	l, err := idempotency.New(pool, idempotency.Config{Namespace: ns})
	if err != nil {
		f.Fatal(err)
	}
	n := 0
	f.Fuzz(func(t *testing.T, as, ref, value, reason, operator string) {
		n++
		key := fmt.Sprintf("invoice:F%d-%s", n, testenv.Unique("k"))
		t.Setenv("EXTWORKER_ENGINE_URL", testenv.EngineURL())
		t.Setenv("EXTWORKER_LEDGER_NAMESPACE", ns)
		t.Setenv("EXTWORKER_LOG_LEVEL", "error")
		holdIntent(t, l, "payment.collect", key, idempotency.TaskRef{Actor: "w"})
		args := []string{"resolve", key, "--as", as, "--reason", reason, "--operator", operator}
		if ref != "" {
			args = append(args, "--provider-ref", ref)
		}
		if value != "" {
			args = append(args, "--value", value)
		}
		// runEffects, not run: run installs the SIGINT handler, which the fuzzing
		// engine's own interrupts of its workers must not meet.
		t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURLAs(testenv.AliceLogin))
		cfg, err := daemon.LoadConfig()
		if err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		err = runEffects(testenv.Context(t, 30*time.Second), cfg, daemon.NewLogger(cfg, io.Discard), args,
			termsafe.NewWriter(&stdout), termsafe.NewWriter(&stderr))
		out := stdout.String() + stderr.String()
		if !utf8.ValidString(out) || (err != nil && !utf8.ValidString(err.Error())) {
			t.Fatalf("printed bytes that are not UTF-8: %q %v", out, err)
		}
		r, gerr := l.Operations().Get(context.Background(), "payment.collect", key)
		if gerr != nil {
			t.Fatal(gerr)
		}
		if r.State != idempotency.StateOperatorHold && r.State != idempotency.StateRejected {
			t.Fatalf("one operator alone moved the held intent to %s (%q): %s %v", r.State, args, out, err)
		}
	})
}
