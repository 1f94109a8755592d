package console

import (
	"fmt"
	"html/template"
	"strings"
	"unicode"
	"unicode/utf8"
)

// This file is how text from outside is shown, and what an operator may type.
//
// Keys, scopes, reasons, provider references, values and engine messages come from
// workers, providers, the engine and other operators. A bidirectional override in a key
// (S-U+202E2001 reads "S-1002") or a zero-width character would make two different
// things look the same, so every character a reader cannot see, or that rearranges what
// follows, is shown as its escape (\u202E) in a marked span, never passed to the
// browser to interpret: control characters (Cc) other than tab and newline, format
// characters (Cf: the bidi controls U+202A–U+202E, U+2066–U+2069, U+200E, U+200F,
// U+061C, zero-width characters, the soft hyphen), the line and paragraph separators,
// and bytes that are not UTF-8.

// hiddenRune reports whether r is shown as its escape.
func hiddenRune(r rune) bool {
	if r == '\t' || r == '\n' {
		return false
	}
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp)
}

// escapeRune is how a hidden rune reads: \u202E, \U000E0001.
func escapeRune(r rune) string {
	if r > 0xFFFF {
		return fmt.Sprintf(`\U%08X`, r)
	}
	return fmt.Sprintf(`\u%04X`, r)
}

// visibleHTML is s for a page's text: escaped for HTML, with every hidden rune and
// every byte that is not UTF-8 shown as its escape in <span class="ctl">.
func visibleHTML(s string) template.HTML {
	var b strings.Builder
	mark := func(esc string) { b.WriteString(`<span class="ctl">` + esc + `</span>`) }
	visible(s, func(text string) { b.WriteString(template.HTMLEscapeString(text)) }, mark)
	return template.HTML(b.String()) //nolint:gosec // built from escaped text and fixed markup
}

// visiblePlain is s with the same escapes as plain text, for where markup cannot go (a
// page's title); the template escapes it.
func visiblePlain(s string) string {
	var b strings.Builder
	visible(s, func(text string) { b.WriteString(text) }, func(esc string) { b.WriteString(esc) })
	return b.String()
}

// visible splits s into runs of visible text and the escapes of what is not.
func visible(s string, text, escape func(string)) {
	start := 0
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		bad := r == utf8.RuneError && n == 1
		if !bad && !hiddenRune(r) {
			i += n
			continue
		}
		if start < i {
			text(s[start:i])
		}
		if bad {
			escape(fmt.Sprintf(`\x%02X`, s[i]))
		} else {
			escape(escapeRune(r))
		}
		i += n
		start = i
	}
	if start < len(s) {
		text(s[start:])
	}
}

// field is one thing an operator types, with what the console accepts in it.
type field struct {
	label string
	max   int  // bytes
	lines bool // newlines allowed (a list, or a long reason)
}

// Fields of the forms.
var (
	fieldReason      = field{"the reason", 1000, true}
	fieldProviderRef = field{"the provider reference", 200, false}
	fieldErrorCode   = field{"the error code", 100, false}
	fieldValues      = field{"the result values", 2000, true}
)

// check refuses what the console does not store: text that is not UTF-8, a character a
// reader of the trail could not see or that rearranges the text (the same escapes as
// visibleHTML; a tab, and a newline where lines are allowed, excepted), or too much.
func (f field) check(s string) error {
	if len(s) > f.max {
		return fmt.Errorf("%s is longer than %d bytes", f.label, f.max)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s is not UTF-8 text", f.label)
	}
	for i, r := range []rune(s) {
		if r == '\n' && f.lines {
			continue
		}
		if hiddenRune(r) || r == '\n' {
			return fmt.Errorf("%s has an invisible or control character (%s) at character %d; type it again without it", f.label, escapeRune(r), i+1)
		}
	}
	return nil
}

// typed is what a form field holds, with a browser's CRLF line ends made LF.
func typed(s string) string { return strings.ReplaceAll(s, "\r\n", "\n") }

// refill is s fit to put back into a form field: as typed, but UTF-8 (a page must be).
func refill(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// validQuery refuses a scope or key no intent can have: PostgreSQL stores UTF-8 text
// without NUL.
func validQuery(s string) bool {
	return len(s) <= 4096 && utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}
