package callback

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/extworker/extworker/inbox"
)

// TestAnswerOf: the answer is the row's, whatever this delivery's class, disposition,
// delay or reason: a first delivery and its duplicates get the same bytes.
func TestAnswerOf(t *testing.T) {
	processed := answer{http.StatusOK, []byte(`{"id":"msg_1","state":"processed"}` + "\n")}
	for _, tc := range []struct {
		name string
		h    inbox.Handling
		want answer
	}{
		{"correlated", inbox.Handling{Class: inbox.ClassCorrelated, State: inbox.StateProcessed, ProcessInstanceID: "pi-1"}, processed},
		{"started", inbox.Handling{Class: inbox.ClassStarted, State: inbox.StateProcessed}, processed},
		{"reconciled", inbox.Handling{Class: inbox.ClassReconciled, State: inbox.StateProcessed}, processed},
		{"ignored by Decide", inbox.Handling{Class: inbox.ClassIgnored, State: inbox.StateProcessed, Reason: "ignored: not ours"}, processed},
		{"a duplicate of a processed one", inbox.Handling{Class: inbox.ClassDuplicate, State: inbox.StateProcessed}, processed},
		{"late", inbox.Handling{Class: inbox.ClassLate, State: inbox.StateIgnoredDuplicate, Reason: "late: ..."},
			answer{http.StatusOK, []byte(`{"id":"msg_1","state":"ignored_duplicate"}` + "\n")}},
		{"a duplicate of a late one", inbox.Handling{Class: inbox.ClassDuplicate, State: inbox.StateIgnoredDuplicate},
			answer{http.StatusOK, []byte(`{"id":"msg_1","state":"ignored_duplicate"}` + "\n")}},
		{"parked", inbox.Handling{Class: inbox.ClassParked, Disposition: inbox.Park, State: inbox.StateFailedFinal, Reason: "the consumer could not read"},
			answer{http.StatusOK, []byte(`{"id":"msg_1","state":"failed_final"}` + "\n")}},
		{"a duplicate of a parked one", inbox.Handling{Class: inbox.ClassDuplicate, State: inbox.StateFailedFinal},
			answer{http.StatusOK, []byte(`{"id":"msg_1","state":"failed_final"}` + "\n")}},
		{"early", inbox.Handling{Class: inbox.ClassEarly, Disposition: inbox.Retry, State: inbox.StateFailedRetryable, Delay: time.Second},
			answer{http.StatusAccepted, []byte(`{"id":"msg_1","state":"failed_retryable"}` + "\n")}},
		{"early again, another delay", inbox.Handling{Class: inbox.ClassEarly, Disposition: inbox.Retry, State: inbox.StateFailedRetryable, Delay: time.Minute},
			answer{http.StatusAccepted, []byte(`{"id":"msg_1","state":"failed_retryable"}` + "\n")}},
		{"engine unreachable", inbox.Handling{Class: inbox.ClassRetry, Disposition: inbox.Retry, State: inbox.StateFailedRetryable},
			answer{http.StatusAccepted, []byte(`{"id":"msg_1","state":"failed_retryable"}` + "\n")}},
		{"unknown outcome", inbox.Handling{Class: inbox.ClassUnknownOutcome, Disposition: inbox.Retry, State: inbox.StateUnknown},
			answer{http.StatusAccepted, []byte(`{"id":"msg_1","state":"unknown"}` + "\n")}},
		{"conflict with a processed one", inbox.Handling{Class: inbox.ClassConflict, Disposition: inbox.Park, State: inbox.StateProcessed, Reason: "conflict: digest …"},
			answer{http.StatusConflict, []byte(`{"id":"msg_1","error":"conflict: this webhook-id was received with another body"}` + "\n")}},
		{"conflict with a waiting one", inbox.Handling{Class: inbox.ClassConflict, Disposition: inbox.Park, State: inbox.StateFailedRetryable},
			answer{http.StatusConflict, []byte(`{"id":"msg_1","error":"conflict: this webhook-id was received with another body"}` + "\n")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := answerOf("msg_1", tc.h)
			assert.Equal(t, tc.want.status, got.status)
			assert.Equal(t, string(tc.want.body), string(got.body))
		})
	}
}

// TestSettled: the states whose held body is let go of are the inbox's final ones.
func TestSettled(t *testing.T) {
	want := map[inbox.State]bool{inbox.StateProcessed: true, inbox.StateIgnoredDuplicate: true, inbox.StateFailedFinal: true}
	for _, st := range inbox.States() {
		assert.Equal(t, want[st], settled(st), string(st))
	}
}

// TestNextDue: a held callback waits the inbox's delay, or the backoff for the times Run
// took it, whichever is longer; the backoff doubles up to its cap.
func TestNextDue(t *testing.T) {
	cfg := inbox.Config{BackoffInitial: time.Second, BackoffMax: time.Minute}
	for _, tc := range []struct {
		delay time.Duration
		taken int
		want  time.Duration
	}{
		{time.Second, 0, time.Second},           // a delivery: the inbox's delay
		{time.Second, 1, time.Second},           // Run's first take
		{time.Second, 2, 2 * time.Second},       // doubling
		{time.Second, 4, 8 * time.Second},       //
		{time.Second, 7, time.Minute},           // capped
		{time.Second, 1000, time.Minute},        // no overflow
		{90 * time.Second, 3, 90 * time.Second}, // the inbox's longer wait (an in-flight window)
		{time.Millisecond, 0, time.Second},      // never sooner than the first backoff
	} {
		assert.Equal(t, tc.want, nextDue(tc.delay, tc.taken, cfg), "delay %v, taken %d", tc.delay, tc.taken)
	}
}
