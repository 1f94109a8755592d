// Package doccheck finds the engine calls the documentation shows (every `curl` command,
// every URL under /engine-rest/, in README.md, docs/*.md, examples/*/README.md and the
// strings the demo prints), so that its test can ask the running engine each of them and
// a document cannot drift from the engine: a path that is not there, a method it does
// not take, a query parameter it ignores (the engine answers an unknown parameter with
// the unfiltered list), an answer of another shape than the one shown.
package doccheck

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Example is one engine call a document shows.
type Example struct {
	File string // as given to Markdown or GoStrings
	Line int
	Text string // the command or URL as written

	Method string   // GET unless the curl says otherwise
	URL    string   // as written, placeholders included
	Header []string // curl -H values
	Data   string   // curl -d (a JSON body)
	Form   []string // curl -F values (multipart): name=value or name=@file

	// Want is the shape of the answer shown right after the command (a JSON block):
	// the keys of the object, or of the first element of an array. Nil: none shown.
	Want []string

	// Prose marks a call named in the text (`GET /task/{id}`, a URL under /engine-rest/)
	// rather than shown as a curl command: its placeholders may name no entity of the
	// right kind, so the engine's "no such entity" proves the path, where a command's
	// would not; and only a GET is asked (a write named in prose has no body to send).
	Prose bool
}

func (e Example) String() string { return e.File + ":" + strconv.Itoa(e.Line) + ": " + e.Text }

// engineURL matches a URL under /engine-rest/, with or without scheme and host, and the
// method written before it (GET /engine-rest/incident?...).
var engineURL = regexp.MustCompile("(?:\\b(GET|POST|PUT|DELETE)\\s+)?((?:https?://[^\\s/`'\"]+)?(?:/[^\\s/`'\"]+)*/engine-rest/[^\\s`'\")\\]]*)")

// proseCall matches a GET the text names relative to the REST root, in inline code:
// `GET /external-task?...`, `GET /history/task?taskId=`. Only GET: a write named in prose
// has no body to send and is not run (curl commands are).
var proseCall = regexp.MustCompile("`GET (/(?:external-task|task|history|process-instance|process-definition|incident|deployment|execution|job|variable-instance|message|decision-definition|version)(?:[/?][^`\\s]*)?)`")

var curlCmd = regexp.MustCompile(`(^|[\s` + "`" + `$(])curl\s`)

// Markdown returns the examples in one Markdown file: curl commands (continued over lines
// ending in a backslash) and, on the other lines, URLs under /engine-rest/.
func Markdown(file string, src []byte) []Example {
	lines := strings.Split(string(src), "\n")
	var out []Example
	fence := ""
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if t := strings.TrimSpace(line); strings.HasPrefix(t, "```") {
			if fence == "" {
				fence = t
			} else {
				fence = ""
			}
			continue
		}
		if loc := curlCmd.FindStringIndex(line); loc != nil {
			first := i
			cmd := line[loc[1]-len("curl "):]
			for strings.HasSuffix(strings.TrimSpace(cmd), `\`) && i+1 < len(lines) {
				i++
				cmd = strings.TrimSuffix(strings.TrimSpace(cmd), `\`) + " " + strings.TrimSpace(lines[i])
			}
			if fence == "" { // inline code: up to its closing backtick
				cmd, _, _ = strings.Cut(cmd, "`")
			}
			if fence != "" {
				// the shell's comment after the command
				if j := strings.Index(cmd, " #"); j >= 0 {
					cmd = cmd[:j]
				}
			}
			ex := parseCurl(cmd)
			ex.File, ex.Line, ex.Text = file, first+1, strings.TrimSpace(cmd)
			if fence != "" {
				ex.Want = answerAfter(lines, i+1)
			}
			out = append(out, ex)
			continue
		}
		for _, m := range engineURL.FindAllStringSubmatch(line, -1) {
			// a pattern (/engine-rest/*) or the bare prefix in prose is not a call
			if !strings.HasSuffix(m[2], "*") && !strings.HasSuffix(m[2], "/engine-rest/") {
				out = append(out, urlExample(file, i+1, m[1], m[2]))
			}
		}
		for _, m := range proseCall.FindAllStringSubmatch(line, -1) {
			ex := urlExample(file, i+1, "GET", "/engine-rest"+m[1])
			ex.Text = "GET " + m[1]
			out = append(out, ex)
		}
	}
	return out
}

