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
// (S-U+202E2001 reads "S-1002"), a zero-width character, a no-break space or a Hangul
// filler would make two different things look the same, so every character a reader
// cannot see for what it is, or that rearranges what follows, is shown as its escape
// (\u202E) in a marked span, never passed to the browser to interpret (hiddenRune), and
// so is a space at the start or the end of a string. A string with a run of spaces or a
// line break is shown in a span that keeps its whitespace (white-space: pre-wrap), so
// that "a  b" does not read "a b".

// hiddenRune reports whether r is shown as its escape, and refused in a form: every
// control character but the newline (Cc: the tab too), every format character (Cf: the
// bidi controls U+202A–U+202E, U+2066–U+2069, U+200E, U+200F, U+061C, zero-width
// characters and joiners, the soft hyphen, tags), every separator and space but U+0020
// (Z: U+00A0, U+2000–U+200A, U+3000, the line and paragraph separators), the default
// ignorable code points (the combining grapheme joiner, the Hangul fillers, the Khmer
// inherent vowels), the variation selectors, the Braille blank U+2800, U+FFFC, U+16FE4, and private-use,
// surrogate and unassigned code points.
func hiddenRune(r rune) bool {
	switch {
	case r == '\n':
		return false
	case r < 0x7F:
		return r < 0x20
	case r == 0x2800, r == 0xFFFC, r == 0x16FE4: // the Braille blank, OBJECT REPLACEMENT CHARACTER and
		return true // KHITAN SMALL SCRIPT FILLER: symbols a browser draws as blank (found by an outside review)
	}
	return !unicode.IsPrint(r) || unicode.In(r, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector)
}

// escapeRune is how a hidden rune reads: \u202E, \U000E0001.
func escapeRune(r rune) string {
	if r > 0xFFFF {
		return fmt.Sprintf(`\U%08X`, r)
	}
	return fmt.Sprintf(`\u%04X`, r)
}

// visibleHTML is s for a page's text: escaped for HTML, with every hidden rune, every
// byte that is not UTF-8 and a space at either end shown as its escape in
// <span class="ctl">; in <span class="ws"> (white-space: pre-wrap) when it has a run of
// spaces or a line break, which HTML would collapse.
func visibleHTML(s string) template.HTML {
	var b strings.Builder
	mark := func(esc string) { b.WriteString(`<span class="ctl">` + esc + `</span>`) }
	visible(s, func(text string) { b.WriteString(template.HTMLEscapeString(text)) }, mark)
	out := b.String()
	if strings.Contains(s, "  ") || strings.Contains(s, "\n") {
		out = `<span class="ws">` + out + `</span>`
	}
	return template.HTML(out) //nolint:gosec // built from escaped text and fixed markup
}

// visiblePlain is s with the same escapes as plain text, for where markup cannot go (a
// page's title); the template escapes it.
func visiblePlain(s string) string {
	var b strings.Builder
	visible(s, func(text string) { b.WriteString(text) }, func(esc string) { b.WriteString(esc) })
	return b.String()
}

// visible splits s into runs of visible text and the escapes of what is not: hidden
// runes, bytes that are not UTF-8, and a space at the start or the end.
func visible(s string, text, escape func(string)) {
	start := 0
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		bad := r == utf8.RuneError && n == 1
		edge := r == ' ' && (i == 0 || i+n == len(s))
		if !bad && !edge && !hiddenRune(r) {
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
	runs  bool // runs of spaces allowed (not in a reference, which a reader copies)
}

// Fields of the forms.
var (
	fieldReason      = field{"the reason", 1000, true, true}
	fieldProviderRef = field{"the provider reference", 200, false, false}
	fieldErrorCode   = field{"the error code", 100, false, true}
	fieldValues      = field{"the result values", 2000, true, true}
)

// check refuses what the console does not store: text that is not UTF-8, a character a
// reader of the trail could not see for what it is (hiddenRune, the same characters the
// pages escape; a newline where lines are allowed excepted), named, two spaces in a row
// where they are not allowed, or too much. The ledger refuses such characters in a
// verdict too: the console says so first, and plainly.
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
			return fmt.Errorf("%s is not allowed in %s (character %d, shown as %s: a reader could not see it for what it is); type it again without it",
				runeName(r), f.label, i+1, escapeRune(r))
		}
	}
	if !f.runs && strings.Contains(strings.TrimSpace(s), "  ") {
		return fmt.Errorf("%s has two spaces in a row (a reader could not count them); type it with one", f.label)
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
