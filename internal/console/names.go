package console

import (
	"fmt"
	"unicode"
)

// This file names the characters a form refuses (hiddenRune), as the Unicode standard
// does, so that an operator told "U+3164 HANGUL FILLER is not allowed in the provider
// reference" knows what to look for. The names are those of the characters a keyboard,
// a copy from a web page or a spreadsheet brings; the rest are named by their kind.

// runeNames are the names of the hidden characters an operator is likely to paste.
var runeNames = map[rune]string{
	0x00: "NULL", 0x09: "CHARACTER TABULATION", 0x0A: "LINE FEED", 0x0D: "CARRIAGE RETURN", 0x1B: "ESCAPE", 0x7F: "DELETE",
	0x85: "NEXT LINE", 0xA0: "NO-BREAK SPACE", 0xAD: "SOFT HYPHEN", 0x034F: "COMBINING GRAPHEME JOINER",
	0x061C: "ARABIC LETTER MARK", 0x115F: "HANGUL CHOSEONG FILLER", 0x1160: "HANGUL JUNGSEONG FILLER",
	0x1680: "OGHAM SPACE MARK", 0x17B4: "KHMER VOWEL INHERENT AQ", 0x17B5: "KHMER VOWEL INHERENT AA",
	0x180B: "MONGOLIAN FREE VARIATION SELECTOR ONE", 0x180C: "MONGOLIAN FREE VARIATION SELECTOR TWO",
	0x180D: "MONGOLIAN FREE VARIATION SELECTOR THREE", 0x180E: "MONGOLIAN VOWEL SEPARATOR",
	0x180F: "MONGOLIAN FREE VARIATION SELECTOR FOUR",
	0x2000: "EN QUAD", 0x2001: "EM QUAD", 0x2002: "EN SPACE", 0x2003: "EM SPACE", 0x2004: "THREE-PER-EM SPACE",
	0x2005: "FOUR-PER-EM SPACE", 0x2006: "SIX-PER-EM SPACE", 0x2007: "FIGURE SPACE", 0x2008: "PUNCTUATION SPACE",
	0x2009: "THIN SPACE", 0x200A: "HAIR SPACE", 0x200B: "ZERO WIDTH SPACE", 0x200C: "ZERO WIDTH NON-JOINER",
	0x200D: "ZERO WIDTH JOINER", 0x200E: "LEFT-TO-RIGHT MARK", 0x200F: "RIGHT-TO-LEFT MARK", 0x2028: "LINE SEPARATOR",
	0x2029: "PARAGRAPH SEPARATOR", 0x202A: "LEFT-TO-RIGHT EMBEDDING", 0x202B: "RIGHT-TO-LEFT EMBEDDING",
	0x202C: "POP DIRECTIONAL FORMATTING", 0x202D: "LEFT-TO-RIGHT OVERRIDE", 0x202E: "RIGHT-TO-LEFT OVERRIDE",
	0x202F: "NARROW NO-BREAK SPACE", 0x205F: "MEDIUM MATHEMATICAL SPACE", 0x2060: "WORD JOINER",
	0x2061: "FUNCTION APPLICATION", 0x2062: "INVISIBLE TIMES", 0x2063: "INVISIBLE SEPARATOR", 0x2064: "INVISIBLE PLUS",
	0x2066: "LEFT-TO-RIGHT ISOLATE", 0x2067: "RIGHT-TO-LEFT ISOLATE", 0x2068: "FIRST STRONG ISOLATE",
	0x2069: "POP DIRECTIONAL ISOLATE", 0x206A: "INHIBIT SYMMETRIC SWAPPING", 0x206B: "ACTIVATE SYMMETRIC SWAPPING",
	0x206C: "INHIBIT ARABIC FORM SHAPING", 0x206D: "ACTIVATE ARABIC FORM SHAPING", 0x206E: "NATIONAL DIGIT SHAPES",
	0x206F: "NOMINAL DIGIT SHAPES", 0x2800: "BRAILLE PATTERN BLANK", 0xFFFC: "OBJECT REPLACEMENT CHARACTER", 0x16FE4: "KHITAN SMALL SCRIPT FILLER", 0x3000: "IDEOGRAPHIC SPACE",
	0x3164: "HANGUL FILLER", 0xFEFF: "ZERO WIDTH NO-BREAK SPACE", 0xFFA0: "HALFWIDTH HANGUL FILLER",
	0xFFF9: "INTERLINEAR ANNOTATION ANCHOR", 0xFFFA: "INTERLINEAR ANNOTATION SEPARATOR",
	0xFFFB: "INTERLINEAR ANNOTATION TERMINATOR", 0xE0001: "LANGUAGE TAG", 0xE0020: "TAG SPACE", 0xE007F: "CANCEL TAG",
}

var digitNames = [...]string{"ZERO", "ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE"}

// runeName is r as a refusal names it: "U+3164 HANGUL FILLER", or by its kind when it
// has no name here, "U+0001 (a control character)".
func runeName(r rune) string {
	code := fmt.Sprintf("U+%04X", r)
	if n := unicodeName(r); n != "" {
		return code + " " + n
	}
	return code + " (" + runeKind(r) + ")"
}

// unicodeName is r's Unicode name, when this file has it.
func unicodeName(r rune) string {
	switch a := r - 0xE0000; {
	case runeNames[r] != "":
		return runeNames[r]
	case r >= 0xFE00 && r <= 0xFE0F:
		return fmt.Sprintf("VARIATION SELECTOR-%d", r-0xFE00+1)
	case r >= 0xE0100 && r <= 0xE01EF:
		return fmt.Sprintf("VARIATION SELECTOR-%d", r-0xE0100+17)
	case a >= 'A' && a <= 'Z':
		return "TAG LATIN CAPITAL LETTER " + string(a)
	case a >= 'a' && a <= 'z':
		return "TAG LATIN SMALL LETTER " + string(a-'a'+'A')
	case a >= '0' && a <= '9':
		return "TAG DIGIT " + digitNames[a-'0']
	}
	return ""
}

// runeKind says what kind of character an unnamed hidden r is.
func runeKind(r rune) string {
	switch {
	case r >= 0xE0000 && r <= 0xE007F:
		return "a tag character"
	case unicode.Is(unicode.Variation_Selector, r):
		return "a variation selector"
	case unicode.Is(unicode.Cc, r):
		return "a control character"
	case unicode.Is(unicode.Cf, r):
		return "an invisible format character"
	case unicode.In(r, unicode.Zs, unicode.Zl, unicode.Zp):
		return "a space other than the ordinary one"
	case unicode.Is(unicode.Co, r):
		return "a private-use character"
	case unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r):
		return "an invisible character"
	}
	return "a character Unicode has not assigned, as this console knows it"
}
