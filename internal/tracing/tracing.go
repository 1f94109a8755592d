// Package tracing sets up OpenTelemetry traces for a worker process from the standard
// OTEL_* variables, and is off unless they ask for traces: then an SDK TracerProvider
// exports spans over OTLP/HTTP (otlptracehttp, which reads the exporter's OTEL_EXPORTER_OTLP_*
// variables itself) through a batch span processor, and becomes the global
// TracerProvider the library packages (tasks, camunda7, idempotency, outbox, inbox) trace
// through.
//
// Traces are on when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is
// set, or OTEL_TRACES_EXPORTER is otlp; OTEL_TRACES_EXPORTER=none (or OTEL_SDK_DISABLED=true)
// turns them off whatever else is set. service.name is OTEL_SERVICE_NAME, else a
// service.name in OTEL_RESOURCE_ATTRIBUTES, else "extworker". Sampling follows
// OTEL_TRACES_SAMPLER (default: parent-based, always on) and the batch processor
// OTEL_BSP_*, both read by the SDK.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// DefaultServiceName is service.name when neither OTEL_SERVICE_NAME nor
// OTEL_RESOURCE_ATTRIBUTES names one.
const DefaultServiceName = "extworker"

// defaultEndpoint is where otlptracehttp sends spans when no endpoint is set.
const defaultEndpoint = "https://localhost:4318/v1/traces"

// Settings are what the OTEL_* variables say about traces.
type Settings struct {
	// On: spans are exported.
	On bool
	// Why names the variable that turned traces on or off.
	Why string
	// Endpoint is where spans go when On: the OTLP/HTTP traces URL, without credentials,
	// query or fragment.
	Endpoint string
	// ServiceName is the resource's service.name.
	ServiceName string
}

// String describes the settings in one line, for `extworker config` and the start's log.
func (s Settings) String() string {
	if !s.On {
		return "off (" + s.Why + ")"
	}
	return fmt.Sprintf("on: OTLP/HTTP to %s as service.name %q (%s)", s.Endpoint, s.ServiceName, s.Why)
}

// Read reads the settings from the variables lookup (os.LookupEnv) finds, or returns
// what is wrong with them: an exporter other than otlp or none, a protocol other than
// http/protobuf or http/json, an endpoint that is not an http or https URL.
func Read(lookup func(string) (string, bool)) (Settings, error) {
	get := func(k string) string {
		v, _ := lookup(k)
		return strings.TrimSpace(v)
	}
	s := Settings{ServiceName: serviceName(get("OTEL_SERVICE_NAME"), get("OTEL_RESOURCE_ATTRIBUTES"))}
	var errs []error
	otlp, none := false, false
	for e := range strings.SplitSeq(get("OTEL_TRACES_EXPORTER"), ",") {
		switch e = strings.ToLower(strings.TrimSpace(e)); e {
		case "":
		case "otlp":
			otlp = true
		case "none":
			none = true
		default:
			errs = append(errs, fmt.Errorf("OTEL_TRACES_EXPORTER %q: extworker exports traces over OTLP only: set otlp, or none", e))
		}
	}
	tracesEndpoint, endpoint := get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), get("OTEL_EXPORTER_OTLP_ENDPOINT")
	switch {
	case strings.EqualFold(get("OTEL_SDK_DISABLED"), "true"):
		s.Why = "OTEL_SDK_DISABLED=true"
	case none:
		s.Why = "OTEL_TRACES_EXPORTER=none"
	case tracesEndpoint != "":
		s.On, s.Why = true, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	case endpoint != "":
		s.On, s.Why = true, "OTEL_EXPORTER_OTLP_ENDPOINT"
	case otlp:
		s.On, s.Why = true, "OTEL_TRACES_EXPORTER=otlp"
	default:
		s.Why = "neither OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT nor OTEL_TRACES_EXPORTER=otlp is set"
	}
	if !s.On {
		return s, errors.Join(errs...)
	}
	for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := get(v); p != "" {
			if p != "http/protobuf" && p != "http/json" {
				errs = append(errs, fmt.Errorf("%s %q: extworker exports traces over OTLP/HTTP only: set http/protobuf (the default) or http/json", v, p))
			}
			break // the traces protocol wins over the general one
		}
	}
	var err error
	switch {
	case tracesEndpoint != "":
		// Used as it is, path included.
		s.Endpoint, err = clean("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", tracesEndpoint, "")
	case endpoint != "":
		// The base URL: the exporter appends v1/traces.
		s.Endpoint, err = clean("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint, "v1/traces")
	default:
		s.Endpoint = defaultEndpoint
	}
	if err != nil {
		errs = append(errs, err)
	}
	return s, errors.Join(errs...)
}

