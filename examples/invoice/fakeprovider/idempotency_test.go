package fakeprovider

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var dialects = []struct {
	dialect        Dialect
	mismatchStatus int
	mismatchCode   string // the code the body carries, "" if none
	inUseProblem   bool   // the 409 in flight is an RFC 9457 problem
}{
	{DialectStripe, http.StatusBadRequest, "", false},
	{DialectIETF, http.StatusUnprocessableEntity, codeMismatch, true},
	{DialectBrandur, http.StatusConflict, codeMismatch, false},
}

// TestDialectMismatch: the same key with a different body is refused with each
// dialect's status, nothing is charged, and the client calls all three ErrKeyMismatch
// (permanent), never "not sent" or "ambiguous".
func TestDialectMismatch(t *testing.T) {
	for _, d := range dialects {
		t.Run(string(d.dialect), func(t *testing.T) {
			s, c := startTCP(t, Options{Dialect: d.dialect})
			ctx := t.Context()
			first, err := c.Charge(ctx, "k", "INV-1", 500)
			require.NoError(t, err)

			a := send(t, c, http.MethodPost, "/v1/charges", "k", `{"invoice":"INV-1","amountCents":999}`)
			assert.Equal(t, d.mismatchStatus, a.status, a.body)
			if d.dialect == DialectStripe {
				assert.Contains(t, a.body, `"type":"idempotency_error"`)
			} else {
				assert.Contains(t, a.body, `"code":"`+d.mismatchCode+`"`)
			}
			assert.Empty(t, a.header.Get("Idempotent-Replayed"))

			_, err = c.Charge(ctx, "k", "INV-1", 999)
			assert.ErrorIs(t, err, ErrKeyMismatch)
			assert.NotErrorIs(t, err, ErrNotSent)
			assert.NotErrorIs(t, err, ErrUnknownOutcome)

			// The same key on the other endpoint is a different request too.
			_, err = c.Email(ctx, "k", "INV-1", "a@example.invalid", "receipt")
			assert.ErrorIs(t, err, ErrKeyMismatch)

			again, err := c.Charge(ctx, "k", "INV-1", 500)
			require.NoError(t, err, "the mismatch stored nothing: the first answer still replays")
			assert.Equal(t, first, again)
			assert.Len(t, s.Charges(), 1)
			assert.Equal(t, outMismatch, entryFor(t, s, 2).Outcome)
		})
	}
}

// TestDialectInUse (row T4): while a Hold keeps the first request in flight, a second
// request with the same key gets 409 in every dialect, which the client calls
// *InUseError (nothing done, retry in 1s); the first commits once, and a retry after
// it replays its charge.
func TestDialectInUse(t *testing.T) {
	for _, d := range dialects {
		t.Run(string(d.dialect), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s, c := startMem(t, Options{Dialect: d.dialect, SlowDelay: 10 * time.Second})
				ctx := t.Context()
				s.ScriptKey("k", Hold)
				var (
					first    Charge
					firstErr error
					wg       sync.WaitGroup
				)
				wg.Go(func() { first, firstErr = c.Charge(ctx, "k", "INV-1", 500) })
				synctest.Wait() // the first request is held
				held := entryFor(t, s, 1)
				assert.Equal(t, "hold", held.Fault)
				assert.Empty(t, held.Fate, "still in flight")
				assert.Empty(t, s.Charges(), "held, not committed")

				a := send(t, c, http.MethodPost, "/v1/charges", "k", `{"invoice":"INV-1","amountCents":500}`)
				assert.Equal(t, http.StatusConflict, a.status)
				assert.Contains(t, a.body, codeInUse)
				assert.Equal(t, "1", a.header.Get("Retry-After"))
				if d.inUseProblem {
					assert.Equal(t, "application/problem+json", a.header.Get("Content-Type"))
				}

				_, err := c.Charge(ctx, "k", "INV-1", 500)
				var inUse *InUseError
				require.ErrorAs(t, err, &inUse)
				assert.ErrorIs(t, err, ErrNotSent)
				assert.NotErrorIs(t, err, ErrKeyMismatch)
				assert.Equal(t, time.Second, inUse.RetryAfter())

				_, err = c.Lookup(ctx, "k")
				assert.ErrorAs(t, err, &inUse, "a lookup of a key in flight is no not-found")

				// A different body under the key in flight is still a mismatch.
				_, err = c.Charge(ctx, "k", "INV-1", 501)
				assert.ErrorIs(t, err, ErrKeyMismatch)

				wg.Wait() // fake time runs out the hold
				require.NoError(t, firstErr)
				assert.Len(t, s.Charges(), 1, "the held request committed once")
				again, err := c.Charge(ctx, "k", "INV-1", 500)
				require.NoError(t, err)
				assert.Equal(t, first, again)
				assert.Len(t, s.Charges(), 1)
				assert.Equal(t, outCreated, entryFor(t, s, 1).Outcome)
				assert.Equal(t, fateAnswered, entryFor(t, s, 1).Fate)
			})
		})
	}
}

