// Package termsafe strips what a terminal would act on from text that came from outside:
// escape sequences (CSI, OSC, DCS and the rest), control characters other than newline
// and tab, C1 controls, and the Unicode bidirectional overrides that make text read
// differently from what it is. The operator's CLI prints intent keys, provider messages
// and incident messages through it, so none of them can move the cursor, rewrite a line
// already printed, retitle the window or hide a hyperlink.
package termsafe

import (
	"io"
	"strings"
	"unicode/utf8"
)

// String returns s with escape sequences and control characters removed.
func String(s string) string {
	var b strings.Builder
	f := filter{out: &b}
	f.feed([]byte(s))
	f.flush()
	return b.String()
}

// Writer filters everything written to it before passing it on; a sequence split across
// writes is still recognised.
type Writer struct {
	w   io.Writer
	f   filter
	buf []byte
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write filters p and writes what remains. It reports len(p) on success: the bytes
// stripped were consumed.
func (w *Writer) Write(p []byte) (int, error) {
	w.buf = w.buf[:0]
	w.f.out = (*sliceWriter)(&w.buf)
	w.f.feed(p)
	if len(w.buf) > 0 {
		if _, err := w.w.Write(w.buf); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

type sliceWriter []byte

func (s *sliceWriter) WriteByte(c byte) error { *s = append(*s, c); return nil }
func (s *sliceWriter) Write(p []byte) (int, error) {
	*s = append(*s, p...)
	return len(p), nil
}

type byteWriter interface {
	io.Writer
	WriteByte(byte) error
}

// maxString bounds an unterminated OSC, DCS, SOS, PM or APC string: past it the filter
// gives up on the sequence and prints what follows, rather than swallow the rest.
const maxString = 512

type state uint8

const (
	normal    state = iota
	escape          // after ESC
	csi             // ESC [ ... final byte
	str             // ESC ] / P / X / ^ / _ ... BEL or ESC \
	strEscape       // ESC inside a string
)

type filter struct {
	out     byteWriter
	st      state
	n       int    // bytes in the current string
	pending []byte // an incomplete UTF-8 sequence
}

func (f *filter) feed(p []byte) {
	for _, c := range p {
		f.byte(c)
	}
}

func (f *filter) byte(c byte) {
	switch f.st {
	case escape:
		switch c {
		case '[':
			f.st = csi
		case ']', 'P', 'X', '^', '_':
			f.st, f.n = str, 0
		default:
			f.st = normal // a two-byte sequence: dropped
		}
		return
	case csi:
		if c >= 0x40 && c <= 0x7e || c < 0x20 || c >= 0x80 {
			f.st = normal // final byte (or garbage): the sequence ends, dropped
		}
		return
	case str:
		f.n++
		switch {
		case c == 0x07:
			f.st = normal
		case c == 0x1b:
			f.st = strEscape
		case f.n > maxString:
			f.st = normal
		}
		return
	case strEscape:
		f.st = normal // ESC \ ends the string; anything else does too
		return
	}
	if len(f.pending) > 0 || c >= 0x80 {
		f.pending = append(f.pending, c)
		if !utf8.FullRune(f.pending) {
			return
		}
		r, size := utf8.DecodeRune(f.pending)
		rest := f.pending[size:]
		seq := f.pending[:size]
		f.pending = nil
		if r == utf8.RuneError && size <= 1 {
			_, _ = f.out.Write([]byte(string(utf8.RuneError)))
		} else if !unsafeRune(r) {
			_, _ = f.out.Write(seq)
		}
		for _, b := range rest {
			f.byte(b)
		}
		return
	}
	switch {
	case c == 0x1b:
		f.st = escape
	case c == '\n' || c == '\t':
		_ = f.out.WriteByte(c)
	case c < 0x20 || c == 0x7f:
		// other control characters (CR, BS, BEL, ...) dropped
	default:
		_ = f.out.WriteByte(c)
	}
}

// flush ends the input: an incomplete UTF-8 sequence becomes U+FFFD.
func (f *filter) flush() {
	if len(f.pending) > 0 {
		f.pending = nil
		_, _ = f.out.Write([]byte(string(utf8.RuneError)))
	}
}

// unsafeRune reports C1 controls (U+0080-U+009F; U+009B is a one-character CSI),
// bidirectional embeddings, overrides and isolates, and other invisible format controls
// that reorder or hide text.
func unsafeRune(r rune) bool {
	switch {
	case r >= 0x80 && r <= 0x9f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069, r == 0x200e, r == 0x200f, r == 0x061c:
		return true
	}
	return false
}
