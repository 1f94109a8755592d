package termsafe_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/termsafe"
)

// unsafe reports a character no output of the package may carry as it is.
func unsafe(r rune) bool {
	switch {
	case r == 0x1b, r < 0x20 && r != '\n' && r != '\t', r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r == 0x061c, r == 0x115f, r == 0x1160, r == 0x180e, r >= 0x200b && r <= 0x200f, r >= 0x202a && r <= 0x202e,
		r >= 0x2060 && r <= 0x2069, r == 0x3164, r == 0xfeff, r >= 0xfff9 && r <= 0xfffb, r == 0xffa0, r == 0xad:
		return true
	}
	return false
}

func assertVisible(t *testing.T, in, got string) {
	t.Helper()
	assert.True(t, utf8.ValidString(got), "%q gave invalid UTF-8 %q", in, got)
	for _, r := range got {
		if unsafe(r) {
			t.Errorf("%q left %U in %q", in, r, got)
		}
	}
}

// TestString: what a terminal would act on, or hide, is shown as an escape, never
// dropped: the text an operator reads is the text that was there. Newlines and tabs are
// kept (String is for layout: messages, errors).
func TestString(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"plain", "invoice:42 ch_123 €", "invoice:42 ch_123 €"},
		{"newline and tab kept", "a\tb\nc", "a\tb\nc"},
		{"backslash kept", `C:\tmp`, `C:\tmp`},
		{"colour", "\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`},
		{"cursor up and erase line", "ok\x1b[1A\x1b[2Kforged", `ok\x1b[1A\x1b[2Kforged`},
		{"window title (OSC, BEL)", "\x1b]0;pwned\x07after", `\x1b]0;pwned\aafter`},
		{"carriage return overwrite", "confirmed\rrejected", `confirmed\rrejected`},
		{"backspace and NUL", "ab\x08\x00c", `ab\b\x00c`},
		{"DEL", "a\x7fb", `a\x7fb`},
		{"C1 CSI", "a\u009b31mb", `a\u009b31mb`},
		{"bidi override", "abc\u202efdp.exe", `abc\u202efdp.exe`},
		{"symbols drawn as blank (second outside review)", "ch_\ufffc1 \u2800 \U00016fe4", `ch_\ufffc1 \u2800 \U00016fe4`},
		{"bidi override alone", "\u202e", `\u202e`},
		{"bidi isolate", "\u2066x\u2069", `\u2066x\u2069`},
		{"arabic letter mark", "\u061c", `\u061c`},
		{"zero-width space", "zero\u200bwidth", `zero\u200bwidth`},
		{"zero-width joiners and marks", "\u200c\u200d\u200e\u200f", `\u200c\u200d\u200e\u200f`},
		{"word joiner, invisible operators", "\u2060\u2061\u2062\u2063\u2064", `\u2060\u2061\u2062\u2063\u2064`},
		{"hangul fillers", "\u115f\u1160\u3164\uffa0", `\u115f\u1160\u3164\uffa0`},
		{"mongolian vowel separator", "\u180e", `\u180e`},
		{"byte order mark", "\ufeffkey", `\ufeffkey`},
		{"interlinear annotation", "\ufff9\ufffa\ufffb", `\ufff9\ufffa\ufffb`},
		{"soft hyphen", "pay\u00adment", `pay\u00adment`},
		{"tag character (Cf beyond the BMP)", "a\U000e0041", `a\U000e0041`},
		{"no-break space", "a\u00a0b", `a\u00a0b`},
		{"line separator", "a\u2028b", `a\u2028b`},
		{"invalid UTF-8", "a\xffb", `a\xffb`},
		{"truncated UTF-8 at end", "a\xe2\x82", `a\xe2\x82`},
		{"replacement character is text", "a\ufffdb", "a\ufffdb"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := termsafe.String(c.in)
			assert.Equal(t, c.want, got)
			assertVisible(t, c.in, got)
		})
	}
}

// TestValue: a stored value as the operator's CLI prints it: every character String
// escapes, and newlines, tabs and backslashes too, so that no two values print the same
// and ParseValue reads back what was printed.
func TestValue(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"evt-1", "evt-1"},
		{"abc\u202efdp.exe", `abc\u202efdp.exe`},
		{"abcfdp.exe", "abcfdp.exe"},
		{"\u202e", `\u202e`},
		{"zero\u200bwidth", `zero\u200bwidth`},
		{"tab\tnl\n", `tab\tnl\n`},
		{`back\slash`, `back\\slash`},
		{`abc\u202efdp.exe`, `abc\\u202efdp.exe`},
		{"esc\x1b[2J", `esc\x1b[2J`},
		{"bad-\xff", `bad-\xff`},
		{"ü €", "ü €"},
		{"", ""},
	} {
		got := termsafe.Value(c.in)
		assert.Equal(t, c.want, got, "%q", c.in)
		back, err := termsafe.ParseValue(got)
		require.NoError(t, err, "%q", got)
		assert.Equal(t, c.in, back, "ParseValue(Value(%q))", c.in)
	}
}