// TestStored500 (row T2): stripe stores the 500, so a same-key retry replays it and a
// lookup reports a StoredFailureError; ietf stores nothing, so a retry is fresh and
// charges.
func TestStored500(t *testing.T) {
	t.Run("stripe", func(t *testing.T) {
		s, c := startTCP(t, Options{})
		ctx := t.Context()
		s.ScriptKey("k", Stored500)
		_, err := c.Charge(ctx, "k", "INV-1", 500)
		assert.ErrorIs(t, err, ErrUnknownOutcome)

		a := send(t, c, http.MethodPost, "/v1/charges", "k", `{"invoice":"INV-1","amountCents":500}`)
		assert.Equal(t, http.StatusInternalServerError, a.status)
		assert.Equal(t, "true", a.header.Get("Idempotent-Replayed"))
		_, err = c.Charge(ctx, "k", "INV-1", 500)
		assert.ErrorIs(t, err, ErrUnknownOutcome, "Charge calls any 5xx ambiguous")

		_, err = c.Lookup(ctx, "k")
		var stored *StoredFailureError
		require.ErrorAs(t, err, &stored)
		assert.Equal(t, http.StatusInternalServerError, stored.Status)
		assert.NotErrorIs(t, err, ErrNotFound)
		assert.Empty(t, s.Charges())

		var outcomes []string
		for _, r := range s.Log() {
			outcomes = append(outcomes, r.Outcome)
		}
		assert.Equal(t, []string{outStored500, outReplayed, outReplayed, outFound}, outcomes)
	})
	t.Run("ietf", func(t *testing.T) {
		s, c := startTCP(t, Options{Dialect: DialectIETF})
		ctx := t.Context()
		s.ScriptKey("k", Stored500)
		_, err := c.Charge(ctx, "k", "INV-1", 500)
		assert.ErrorIs(t, err, ErrUnknownOutcome)
		_, err = c.Lookup(ctx, "k")
		assert.ErrorIs(t, err, ErrNotFound, "nothing stored")
		ch, err := c.Charge(ctx, "k", "INV-1", 500)
		require.NoError(t, err, "a fresh attempt")
		assert.Equal(t, []Charge{ch}, s.Charges())
		assert.Equal(t, outError500, entryFor(t, s, 1).Outcome)
	})
}

// TestRetention: a key is forgotten once it is Retention old on the virtual clock;
// then a lookup is 404 and the same key makes a second charge, as Stripe does after
// 24h. Until then it replays.
func TestRetention(t *testing.T) {
	s, c := startTCP(t, Options{})
	ctx := t.Context()
	first, err := c.Charge(ctx, "k", "INV-1", 500)
	require.NoError(t, err)
	s.Advance(23 * time.Hour)
	again, err := c.Charge(ctx, "k", "INV-1", 500)
	require.NoError(t, err)
	assert.Equal(t, first, again, "inside the window: a replay")
	_, err = c.Lookup(ctx, "k")
	require.NoError(t, err)

	s.Advance(time.Hour)
	_, err = c.Lookup(ctx, "k")
	assert.ErrorIs(t, err, ErrNotFound, "forgotten after 24h")
	second, err := c.Charge(ctx, "k", "INV-1", 500)
	require.NoError(t, err)
	assert.NotEqual(t, first.ID, second.ID, "a new effect under the old key")
	assert.Len(t, s.Charges(), 2)
	assert.Equal(t, 1, s.DoubleCharges())
	assert.Equal(t, 24*time.Hour, second.At.Sub(first.At).Round(time.Hour))

	// A decline is stored and expires the same way.
	short, c2 := startTCP(t, Options{Retention: time.Minute, DeclineAboveCents: 100})
	_, err = c2.Charge(ctx, "d", "INV-2", 500)
	var decline *DeclineError
	require.ErrorAs(t, err, &decline)
	_, err = c2.Lookup(ctx, "d")
	require.ErrorAs(t, err, &decline, "a lookup of a stored decline")
	short.Advance(time.Minute)
	_, err = c2.Lookup(ctx, "d")
	assert.ErrorIs(t, err, ErrNotFound)
}