// clean checks that the variable's value is an http or https URL with a host, and returns
// it without credentials, query or fragment (with suffix appended to its path).
func clean(name, raw, suffix string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%s: want an http:// or https:// URL with a host, e.g. http://otel-collector:4318", name)
	}
	u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
	if suffix != "" {
		u.Path = strings.TrimSuffix(u.Path, "/") + "/" + suffix
		u.RawPath = ""
	}
	return u.String(), nil
}

// serviceName is OTEL_SERVICE_NAME, else service.name from OTEL_RESOURCE_ATTRIBUTES
// (key=value pairs, comma-separated, values percent-encoded), else DefaultServiceName.
func serviceName(name, attrs string) string {
	if name != "" {
		return name
	}
	for kv := range strings.SplitSeq(attrs, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) != "service.name" {
			continue
		}
		if d, err := url.PathUnescape(strings.TrimSpace(v)); err == nil && d != "" {
			return d
		}
	}
	return DefaultServiceName
}

// Start installs, when s.On, an SDK TracerProvider exporting over OTLP/HTTP as the global
// TracerProvider, and the W3C trace context as the global propagator (so that
// httpeffect's provider requests carry traceparent, the outbox keeps an event's trace
// context and publishes it in the traceparent and tracestate headers, and the inbox
// continues it). The exporter reads the
// OTEL_EXPORTER_OTLP_* variables; it connects only when it first exports, so a collector
// that is down costs the worker nothing but dropped spans, and export failures are
// logged at warn level, at most once a minute. shutdown flushes the spans not yet
// exported (within its ctx) and stops the provider. With s.On false, Start installs
// nothing and shutdown does nothing.
func Start(ctx context.Context, s Settings, logger *slog.Logger) (shutdown func(context.Context) error, err error) {
	if !s.On {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: the OTLP/HTTP exporter: %w", err)
	}
	// Later sources win: OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME over the default.
	res, err := resource.New(ctx, resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", DefaultServiceName)), resource.WithFromEnv())
	if err != nil {
		if !errors.Is(err, resource.ErrPartialResource) {
			_ = exp.Shutdown(ctx)
			return nil, fmt.Errorf("tracing: the resource: %w", err)
		}
		logger.Warn("tracing: part of OTEL_RESOURCE_ATTRIBUTES could not be read; it is left out", slog.Any("error", err))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetErrorHandler(&errorHandler{logger: logger})
	otel.SetTextMapPropagator(propagation.TraceContext{})
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// errorHandler logs the SDK's errors (failed exports, above all) at warn level, at most
// one record a minute, counting those it left out.
type errorHandler struct {
	logger *slog.Logger

	mu      sync.Mutex
	last    time.Time
	dropped int
}

// errorEvery is the least time between two records of errorHandler.
const errorEvery = time.Minute

func (h *errorHandler) Handle(err error) {
	h.mu.Lock()
	if !h.last.IsZero() && time.Since(h.last) < errorEvery {
		h.dropped++
		h.mu.Unlock()
		return
	}
	h.last = time.Now()
	dropped := h.dropped
	h.dropped = 0
	h.mu.Unlock()
	h.logger.Warn("tracing: exporting spans failed; spans are dropped until the collector answers",
		slog.Any("error", err), slog.Int("errors_not_logged", dropped))
}
