package camunda7

import (
	"context"
	"net/http"
	"net/url"
)

// This file holds the engine's version (the readiness probe) and the external-task log
// (the worker's retry counting reads it). The calls that tests, demos and operators need
// beyond a worker's (deployments, process instances, messages, incidents, history) are
// in package admin, built on Client.Do.

// Version returns the engine's version, e.g. "7.24.0". It is the readiness probe.
func (c *Client) Version(ctx context.Context) (string, error) {
	var v struct {
		Version string `json:"version"`
	}
	err := c.do(ctx, call{op: "get engine version", method: http.MethodGet, path: "/version", out: &v})
	return v.Version, err
}

// ExternalTaskLogEntry is one entry of an external task's history.
type ExternalTaskLogEntry struct {
	ID             string `json:"id"`
	ExternalTaskID string `json:"externalTaskId"`
	TopicName      string `json:"topicName"`
	WorkerID       string `json:"workerId"`
	Retries        *int   `json:"retries"`
	ErrorMessage   string `json:"errorMessage"`
	CreationLog    bool   `json:"creationLog"`
	FailureLog     bool   `json:"failureLog"`
	SuccessLog     bool   `json:"successLog"`
	DeletionLog    bool   `json:"deletionLog"`
	Timestamp      Time   `json:"timestamp"`
}

// ExternalTaskLog queries GET /history/external-task-log.
func (c *Client) ExternalTaskLog(ctx context.Context, q url.Values) ([]ExternalTaskLogEntry, error) {
	var out []ExternalTaskLogEntry
	err := c.do(ctx, call{op: "query external task log", method: http.MethodGet, path: "/history/external-task-log", query: q, out: &out})
	return out, err
}