// TestSearch: a charge is invisible to search until SearchLag has passed on the virtual
// clock, visible after; a disabled search is 501, which the client calls
// ErrSearchUnavailable.
func TestSearch(t *testing.T) {
	s, c := startTCP(t, Options{SearchLag: time.Minute})
	ctx := t.Context()
	ch, err := c.Charge(ctx, "k", "INV-1", 500)
	require.NoError(t, err)
	_, err = c.Charge(ctx, "k2", "INV-2", 700)
	require.NoError(t, err)

	got, err := c.Search(ctx, "INV-1")
	require.NoError(t, err)
	assert.Empty(t, got, "inside the index lag")
	s.Advance(59 * time.Second)
	got, err = c.Search(ctx, "INV-1")
	require.NoError(t, err)
	assert.Empty(t, got)
	s.Advance(time.Second)
	got, err = c.Search(ctx, "INV-1")
	require.NoError(t, err)
	assert.Equal(t, []Charge{ch}, got)
	got, err = c.Search(ctx, "INV-9")
	require.NoError(t, err)
	assert.Empty(t, got)
	last := s.Log()[len(s.Log())-1]
	assert.Equal(t, Request{Seq: last.Seq, At: last.At, Method: http.MethodGet, Path: "/v1/charges/search",
		Invoice: "INV-9", Outcome: outSearch, Fate: fateAnswered}, last)

	s2, c2 := startTCP(t, Options{SearchDisabled: true})
	_, err = c2.Charge(ctx, "k", "INV-1", 500)
	require.NoError(t, err)
	_, err = c2.Search(ctx, "INV-1")
	assert.ErrorIs(t, err, ErrSearchUnavailable)
	assert.Equal(t, outSearchUnavailable, entryFor(t, s2, 2).Outcome)
}

// TestLoseAnswer (row C3): the charge is committed, the connection is dropped without
// an answer, the client cannot tell (ErrUnknownOutcome) and the history says "dropped".
func TestLoseAnswer(t *testing.T) {
	s, c := startTCP(t, Options{})
	ctx := t.Context()
	s.Script("INV-1", LoseAnswer)
	_, err := c.Charge(ctx, "k", "INV-1", 500)
	assert.ErrorIs(t, err, ErrUnknownOutcome)
	require.Len(t, s.Charges(), 1)
	r := entryFor(t, s, 1)
	assert.Equal(t, "lose_answer", r.Fault)
	assert.Equal(t, outCreated, r.Outcome)
	assert.Equal(t, s.Charges()[0].ID, r.EffectID)
	assert.Equal(t, fateDropped, r.Fate)

	ch, err := c.Charge(ctx, "k", "INV-1", 500)
	require.NoError(t, err)
	assert.Equal(t, s.Charges()[0], ch, "a same-key retry replays the lost answer")
	assert.Equal(t, outReplayed, entryFor(t, s, 2).Outcome)
}

// TestDropBeforeAccept (row C2): the request is read and dropped; nothing is stored, and
// the same key then charges once.
func TestDropBeforeAccept(t *testing.T) {
	s, c := startTCP(t, Options{})
	ctx := t.Context()
	s.ScriptKey("k", DropBeforeAccept)
	_, err := c.Charge(ctx, "k", "INV-1", 500)
	assert.ErrorIs(t, err, ErrUnknownOutcome)
	_, err = c.Lookup(ctx, "k")
	assert.ErrorIs(t, err, ErrNotFound)
	r := entryFor(t, s, 1)
	assert.Equal(t, outDropped, r.Outcome)
	assert.Equal(t, fateDropped, r.Fate)
	_, err = c.Charge(ctx, "k", "INV-1", 500)
	require.NoError(t, err)
	assert.Len(t, s.Charges(), 1)
}

// TestRateLimitedAndUnavailable (rows T1, T3): neither touches the key store.
func TestRateLimitedAndUnavailable(t *testing.T) {
	s, c := startTCP(t, Options{})
	ctx := t.Context()
	s.Script("INV-1", RateLimited, Unavailable)
	_, err := c.Charge(ctx, "k", "INV-1", 500)
	var rl *RateLimitError
	require.ErrorAs(t, err, &rl)
	assert.ErrorIs(t, err, ErrNotSent)
	assert.Equal(t, time.Second, rl.RetryAfter())
	_, err = c.Charge(ctx, "k", "INV-1", 500)
	assert.ErrorIs(t, err, ErrUnknownOutcome)
	_, err = c.Charge(ctx, "k", "INV-1", 500)
	require.NoError(t, err)
	assert.Len(t, s.Charges(), 1)
	var outcomes []string
	for _, r := range s.Log() {
		outcomes = append(outcomes, r.Outcome)
	}
	assert.Equal(t, []string{outRateLimited, outUnavailable, outCreated}, outcomes)
}

