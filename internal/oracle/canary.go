package oracle

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"slices"
)

// Source is one place a secret could end up: a worker's log, the ledger's rows as text,
// the engine's incident messages, errorDetails or variables.
type Source struct {
	Name string // where, as a report names it: a file path, "engine incidents", ...
	R    io.Reader
}

// Leak is one canary found in a source.
type Leak struct {
	Canary string
	Source string
	Line   int   // 1-based line of the hit
	Offset int64 // byte offset of the hit in the source
}

func (l Leak) String() string {
	return fmt.Sprintf("I9: canary %q in %s, line %d (byte %d)", l.Canary, l.Source, l.Line, l.Offset)
}

// ScanCanaries checks I9 (no secret leaks): it reads every source to the end and
// returns each occurrence of each canary with where it was, in source order. Sources
// are read in chunks, so a multi-megabyte log costs no more memory than a chunk, and a
// canary split across two chunks is still found. An error reading a source is returned
// with the leaks found so far: a source that cannot be read has not been checked.
func ScanCanaries(canaries []string, sources ...Source) ([]Leak, error) {
	var leaks []Leak
	longest := 0
	for _, c := range canaries {
		longest = max(longest, len(c))
	}
	if longest == 0 {
		return nil, nil
	}
	const chunk = 64 << 10
	for _, src := range sources {
		var (
			buf  = make([]byte, 0, chunk+longest)
			base int64 // offset of buf[0] in the source
			line = 1   // line of buf[0]
		)
		for eof := false; !eof; {
			n, err := io.ReadFull(src.R, buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+n]
			switch {
			case err == io.EOF || err == io.ErrUnexpectedEOF:
				eof = true
			case err != nil:
				return leaks, fmt.Errorf("I9: read %s: %w", src.Name, err)
			}
			// Search hits starting before limit; unless this is the end, the last
			// longest-1 bytes wait for the next round, as a hit starting there may not be
			// complete yet.
			limit := len(buf)
			if !eof {
				limit = max(0, len(buf)-(longest-1))
			}
			var found []Leak
			for _, c := range canaries {
				if c == "" {
					continue
				}
				for from := 0; from < limit; {
					i := bytes.Index(buf[from:], []byte(c))
					if i < 0 || from+i >= limit {
						break
					}
					at := from + i
					found = append(found, Leak{Canary: c, Source: src.Name, Offset: base + int64(at),
						Line: line + bytes.Count(buf[:at], []byte{'\n'})})
					from = at + 1
				}
			}
			slices.SortFunc(found, func(a, b Leak) int { return cmp.Compare(a.Offset, b.Offset) })
			leaks = append(leaks, found...)
			// Drop what no later hit can start in.
			line += bytes.Count(buf[:limit], []byte{'\n'})
			base += int64(limit)
			buf = buf[:copy(buf, buf[limit:])]
		}
	}
	return leaks, nil
}
