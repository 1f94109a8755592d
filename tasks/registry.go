package tasks

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
)

// Handler runs one task. It returns the variables to complete the task with, or an
// error: a plain error is retryable; failure.BPMNError, failure.Permanent,
// failure.UnknownOutcome and failure.RetryableAfter say otherwise. ctx ends when the
// task's lock is lost, its maximum run time passes, or the worker shuts down;
// context.Cause(ctx) tells which (camunda7.ErrLockLost, lockext.ErrMaxRunTime, ErrShutdown).
type Handler func(ctx context.Context, t *Task) (camunda7.Variables, error)

// TopicOptions configure one topic. Zero values take the documented defaults.
//
// Its fetch fields (LockDuration through IncludeExtensionProperties) are those of
// camunda7.FetchTopic, of the same names and types, and reach the engine's fetchAndLock
// unchanged: every filter the client supports can be set here (a test fails when
// camunda7.FetchTopic gains one that TopicOptions does not pass on).
type TopicOptions struct {
	// LockDuration is how long a fetched task stays locked; the extender renews it
	// while the handler runs. Default DefaultLockDuration.
	LockDuration time.Duration
	// Variables names the variables to fetch. Default none: fetching everything must be
	// asked for with AllVariables, never happen by accident. VariablesOf lists those a
	// struct for Task.Bind names.
	Variables []string
	// AllVariables fetches every variable visible from the task.
	AllVariables bool
	// LocalVariables fetches only variables local to the task's execution.
	LocalVariables bool

	// Filters, passed to the engine as they are: only tasks that match them are fetched.
	BusinessKey                 string
	ProcessDefinitionID         string
	ProcessDefinitionIDIn       []string
	ProcessDefinitionKey        string
	ProcessDefinitionKeyIn      []string
	ProcessDefinitionVersionTag string
	TenantIDIn                  []string
	WithoutTenantID             bool
	// ProcessVariables fetches only tasks whose process instance has these variables
	// with these values.
	ProcessVariables map[string]any

	// DeserializeValues asks the engine to deserialize Object variables with their Java
	// class before sending them; keep it false for Go handlers (the class must be on the
	// engine's classpath, and the JSON accessors read the serialized form).
	DeserializeValues bool
	// IncludeExtensionProperties fetches the service task's camunda:properties.
	IncludeExtensionProperties bool

	// MaxConcurrency caps this topic's running handlers. 0: only the worker's limit.
	MaxConcurrency int
	// Retry decides retries and backoff for retryable failures. Default 3 attempts,
	// 1s doubling up to 5m.
	Retry failure.RetryPolicy
	// MaxRunTime stops extending the lock of a handler running longer, and cancels it
	// with lockext.ErrMaxRunTime. 0: unlimited.
	MaxRunTime time.Duration
}

// DefaultLockDuration is a topic's lock duration unless TopicOptions.LockDuration says
// otherwise: the one default, also EXTWORKER_LOCK_DURATION's (App.Handle).
const DefaultLockDuration = 20 * time.Second

// WithDefaults returns a copy with defaults filled in.
func (o TopicOptions) WithDefaults() TopicOptions {
	if o.LockDuration == 0 {
		o.LockDuration = DefaultLockDuration
	}
	o.Retry = o.Retry.WithDefaults()
	return o
}

// Validate names every bad field.
func (o TopicOptions) Validate() error {
	var errs []error
	if o.LockDuration < time.Second {
		errs = append(errs, fmt.Errorf("LockDuration %v: must be at least 1s (extensions run at a third of it)", o.LockDuration))
	}
	if o.MaxConcurrency < 0 {
		errs = append(errs, fmt.Errorf("MaxConcurrency %d: must not be negative", o.MaxConcurrency))
	}
	if o.MaxRunTime < 0 {
		errs = append(errs, fmt.Errorf("MaxRunTime %v: must not be negative", o.MaxRunTime))
	}
	if o.AllVariables && len(o.Variables) > 0 {
		errs = append(errs, errors.New("Variables and AllVariables are both set"))
	}
	if err := o.Retry.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("Retry: %w", err))
	}
	return errors.Join(errs...)
}

// fetchTopic is the one conversion from a topic's options to what fetchAndLock asks
// the engine for.
func (o TopicOptions) fetchTopic(name string) camunda7.FetchTopic {
	return camunda7.FetchTopic{
		TopicName: name, LockDuration: o.LockDuration,
		Variables: o.Variables, AllVariables: o.AllVariables, LocalVariables: o.LocalVariables,
		BusinessKey: o.BusinessKey, ProcessDefinitionID: o.ProcessDefinitionID, ProcessDefinitionIDIn: o.ProcessDefinitionIDIn,
		ProcessDefinitionKey: o.ProcessDefinitionKey, ProcessDefinitionKeyIn: o.ProcessDefinitionKeyIn,
		ProcessDefinitionVersionTag: o.ProcessDefinitionVersionTag, TenantIDIn: o.TenantIDIn,
		WithoutTenantID: o.WithoutTenantID, ProcessVariables: o.ProcessVariables,
		DeserializeValues: o.DeserializeValues, IncludeExtensionProperties: o.IncludeExtensionProperties,
	}
}

// Registry maps topics to handlers. Register everything before the worker starts.
type Registry struct {
	topics map[string]*topic
	names  []string // the keys of topics, sorted
}

type topic struct {
	name    string
	handler Handler
	opts    TopicOptions
	fetch   camunda7.FetchTopic // opts.fetchTopic(name), built once
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{topics: map[string]*topic{}} }

// Register adds a handler for a topic. It fails for an empty or duplicate topic, a nil
// handler, or invalid options (every problem listed).
func (r *Registry) Register(name string, h Handler, opts TopicOptions) error {
	opts = opts.WithDefaults()
	var errs []error
	if name == "" {
		errs = append(errs, errors.New("empty topic name"))
	}
	if _, dup := r.topics[name]; dup {
		errs = append(errs, errors.New("topic already registered"))
	}
	if h == nil {
		errs = append(errs, errors.New("nil handler"))
	}
	if err := opts.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("register topic %q: %w", name, errors.Join(errs...))
	}
	r.topics[name] = &topic{name: name, handler: h, opts: opts, fetch: opts.fetchTopic(name)}
	i, _ := slices.BinarySearch(r.names, name)
	r.names = slices.Insert(r.names, i, name)
	return nil
}

// lockDurations lists the topics' lock durations.
func (r *Registry) lockDurations() []time.Duration {
	out := make([]time.Duration, 0, len(r.topics))
	for _, t := range r.topics {
		out = append(out, t.opts.LockDuration)
	}
	return out
}

// Topics lists the registered topic names, sorted.
func (r *Registry) Topics() []string { return append(make([]string, 0, len(r.names)), r.names...) }