// TestDecline (row B1): the Decline fault declines any amount and is stored under the key.
func TestDeclineFault(t *testing.T) {
	s, c := startTCP(t, Options{})
	ctx := t.Context()
	s.ScriptKey("k", Decline)
	_, err := c.Charge(ctx, "k", "INV-1", 1)
	var d *DeclineError
	require.ErrorAs(t, err, &d)
	assert.Equal(t, "card_declined", d.Code)
	_, err = c.Charge(ctx, "k", "INV-1", 1)
	require.ErrorAs(t, err, &d, "replayed")
	_, err = c.Lookup(ctx, "k")
	require.ErrorAs(t, err, &d)
	assert.Empty(t, s.Charges())
	assert.Equal(t, outDeclined, entryFor(t, s, 1).Outcome)
}

// TestSlowAnswerClientGone (row S1): a client that gives up during a SlowAnswer gets
// ErrUnknownOutcome; the charge stands and the history says client_gone.
func TestSlowAnswerClientGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, c := startMem(t, Options{SlowDelay: 5 * time.Second})
		s.ScriptKey("k", SlowAnswer)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err := c.Charge(ctx, "k", "INV-1", 500)
		assert.ErrorIs(t, err, ErrUnknownOutcome)
		synctest.Wait() // the provider notices the client left
		r := entryFor(t, s, 1)
		assert.Equal(t, outCreated, r.Outcome)
		assert.Equal(t, fateClientGone, r.Fate)
		require.Len(t, s.Charges(), 1)
		ch, err := c.Lookup(t.Context(), "k")
		require.NoError(t, err)
		assert.Equal(t, s.Charges()[0], ch)
	})
}

// TestSlowAnswerAnswers: a patient client gets the answer after the delay.
func TestSlowAnswerAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, c := startMem(t, Options{SlowDelay: 5 * time.Second})
		s.ScriptKey("k", SlowAnswer)
		start := time.Now()
		_, err := c.Charge(t.Context(), "k", "INV-1", 500)
		require.NoError(t, err)
		assert.Equal(t, 5*time.Second, time.Since(start))
		assert.Equal(t, fateAnswered, entryFor(t, s, 1).Fate)
	})
}

// TestDelay: Delay waits before doing anything; the charge is committed after the
// delay even if the client has left meanwhile.
func TestDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, c := startMem(t, Options{SlowDelay: 3 * time.Second})
		s.ScriptKey("k", Delay)
		var wg sync.WaitGroup
		var err error
		wg.Go(func() { _, err = c.Charge(t.Context(), "k", "INV-1", 500) })
		time.Sleep(2 * time.Second)
		synctest.Wait()
		assert.Empty(t, s.Charges(), "nothing done during the delay")
		wg.Wait()
		require.NoError(t, err)
		assert.Len(t, s.Charges(), 1)

		s.ScriptKey("k2", Delay)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err = c.Charge(ctx, "k2", "INV-2", 500)
		assert.ErrorIs(t, err, ErrUnknownOutcome)
		time.Sleep(3 * time.Second)
		synctest.Wait()
		assert.Len(t, s.Charges(), 2, "committed after the delay, client or not")
		assert.Equal(t, fateClientGone, entryFor(t, s, 2).Fate)
	})
}

// TestCloseAbandonsHeld: Close does not wait out a Hold; the held request never commits.
func TestCloseAbandonsHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, c := startMem(t, Options{SlowDelay: time.Hour})
		s.ScriptKey("k", Hold)
		var wg sync.WaitGroup
		var err error
		wg.Go(func() { _, err = c.Charge(t.Context(), "k", "INV-1", 500) })
		synctest.Wait()
		start := time.Now()
		require.NoError(t, s.Close())
		assert.Zero(t, time.Since(start))
		wg.Wait()
		assert.ErrorIs(t, err, ErrUnknownOutcome)
		assert.Empty(t, s.Charges())
		assert.Equal(t, outDropped, entryFor(t, s, 1).Outcome)
		require.NoError(t, s.Close(), "safe twice")
	})
}

// TestConcurrentSameKey: many concurrent requests under one key make one charge, and
// every answer names it.
func TestConcurrentSameKey(t *testing.T) {
	s, c := startTCP(t, Options{})
	var wg sync.WaitGroup
	ids := make([]string, 16)
	for i := range ids {
		wg.Go(func() {
			ch, err := c.Charge(t.Context(), "k", "INV-1", 500)
			assert.NoError(t, err)
			ids[i] = ch.ID
		})
	}
	wg.Wait()
	require.Len(t, s.Charges(), 1)
	for _, id := range ids {
		assert.Equal(t, s.Charges()[0].ID, id)
	}
	assert.EqualValues(t, 16, s.Requests())
}

