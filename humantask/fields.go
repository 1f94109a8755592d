package humantask

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/extworker/extworker/camunda7"
)

// The namespaces of Camunda's BPMN extensions (camunda:formField), and of the activiti:
// prefix Camunda 7 still reads.
const (
	camundaNS  = "http://camunda.org/schema/1.0/bpmn"
	activitiNS = "http://activiti.org/bpmn"
)

// taskForm is what a user task's form declares: the fields a form may set (in order,
// without the readonly ones; empty, not nil, when all are readonly) and, of those, the
// ones with a default value (which the engine sets when a submission leaves them out).
type taskForm struct {
	fields, defaulted []string
	// declared are all its fields, the readonly ones too: what the form shows.
	declared []string
}

// formFields returns, by user task id, what each user task of a BPMN document declares
// (camunda:formData's camunda:formField, or activiti:'s). A task that declares no field
// is not in the map: its form may set any variable.
func formFields(bpmn string) (map[string]taskForm, error) {
	dec := xml.NewDecoder(strings.NewReader(bpmn))
	out := map[string]taskForm{}
	var task string // the user task being read, "" outside one
	depth := 0      // of elements inside it
	var field string
	var readonly, defaulted bool
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		switch el := tok.(type) {
		case xml.StartElement:
			switch {
			case task == "" && el.Name.Local == "userTask":
				task, depth = attr(el, "", "id"), 0
			case task != "":
				depth++
				if !extension(el.Name) {
					continue
				}
				switch el.Name.Local {
				case "formField":
					field, readonly, defaulted = attr(el, "", "id"), false, attr(el, "", "defaultValue") != ""
					if f := out[task]; f.fields == nil {
						out[task] = taskForm{fields: []string{}}
					}
				case "constraint":
					readonly = readonly || (field != "" && attr(el, "", "name") == "readonly")
				}
			}
		case xml.EndElement:
			if task == "" {
				continue
			}
			if depth == 0 {
				task = ""
				continue
			}
			depth--
			if extension(el.Name) && el.Name.Local == "formField" {
				if f := out[task]; field != "" {
					f.declared = append(f.declared, field)
					if !readonly {
						f.fields = append(f.fields, field)
						if defaulted {
							f.defaulted = append(f.defaulted, field)
						}
					}
					out[task] = f
				}
				field = ""
			}
		}
	}
}

// extension reports whether n is an element of Camunda's extensions.
func extension(n xml.Name) bool { return n.Space == camundaNS || n.Space == activitiNS }

func attr(el xml.StartElement, space, local string) string {
	for _, a := range el.Attr {
		if a.Name.Space == space && a.Name.Local == local {
			return a.Value
		}
	}
	return ""
}

// fieldCache holds each process definition's declared form fields: a definition never
// changes, so it is read from the engine once, by one request at a time (a list reads its
// tasks side by side). A definition the engine answered it cannot give, or whose XML
// cannot be read, is not asked for again for failedFor (a BPMN larger than the client
// takes would be fetched on every request); one the engine did not answer for is asked
// for again on the next request.
type fieldCache struct {
	mu    sync.Mutex
	defs  map[string]cachedFields // by process definition id
	reads singleflight.Group      // by process definition id
}

type cachedFields struct {
	byTask map[string]taskForm // by user task id
	err    error
	until  time.Time // of a failure
}

const (
	// maxCachedDefinitions bounds the cache; past it, it starts afresh.
	maxCachedDefinitions = 1000
	// failedFor is how long a definition that could not be read is not asked for again.
	failedFor = time.Minute
)

// form returns what the user task taskKey of definition def declares (fields nil when
// it declares none, or has no definition: a standalone task), reading the definition's
// XML with read on a miss.
func (c *fieldCache) form(ctx context.Context, def, taskKey string, read func(context.Context, string) (string, error)) (taskForm, error) {
	if def == "" {
		return taskForm{}, nil
	}
	e, ok := c.cached(def)
	if !ok {
		v, err, _ := c.reads.Do(def, func() (any, error) {
			if e, ok := c.cached(def); ok { // read meanwhile
				return e, nil
			}
			e := cachedFields{}
			doc, err := read(ctx, def)
			if err == nil {
				e.byTask, err = formFields(doc)
			}
			if err != nil {
				if ctx.Err() != nil || errors.Is(err, camunda7.ErrNotSent) || errors.Is(err, camunda7.ErrUnknownOutcome) {
					return nil, err // no answer: not remembered (an outside tester's one dropped read hid a definition's tasks for a minute)
				}
				e = cachedFields{err: fmt.Errorf("the form fields of process definition %s: %w", def, err), until: time.Now().Add(failedFor)}
			}
			c.mu.Lock()
			if c.defs == nil || len(c.defs) >= maxCachedDefinitions {
				c.defs = map[string]cachedFields{}
			}
			c.defs[def] = e
			c.mu.Unlock()
			return e, nil
		})
		if err != nil {
			return taskForm{}, err
		}
		e = v.(cachedFields)
	}
	return e.byTask[taskKey], e.err
}

// cached is def's entry, unless there is none or it is a failure whose time is up.
func (c *fieldCache) cached(def string) (cachedFields, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.defs[def]
	if ok && e.err != nil && time.Now().After(e.until) {
		return cachedFields{}, false
	}
	return e, ok
}