// GoStrings returns the URLs under /engine-rest/ in a Go file's string literals: what a
// program prints for its user to try (a format's verbs stay, as placeholders).
func GoStrings(file string, src []byte) ([]Example, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, src, 0)
	if err != nil {
		return nil, err
	}
	var out []Example
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		s, err := strconv.Unquote(lit.Value)
		if err != nil {
			return true
		}
		for _, m := range engineURL.FindAllStringSubmatch(s, -1) {
			out = append(out, urlExample(file, fset.Position(lit.Pos()).Line, m[1], m[2]))
		}
		return true
	})
	return out, nil
}

func urlExample(file string, line int, method, u string) Example {
	u = strings.TrimRight(u, ".,;:")
	if method == "" {
		method = "GET"
	}
	return Example{File: file, Line: line, Text: strings.TrimSpace(method + " " + u), Method: method, URL: u, Prose: true}
}

// parseCurl reads the flags of a curl command that matter for the call.
func parseCurl(cmd string) Example {
	words := shellWords(cmd)
	ex := Example{Method: ""}
	for i := 1; i < len(words); i++ {
		w := words[i]
		next := func() string {
			if i+1 < len(words) {
				i++
				return words[i]
			}
			return ""
		}
		switch {
		case w == "-X" || w == "--request":
			ex.Method = next()
		case w == "-H" || w == "--header":
			ex.Header = append(ex.Header, next())
		case w == "-d" || w == "--data" || w == "--data-raw" || w == "--data-binary":
			ex.Data = next()
		case w == "-F" || w == "--form":
			ex.Form = append(ex.Form, next())
		case w == "-u" || w == "--user" || w == "-o" || w == "--output" || w == "-w" || w == "--write-out":
			next()
		case strings.HasPrefix(w, "-"):
		default:
			if ex.URL == "" {
				ex.URL = w
			}
		}
	}
	if ex.Method == "" {
		ex.Method = "GET"
		if ex.Data != "" || len(ex.Form) > 0 {
			ex.Method = "POST"
		}
	}
	return ex
}

// shellWords splits a command line as a POSIX shell does for plain words and quotes.
func shellWords(s string) []string {
	var out []string
	var cur strings.Builder
	in, quote := false, byte(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				cur.WriteByte(c)
			}
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == ' ' || c == '\t':
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if in {
		out = append(out, cur.String())
	}
	return out
}

// answerAfter is the shape of the JSON answer shown after a command: lines of the same
// code block that start with { or [, or else a ```json block that follows it (blank
// lines between).
func answerAfter(lines []string, i int) []string {
	var body []string
	for ; i < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[i]), "```"); i++ {
		if curlCmd.MatchString(lines[i]) {
			return nil // another command follows: the answer, if any, is its
		}
		if t := strings.TrimSpace(lines[i]); len(body) > 0 || strings.HasPrefix(t, "{") || strings.HasPrefix(t, "[") {
			body = append(body, lines[i])
		}
	}
	if len(body) == 0 {
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) == ""; i++ {
		}
		if i < len(lines) && strings.TrimSpace(lines[i]) == "```json" {
			for i++; i < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[i]), "```"); i++ {
				body = append(body, lines[i])
			}
		}
	}
	if len(body) == 0 {
		return nil
	}
	keys, ok := Shape([]byte(strings.Join(body, "\n")))
	if !ok {
		return nil
	}
	return keys
}

// Shape is the sorted keys of a JSON object, or of an array's first element; ok is
// false for anything else.
func Shape(b []byte) (keys []string, ok bool) {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return nil, false
	}
	if a, isArray := v.([]any); isArray {
		if len(a) == 0 {
			return []string{}, true
		}
		v = a[0]
	}
	o, isObject := v.(map[string]any)
	if !isObject {
		return nil, false
	}
	keys = make([]string, 0, len(o))
	for k := range o {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys, true
}
