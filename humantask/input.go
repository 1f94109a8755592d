package humantask

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/internal/termsafe"
)

// Bounds of what a request may name, in bytes.
const (
	maxTaskID  = 64
	maxCommand = 200
	maxUser    = 256
	maxGroup   = 255 // the engine's identity links hold group ids of at most 255
	maxVarName = 255
)

// checkName refuses a name the database or the engine cannot store as given: empty,
// too long, invalid UTF-8, or with control characters (a NUL byte among them).
func checkName(what, s string, limit int) error {
	switch {
	case s == "":
		return fmt.Errorf("%s is empty", what)
	case len(s) > limit:
		return fmt.Errorf("%s is longer than %d bytes", what, limit)
	case !utf8.ValidString(s):
		return fmt.Errorf("%s is not valid UTF-8", what)
	case strings.ContainsFunc(s, unicode.IsControl):
		return fmt.Errorf("%s has control characters", what)
	}
	return nil
}

// checkID refuses a task id or command id checkName refuses, or one with a "/": a
// command's ledger key joins the two with "/" (commandKey), and the engine has no task
// id with one.
func checkID(what, s string, limit int) error {
	if err := checkName(what, s, limit); err != nil {
		return err
	}
	if strings.Contains(s, "/") {
		return fmt.Errorf("%s has a \"/\"", what)
	}
	return nil
}

// commandKey is the ledger key of command on task by user: the user is part of it (as
// a digest, since a user id may hold any character), so a command id another user
// copies names another command, and cannot pre-empt the owner's.
func commandKey(task, user, command string) string {
	sum := sha256.Sum256([]byte(user))
	return task + "/" + command + "/" + hex.EncodeToString(sum[:8])
}

// CommandOfKey is the command id of a ledger key of task (an intent of Scope), as
// "extworker humantask commands" lists them; ok false for a key of another task.
func CommandOfKey(task, key string) (command string, ok bool) {
	rest, ok := strings.CutPrefix(key, task+"/")
	if !ok {
		return "", false
	}
	command, _, ok = strings.Cut(rest, "/")
	return command, ok && command != ""
}

// parseForm reads a completion's body: a JSON object of scalar variables (strings,
// booleans, numbers, null), valid UTF-8 without NUL bytes, none named with the
// service's marker prefix.
// maxStringVar is the most characters the engine stores in a String variable (its
// column is varchar(4000)): a longer one is refused by the engine on every attempt.
const maxStringVar = 4000

func parseForm(body []byte) (Form, error) {
	if !utf8.Valid(body) {
		return nil, errors.New("the body is not valid UTF-8")
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return Form{}, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var f Form
	if err := dec.Decode(&f); err != nil || f == nil {
		return nil, errors.New("the body is not a JSON object of form variables")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("the body has more than one JSON value")
	}
	if k, dup := duplicateKey(body); dup {
		return nil, fmt.Errorf("variable %q is named twice", termsafe.String(k))
	}
	return f, checkForm(f)
}

// checkForm refuses a form the engine cannot store as sent: a name checkName refuses,
// with an invalid character (a lone surrogate decodes to U+FFFD: stored so, it would
// name another variable) or the service's marker prefix; a string with a NUL byte or an
// invalid character, or longer than a String variable holds; a number no variable
// holds; a value of another kind. Complete checks every form with it, from any entry
// point (the JSON body, the page's form, a Go caller).
func checkForm(f Form) error {
	for _, k := range slices.Sorted(maps.Keys(f)) {
		if err := checkName("a variable name", k, maxVarName); err != nil {
			return err
		}
		if strings.ContainsRune(k, utf8.RuneError) {
			return errors.New("a variable name has an invalid character")
		}
		if strings.HasPrefix(k, markerPrefix) {
			return fmt.Errorf("variable names beginning %q are the service's own", markerPrefix)
		}
		switch v := f[k].(type) {
		case string:
			if !utf8.ValidString(v) || strings.ContainsRune(v, 0) || strings.ContainsRune(v, utf8.RuneError) {
				return fmt.Errorf("variable %q has a NUL byte or an invalid character", k)
			}
			if n := utf8.RuneCountInString(v); n > maxStringVar {
				return fmt.Errorf("variable %q has %d characters; the engine stores at most %d in a String variable", k, n, maxStringVar)
			}
		case json.Number:
			if !jsonNumber.MatchString(string(v)) {
				return fmt.Errorf("variable %q is not a number as JSON writes one (digits, no leading zero, an optional fraction and exponent)", k)
			}
			if _, err := numberVar(v); err != nil {
				return fmt.Errorf("variable %q: %v", k, err)
			}
		case bool, nil:
		default:
			return fmt.Errorf("variable %q is not a string, boolean, number or null", k)
		}
	}
	return nil
}

// jsonNumber is a number literal of JSON's grammar (RFC 8259 6). A json.Number a Go
// caller (or the page) built of anything else ("+5", "0500", "1_001") cannot be encoded
// into the command's digest: it was answered 503 for ever.
var jsonNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)

