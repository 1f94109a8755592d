package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// fakeCourier is the courier's API for the tests: one booking per Idempotency-Key,
// postcode 00000 refused with a 422, bookings looked up by key.
type fakeCourier struct {
	mu       sync.Mutex
	bookings map[string]string // key -> booking id
	posts    int
}

func startCourier(t *testing.T) (*fakeCourier, courier) {
	f := &fakeCourier{bookings: map[string]string{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, courier{URL: srv.URL}
}

func (f *fakeCourier) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Method == http.MethodGet {
		id, ok := f.bookings[r.URL.Query().Get("key")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, `{"id":%q}`, id)
		return
	}
	f.posts++
	var in booking
	if err := decode(r, &in); err != nil || in.Postcode == "00000" {
		w.WriteHeader(http.StatusUnprocessableEntity)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	id, ok := f.bookings[key]
	if !ok {
		id = fmt.Sprintf("bk_%d", len(f.bookings)+1)
		f.bookings[key] = id
	}
	fmt.Fprintf(w, `{"id":%q}`, id)
}

// booked is how many bookings the courier made.
func (f *fakeCourier) booked() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.bookings)
}
