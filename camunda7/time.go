package camunda7

import (
	"bytes"
	"encoding/json"
	"errors"
	"time"
)

// DateLayout is the engine's date format (Java yyyy-MM-dd'T'HH:mm:ss.SSSZ)
// written as a Go time layout. The engine parses dates strictly with this
// pattern: the offset has no colon, milliseconds are mandatory, and neither
// "Z" nor an RFC 3339 offset such as "+02:00" is accepted (HTTP 400).
const DateLayout = "2006-01-02T15:04:05.000-0700"

// errDate is ParseDate's error. It deliberately does not quote the input,
// which may come from a variable holding personal data.
var errDate = errors.New("camunda7: date is not in the engine format yyyy-MM-dd'T'HH:mm:ss.SSSZ (Go layout " + DateLayout + ") or RFC 3339")

// errDateYear reports a time whose year cannot be written with the four
// digits the engine's format allows.
var errDateYear = errors.New("camunda7: date year outside 0000-9999 cannot be written in the engine format")

// FormatDate formats t in DateLayout, the only date format the engine
// accepts. It keeps t's own offset (for example +0530) so the engine sees
// the same instant and wall clock the caller meant. Precision below a
// millisecond is truncated. An offset with a seconds component (historic
// local mean time zones) cannot be written in the layout, so such a time
// is formatted in UTC instead, which preserves the instant.
func FormatDate(t time.Time) string {
	return dateForFormat(t).Format(DateLayout)
}

// dateForFormat returns t, or t in UTC if t's offset is not a whole number
// of minutes and the -0700 layout would therefore shift the instant.
func dateForFormat(t time.Time) time.Time {
	if _, off := t.Zone(); off%60 != 0 {
		return t.UTC()
	}
	return t
}

// dateYearOK reports whether FormatDate(t) yields a four-digit year that
// ParseDate and the engine can read back.
func dateYearOK(t time.Time) bool {
	y := dateForFormat(t).Year()
	return y >= 0 && y <= 9999
}

// ParseDate parses a date as the engine prints it (DateLayout, in the
// server JVM's default zone). Because responses may pass through forks or
// proxies that re-serialise dates, it also accepts RFC 3339 (with or
// without fractional seconds, "Z" or a colon offset) and the engine layout
// with any number of fractional digits. The returned time carries the
// offset found in s. On failure the error names the expected layout but
// never repeats s, which may be a secret variable value.
func ParseDate(s string) (time.Time, error) {
	// When parsing, Go accepts fractional seconds after the seconds field
	// even if the layout has none, so this covers ".000" and its variants;
	// Z0700 accepts both "+0530" and "Z".
	if t, err := time.Parse("2006-01-02T15:04:05Z0700", s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	return time.Time{}, errDate
}

// Time is a date field in engine JSON (lockExpirationTime, createTime,
// ...). It marshals in DateLayout because the engine rejects other formats,
// and maps JSON null to and from the zero Time because the engine uses
// null for "not set". Use the omitzero tag option to leave a zero Time out
// of a request entirely.
type Time struct{ time.Time }

// MarshalJSON writes null for the zero Time and otherwise the time in
// DateLayout. A year outside 0000-9999 is an error, as the engine's
// four-digit format cannot express it.
func (t Time) MarshalJSON() ([]byte, error) {
	if t.IsZero() {
		return []byte("null"), nil
	}
	if !dateYearOK(t.Time) {
		return nil, errDateYear
	}
	return json.Marshal(FormatDate(t.Time))
}

// UnmarshalJSON reads null as the zero Time and a JSON string with
// ParseDate. Anything else is an error that does not repeat the input.
func (t *Time) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if string(b) == "null" {
		t.Time = time.Time{}
		return nil
	}
	var s string
	if len(b) == 0 || b[0] != '"' || json.Unmarshal(b, &s) != nil {
		return errors.New("camunda7: date is not a JSON string")
	}
	parsed, err := ParseDate(s)
	if err != nil {
		return err
	}
	t.Time = parsed
	return nil
}