// typedNull is a null of the variable's type typ (the engine keeps a primitive
// variable's type through a null), or the engine's Null for another type or a new name.
func typedNull(typ string) camunda7.Variable {
	switch typ {
	case camunda7.TypeString, camunda7.TypeBoolean, camunda7.TypeShort, camunda7.TypeInteger, camunda7.TypeLong,
		camunda7.TypeDouble, camunda7.TypeDate:
		return camunda7.Variable{Type: typ, Value: json.RawMessage("null")}
	}
	return camunda7.NullVar()
}

// duplicateKey reports a name the body's top-level object gives twice (JSON decoding
// keeps the last, silently); body is a JSON object already decoded once.
func duplicateKey(body []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if _, err := dec.Token(); err != nil { // {
		return "", false
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		k, _ := tok.(string)
		if seen[k] {
			return k, true
		}
		seen[k] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return "", false
		}
	}
	return "", false
}

// numberVar is a number as the engine's Long when it is written as an integer, its
// Double when written with a fraction or an exponent. An integer beyond a Long's range
// is refused: as a Double it would be stored rounded.
func numberVar(n json.Number) (camunda7.Variable, error) {
	i, err := n.Int64()
	switch {
	case err == nil:
		return camunda7.LongVar(i), nil
	case !strings.ContainsAny(n.String(), ".eE"):
		return camunda7.Variable{}, errors.New("an integer beyond a Long's range (a Double would store it rounded)")
	}
	f, err := parseDouble(n)
	if err != nil {
		return camunda7.Variable{}, err
	}
	return camunda7.DoubleVar(f), nil
}

// parseDouble is n as a Double: refused when it overflows, or when it is not zero but
// would be stored as zero.
func parseDouble(n json.Number) (float64, error) {
	f, err := n.Float64()
	switch {
	case err != nil || math.IsInf(f, 0) || math.IsNaN(f):
		return 0, errors.New("not a number a Double holds")
	case f == 0 && strings.ContainsAny(strings.SplitN(strings.ToLower(n.String()), "e", 2)[0], "123456789"):
		return 0, errors.New("too small for a Double (it would be stored as 0)")
	}
	return f, nil
}

// integerBits are the engine's integer types and their sizes.
var integerBits = map[string]int{camunda7.TypeShort: 16, camunda7.TypeInteger: 32, camunda7.TypeLong: 64}

// numberVarAs is n as a variable of type typ, the type of the variable it overwrites: a
// Short, Integer or Long takes an integer in its range (written without a fraction or
// an exponent), a Double any number; for another type (Null, or a new variable) it is
// numberVar's choice. So a form keeps each variable's type.
func numberVarAs(typ string, n json.Number) (camunda7.Variable, error) {
	if bits, ok := integerBits[typ]; ok {
		if strings.ContainsAny(n.String(), ".eE") {
			return camunda7.Variable{}, fmt.Errorf("not an integer, which a %s holds", typ)
		}
		i, err := strconv.ParseInt(n.String(), 10, bits)
		if err != nil {
			return camunda7.Variable{}, fmt.Errorf("beyond a %s's range", typ)
		}
		return camunda7.Variable{Type: typ, Value: json.RawMessage(strconv.FormatInt(i, 10))}, nil
	}
	if typ == camunda7.TypeDouble {
		f, err := parseDouble(n)
		if err != nil {
			return camunda7.Variable{}, err
		}
		return camunda7.DoubleVar(f), nil
	}
	return numberVar(n)
}

// engineVariables are the form's variables as the engine's, a number as the type of
// the variable it overwrites (vars, the task's), with the marker of command by user.
func engineVariables(f Form, vars camunda7.Variables, taskID, command, user string) camunda7.Variables {
	out := make(camunda7.Variables, len(f)+1)
	for k, v := range f {
		switch v := v.(type) {
		case string:
			out[k] = camunda7.StringVar(v)
		case bool:
			out[k] = camunda7.BoolVar(v)
		case json.Number:
			out[k], _ = numberVarAs(vars[k].Type, v) // parseForm and checkCompletion checked it
		case nil:
			out[k] = typedNull(vars[k].Type)
		}
	}
	m, _ := json.Marshal(marker{Command: command, User: user})
	out[markerName(taskID)] = camunda7.StringVar(string(m))
	return out
}