// TestDigest: Charge.Digest is the SHA-256 of the canonical body, whatever the bytes
// sent looked like, and a differently spelled same request replays.
func TestDigest(t *testing.T) {
	s, c := startTCP(t, Options{})
	ch, err := c.Charge(t.Context(), "k", "INV-1", 500)
	require.NoError(t, err)
	sum := sha256.Sum256([]byte(`{"invoice":"INV-1","amountCents":500}`))
	assert.Equal(t, hex.EncodeToString(sum[:]), ch.Digest)
	assert.Equal(t, "k", ch.Key)
	a := send(t, c, http.MethodPost, "/v1/charges", "k", ` { "amountCents": 500,  "invoice": "INV-1" } `)
	assert.Equal(t, http.StatusOK, a.status, a.body)
	assert.Equal(t, "true", a.header.Get("Idempotent-Replayed"))
	assert.Len(t, s.Charges(), 1)
	assert.Equal(t, ch.Digest, entryFor(t, s, 2).Digest)
}

// TestMalformed: bounded bodies, 400 for anything malformed, all of it recorded.
func TestMalformed(t *testing.T) {
	s, c := startTCP(t, Options{})
	for name, tc := range map[string]struct {
		key, body string
		status    int
	}{
		"not json":      {"k", `nope`, http.StatusBadRequest},
		"null":          {"k", `null`, http.StatusBadRequest},
		"array":         {"k", `[]`, http.StatusBadRequest},
		"unknown field": {"k", `{"invoice":"I","amountCents":1,"currency":"eur"}`, http.StatusBadRequest},
		"trailing data": {"k", `{"invoice":"I","amountCents":1}{}`, http.StatusBadRequest},
		"wrong type":    {"k", `{"invoice":"I","amountCents":"1"}`, http.StatusBadRequest},
		"no invoice":    {"k", `{"amountCents":1}`, http.StatusBadRequest},
		"no key":        {"", `{"invoice":"I","amountCents":1}`, http.StatusBadRequest},
		"long key":      {strings.Repeat("k", 256), `{"invoice":"I","amountCents":1}`, http.StatusBadRequest},
		"too big":       {"k", `{"invoice":"` + strings.Repeat("x", 70<<10) + `"}`, http.StatusRequestEntityTooLarge},
	} {
		t.Run(name, func(t *testing.T) {
			a := send(t, c, http.MethodPost, "/v1/charges", tc.key, tc.body)
			assert.Equal(t, tc.status, a.status, a.body)
		})
	}
	a := send(t, c, http.MethodPost, "/v1/emails", "", `{"invoice":"I"}`)
	assert.Equal(t, http.StatusBadRequest, a.status, "an email needs to and template")
	a = send(t, c, http.MethodDelete, "/v1/charges", "", "")
	assert.Equal(t, http.StatusNotFound, a.status)
	assert.Empty(t, s.Charges())
	assert.EqualValues(t, 10, s.Requests())
	log := s.Log()
	require.Len(t, log, 12)
	for _, r := range log {
		assert.Equal(t, outBadRequest, r.Outcome, r.Path)
		assert.Equal(t, fateAnswered, r.Fate)
	}
}

// TestStartWith: defaults and validation.
func TestStartWith(t *testing.T) {
	_, err := StartWith(Options{Dialect: "soap"})
	assert.ErrorContains(t, err, "Options.Dialect")
	_, err = StartWith(Options{Retention: -time.Second})
	assert.ErrorContains(t, err, "Options.Retention")
	s, err := Start(100)
	require.NoError(t, err)
	defer s.Close()
	assert.Equal(t, 2*time.Second, s.SlowDelay)
	assert.EqualValues(t, 100, s.DeclineAboveCents)
	assert.Equal(t, Options{DeclineAboveCents: 100, Dialect: DialectStripe, Retention: 24 * time.Hour, SlowDelay: 2 * time.Second}, s.opts)
	assert.True(t, errors.Is(&InUseError{}, ErrNotSent))
}

// BenchmarkCharge measures one new charge over loopback HTTP, client included: the
// provider's share of a soak's wall time.
func BenchmarkCharge(b *testing.B) {
	s, err := Start(0)
	require.NoError(b, err)
	defer s.Close()
	c := &Client{BaseURL: s.URL(), HTTP: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}}
	var n atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			if _, err := c.Charge(b.Context(), fmt.Sprint("k", i), fmt.Sprint("INV-", i), 100); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
