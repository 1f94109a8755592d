package tasks_test

import (
	"context"
	"log/slog"
	"sync"
)

// recordingHandler keeps every record's message and attributes, for asserting on logs.
type recordingHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func newLogger(h *recordingHandler) *slog.Logger { return slog.New(h) }

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

func (h *recordingHandler) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.records {
		if r.Message == msg {
			n++
		}
	}
	return n
}
