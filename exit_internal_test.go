package extworker

import (
	"bytes"
	"errors"
	"testing"

	"github.com/extworker/extworker/internal/daemon"
)

// Main prints its error escaped: an error quoting bytes from outside (here an escape
// sequence that would clear the screen and retitle the window) cannot act on the
// terminal; and exits 0, 78 or 1.
func TestMainPrintsItsErrorEscaped(t *testing.T) {
	var out bytes.Buffer
	code := exitWith(&out, errors.New("engine answered \x1b[2J\x1b]0;owned\a"))
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if got, want := out.String(), `extworker: engine answered \x1b[2J\x1b]0;owned\a`+"\n"; got != want {
		t.Errorf("printed %q, want %q", got, want)
	}
	out.Reset()
	if code := exitWith(&out, daemon.ConfigError{Err: errors.New("bad")}); code != ExitConfig {
		t.Errorf("a configuration error: exit %d, want %d", code, ExitConfig)
	}
	if code := exitWith(&out, nil); code != 0 || out.String() != "extworker: bad\n" {
		t.Errorf("no error: exit %d and %q printed, want 0 and nothing more", code, out.String())
	}
}
