package fakeprovider

import "time"

// Now is the provider's virtual clock: real time plus everything Advance added, in UTC
// without a monotonic reading (so it survives a JSON round trip unchanged). Key
// retention, search lag and every recorded time run on it.
func (s *Server) Now() time.Time {
	return time.Now().Add(time.Duration(s.offset.Load())).UTC().Round(0)
}

// Advance moves the virtual clock forward by d, for example past the key retention
// (25h) or the search lag. Real waits (the slow delay) do not use it. A negative d is
// ignored: the clock never goes back.
func (s *Server) Advance(d time.Duration) {
	if d > 0 {
		s.offset.Add(int64(d))
	}
}
