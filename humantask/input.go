package humantask

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/extworker/extworker/camunda7"
)

// Bounds of what a request may name, in bytes.
const (
	maxTaskID  = 64
	maxCommand = 200
	maxUser    = 256
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
	for k, v := range f {
		if err := checkName("a variable name", k, maxVarName); err != nil {
			return nil, err
		}
		if strings.HasPrefix(k, markerPrefix) {
			return nil, fmt.Errorf("variable names beginning %q are the service's own", markerPrefix)
		}
		switch v := v.(type) {
		case string:
			if strings.ContainsRune(v, 0) || strings.ContainsRune(v, utf8.RuneError) {
				return nil, fmt.Errorf("variable %q has a NUL byte or an invalid character", k)
			}
			if n := utf8.RuneCountInString(v); n > maxStringVar {
				return nil, fmt.Errorf("variable %q has %d characters; the engine stores at most %d in a String variable", k, n, maxStringVar)
			}
		case json.Number:
			if _, err := numberVar(v); err != nil {
				return nil, fmt.Errorf("variable %q: %v", k, err)
			}
		case bool, nil:
		default:
			return nil, fmt.Errorf("variable %q is not a string, boolean, number or null", k)
		}
	}
	return f, nil
}

// numberVar is a number as the engine's Long when it is an integer that fits, its
// Double otherwise.
func numberVar(n json.Number) (camunda7.Variable, error) {
	if i, err := n.Int64(); err == nil {
		return camunda7.LongVar(i), nil
	}
	f, err := n.Float64()
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return camunda7.Variable{}, errors.New("not a number a Double holds")
	}
	return camunda7.DoubleVar(f), nil
}

// engineVariables are the form's variables as the engine's, with the marker of
// command by user.
func engineVariables(f Form, taskID, command, user string) camunda7.Variables {
	out := make(camunda7.Variables, len(f)+1)
	for k, v := range f {
		switch v := v.(type) {
		case string:
			out[k] = camunda7.StringVar(v)
		case bool:
			out[k] = camunda7.BoolVar(v)
		case json.Number:
			out[k], _ = numberVar(v) // parseForm checked it
		case nil:
			out[k] = camunda7.NullVar()
		}
	}
	m, _ := json.Marshal(marker{Command: command, User: user})
	out[markerName(taskID)] = camunda7.StringVar(string(m))
	return out
}
