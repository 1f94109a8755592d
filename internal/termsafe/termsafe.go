// Package termsafe makes text that came from outside safe to print on a terminal without
// hiding any of it: every character a terminal would act on or not show is printed as a
// visible escape, in Go's notation, instead of itself. Those are the control characters
// (C0, DEL, C1: escape sequences start with ESC or the C1 CSI), the bidirectional and
// other format characters (Unicode Cf: overrides, isolates, marks, zero-width spaces and
// joiners, the byte order mark, tag characters), the other characters that print as
// nothing (the Hangul fillers, variation selectors and the rest of Unicode's default
// ignorable code points), every space but the ASCII one, unassigned and private-use
// characters, and bytes that are not UTF-8:
//
//	ESC        \x1b     (BEL \a, BS \b, FF \f, CR \r, VT \v, NUL \x00, DEL \x7f)
//	U+202E     \u202e   (U+009B \u009b, U+200B \u200b)
//	U+E0041    \U000e0041
//	byte 0xff  \xff
//
// So no text printed through it can move the cursor, rewrite a line already printed,
// retitle the window, hide a hyperlink, or read as other text than it is: what was
// stripped before is shown now, so that two values that differ print apart.
//
// String and Writer keep newlines and tabs (the layout of messages, tables and JSON) and
// backslashes as they are. Value also escapes newlines, tabs and backslashes (\n, \t,
// \\): it prints one stored value so that no two values print the same, and ParseValue
// reads back what it printed. JSON escapes what Writer would, in JSON's own notation, so
// that JSON stays JSON through a Writer.
package termsafe

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Escaped reports whether r is printed as an escape (by String, Writer, Value and JSON)
// rather than as itself. Newline and tab are: String and Writer keep them all the same.
func Escaped(r rune) bool {
	switch {
	case r < 0x20 || r == 0x7f:
		return true
	case r < 0x80:
		return false
	case r == 0x2800, r == 0xFFFC, r == 0x16FE4:
		// The Braille blank, OBJECT REPLACEMENT CHARACTER and KHITAN SMALL SCRIPT
		// FILLER: printable symbols that terminals draw as blank.
		return true
	}
	return !unicode.IsPrint(r) || unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r) ||
		unicode.Is(unicode.Variation_Selector, r)
}

// appendEscape appends r's escape, in Go's notation.
func appendEscape(b []byte, r rune) []byte {
	switch r {
	case '\a':
		return append(b, `\a`...)
	case '\b':
		return append(b, `\b`...)
	case '\f':
		return append(b, `\f`...)
	case '\n':
		return append(b, `\n`...)
	case '\r':
		return append(b, `\r`...)
	case '\t':
		return append(b, `\t`...)
	case '\v':
		return append(b, `\v`...)
	case '\\':
		return append(b, `\\`...)
	}
	switch {
	case r < 0x80:
		return fmt.Appendf(b, `\x%02x`, r)
	case r < 0x10000:
		return fmt.Appendf(b, `\u%04x`, r)
	}
	return fmt.Appendf(b, `\U%08x`, r)
}

// appendText appends s with what a terminal would act on or hide escaped; value also
// escapes newlines, tabs and backslashes. It returns the bytes of s left over: the start
// of a UTF-8 sequence cut at its end, unless final.
func appendText(b []byte, s []byte, value, final bool) ([]byte, []byte) {
	for len(s) > 0 {
		r, n := utf8.DecodeRune(s)
		switch {
		case r == utf8.RuneError && n <= 1 && !final && !utf8.FullRune(s):
			return b, s
		case r == utf8.RuneError && n <= 1:
			b = fmt.Appendf(b, `\x%02x`, s[0])
		case !value && (r == '\n' || r == '\t'):
			b = append(b, byte(r))
		case Escaped(r) || (value && r == '\\'):
			b = appendEscape(b, r)
		default:
			b = append(b, s[:n]...)
		}
		s = s[n:]
	}
	return b, nil
}

// String returns s with what a terminal would act on or hide escaped; newlines, tabs
// and backslashes stay as they are.
func String(s string) string {
	b, _ := appendText(nil, []byte(s), false, true)
	return string(b)
}

// Value returns s as the operator's CLI prints one stored value: String's escapes, and
// newlines, tabs and backslashes escaped too (\n, \t, \\). Different values print
// differently, on one line, and ParseValue(Value(s)) is s.
func Value(s string) string {
	b, _ := appendText(nil, []byte(s), true, true)
	return string(b)
}

// ParseValue reads a value as Value prints it: each escape (\xHH a byte, \uHHHH and
// \UHHHHHHHH a character, \a \b \f \n \r \t \v, \\ a backslash, \NNN an octal byte)
// stands for what it escapes; every other byte stands for itself. A backslash that
// starts no escape is an error: Value never prints one.
func ParseValue(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b []byte
	for rest := s; rest != ""; {
		if rest[0] != '\\' {
			b = append(b, rest[0])
			rest = rest[1:]
			continue
		}
		r, multibyte, tail, err := strconv.UnquoteChar(rest, 0)
		if err != nil {
			return "", fmt.Errorf("%q: a backslash that starts no escape at %q (write a backslash as \\\\)", s, cutAt(rest, 10))
		}
		if multibyte {
			b = utf8.AppendRune(b, r)
		} else {
			b = append(b, byte(r))
		}
		rest = tail
	}
	return string(b), nil
}

func cutAt(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// JSON returns JSON text j with every character Writer would escape written as JSON's
// own escape (\uHHHH, a surrogate pair beyond U+FFFF), so that it passes a Writer as it
// is and still decodes to the same values. Such characters can only be inside JSON
// strings; JSON escapes newlines, tabs and other C0 controls there itself, and those
// outside strings are layout. Bytes that are not UTF-8 (which encoding/json never
// writes) become \ufffd.
func JSON(j []byte) []byte {
	out := make([]byte, 0, len(j))
	for len(j) > 0 {
		r, n := utf8.DecodeRune(j)
		switch {
		case r == '\n' || r == '\t' || r == '\r' || r == ' ':
			out = append(out, byte(r))
		case r == utf8.RuneError && n <= 1:
			out = append(out, `\ufffd`...)
		case Escaped(r) && r >= 0x10000:
			hi, lo := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, hi, lo)
		case Escaped(r):
			out = fmt.Appendf(out, `\u%04x`, r)
		default:
			out = append(out, j[:n]...)
		}
		j = j[n:]
	}
	return out
}

// Writer escapes, as String does, everything written to it before passing it on; a
// UTF-8 sequence split across writes is still read as one character.
type Writer struct {
	w       io.Writer
	buf     []byte
	pending []byte // the start of a UTF-8 sequence cut at the end of the last write
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write escapes p and writes the result. It reports len(p) on success: the bytes held
// back (the start of a character cut at the end of p) are written with the next Write.
func (w *Writer) Write(p []byte) (int, error) {
	in := p
	if len(w.pending) > 0 {
		in = append(w.pending, p...)
	}
	w.buf, w.pending = appendText(w.buf[:0], in, false, false)
	w.pending = append([]byte(nil), w.pending...)
	if len(w.buf) > 0 {
		if _, err := w.w.Write(w.buf); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Flush writes what Write held back, the start of a character that never came whole, as
// \xHH escapes.
func (w *Writer) Flush() error {
	if len(w.pending) == 0 {
		return nil
	}
	w.buf, _ = appendText(w.buf[:0], w.pending, false, true)
	w.pending = nil
	_, err := w.w.Write(w.buf)
	return err
}