func TestParseValue(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`abc\u202efdp.exe`, "abc\u202efdp.exe"},
		{`a\x1bb`, "a\x1bb"},
		{`a\xffb`, "a\xffb"},
		{`a\\b`, `a\b`},
		{`\U000e0041`, "\U000e0041"},
		{"raw \u202e stays", "raw \u202e stays"},
		{"raw \xff stays", "raw \xff stays"},
		{`it's "quoted"`, `it's "quoted"`},
	} {
		got, err := termsafe.ParseValue(c.in)
		require.NoError(t, err, "%q", c.in)
		assert.Equal(t, c.want, got, "%q", c.in)
	}
	for _, bad := range []string{`a\`, `a\q`, `\x4`, `\u12`, `\"`, `\'`, `\ud800`} {
		_, err := termsafe.ParseValue(bad)
		assert.Error(t, err, "%q", bad)
	}
}

// TestValueIsOneToOne: values that differ only in what a terminal hides print apart.
func TestValueIsOneToOne(t *testing.T) {
	vals := []string{"abcfdp.exe", "abc\u202efdp.exe", `abc\u202efdp.exe`, "abc\u200bfdp.exe", "-", "\u202e", "", "a\u00a0b", "a b",
		"a\x1bb", `a\x1bb`, "a\xffb", `a\xffb`, "a\ufffdb", "a\nb", `a\nb`, "a\tb", "a b"}
	seen := map[string]string{}
	for _, v := range vals {
		p := termsafe.Value(v)
		if prev, ok := seen[p]; ok && prev != v {
			t.Errorf("%q and %q both print as %q", prev, v, p)
		}
		seen[p] = v
	}
}

// A sequence split across writes is recognised as one.
func TestWriterAcrossWrites(t *testing.T) {
	var buf bytes.Buffer
	w := termsafe.NewWriter(&buf)
	in := "key \x1b[3" + "1mred €\u202e\u200b\xff."
	for i := 0; i < len(in); i++ { // one byte at a time
		n, err := w.Write([]byte{in[i]})
		assert.NoError(t, err)
		assert.Equal(t, 1, n)
	}
	assert.Equal(t, `key \x1b[31mred €\u202e\u200b\xff.`, buf.String())
}

// TestWriterKeepsJSONValid: JSON escaped with JSON stays valid through the Writer and
// decodes to the values it was made of.
func TestWriterKeepsJSONValid(t *testing.T) {
	in := map[string]string{"id": "abc\u202efdp.exe\u200b\x7f\u0085\U000e0041\ufeff", "type": "esc\x1b[2J\ttab\n", "path": `C:\tmp`}
	b, err := json.Marshal(in)
	require.NoError(t, err)
	var buf bytes.Buffer
	_, err = termsafe.NewWriter(&buf).Write(termsafe.JSON(b))
	require.NoError(t, err)
	assertVisible(t, string(b), buf.String())
	var out map[string]string
	require.NoError(t, json.Unmarshal(buf.Bytes(), &out), buf.String())
	assert.Equal(t, in, out)
}

func FuzzString(f *testing.F) {
	f.Add("\x1b[31mx\x1b]0;t\x07\u009b\u202e")
	f.Add("a\\u202eb\u202e\xff\u200b")
	f.Fuzz(func(t *testing.T, s string) {
		got := termsafe.String(s)
		assertVisible(t, s, got)
		v := termsafe.Value(s)
		assertVisible(t, s, v)
		assert.False(t, strings.ContainsAny(v, "\n\t"), "Value(%q) = %q keeps a newline or tab", s, v)
		back, err := termsafe.ParseValue(v)
		if err != nil || back != s {
			t.Fatalf("ParseValue(Value(%q)) = %q, %v", s, back, err)
		}
		var buf bytes.Buffer
		w := termsafe.NewWriter(&buf)
		_, _ = w.Write([]byte(s))
		assert.NoError(t, w.Flush())
		assert.Equal(t, got, buf.String(), "the Writer and String agree")

		j, err := json.Marshal(s)
		require.NoError(t, err)
		buf.Reset()
		_, _ = termsafe.NewWriter(&buf).Write(termsafe.JSON(j))
		var want, decoded string
		require.NoError(t, json.Unmarshal(j, &want))
		require.NoError(t, json.Unmarshal(buf.Bytes(), &decoded), "%s", buf.String())
		assert.Equal(t, want, decoded, "JSON through the Writer")
	})
}
