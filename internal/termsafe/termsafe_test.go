package termsafe_test

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"

	"github.com/extworker/extworker/internal/termsafe"
)

func TestString(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"plain", "invoice:42 ch_123 €", "invoice:42 ch_123 €"},
		{"newline and tab kept", "a\tb\nc", "a\tb\nc"},
		{"colour", "\x1b[31mred\x1b[0m", "red"},
		{"cursor up and erase line", "ok\x1b[1A\x1b[2Kforged", "okforged"},
		{"window title (OSC, BEL)", "\x1b]0;pwned\x07after", "after"},
		{"hyperlink (OSC 8, ST)", "\x1b]8;;http://evil\x1b\\click\x1b]8;;\x1b\\", "click"},
		{"DCS", "\x1bPq#0;2;0;0;0\x1b\\x", "x"},
		{"two-byte escape", "a\x1bcb", "ab"},
		{"carriage return overwrite", "confirmed\rrejected", "confirmedrejected"},
		{"backspace and bell", "ab\x08\x07c", "abc"},
		{"C1 CSI", "a\u009b31mb", "a31mb"},
		{"bidi override", "key\u202eexe.txt", "keyexe.txt"},
		{"bidi isolate", "\u2066x\u2069", "x"},
		{"invalid UTF-8", "a\xffb", "a\ufffdb"},
		{"truncated UTF-8 at end", "a\xe2\x82", "a\ufffd"},
		{"unterminated OSC gives up", "\x1b]" + strings.Repeat("x", 600) + "tail", strings.Repeat("x", 600-513) + "tail"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := termsafe.String(c.in)
			assert.Equal(t, c.want, got)
			assert.NotContains(t, got, "\x1b")
			assert.True(t, utf8.ValidString(got))
		})
	}
}

// A sequence split across writes is recognised as one.
func TestWriterAcrossWrites(t *testing.T) {
	var buf bytes.Buffer
	w := termsafe.NewWriter(&buf)
	in := "key \x1b[3" + "1mred\x1b]0;ti" + "tle\x07 €\u202e"
	for i := 0; i < len(in); i++ { // one byte at a time
		n, err := w.Write([]byte{in[i]})
		assert.NoError(t, err)
		assert.Equal(t, 1, n)
	}
	assert.Equal(t, "key red €", buf.String())
}

func FuzzString(f *testing.F) {
	f.Add("\x1b[31mx\x1b]0;t\x07\u009b\u202e")
	f.Fuzz(func(t *testing.T, s string) {
		got := termsafe.String(s)
		for _, r := range got {
			if r == 0x1b || (r < 0x20 && r != '\n' && r != '\t') || r == 0x7f || (r >= 0x80 && r <= 0x9f) {
				t.Fatalf("%q left %U in %q", s, r, got)
			}
		}
	})
}
