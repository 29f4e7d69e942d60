package simcluster

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// auditPolicy logs every request at Metadata level once its response is
// complete, except the simulation's own machinery: KWOK (thousands of
// lease renewals a second at scale), the controller-manager, the API
// server talking to itself, and health checks. A policy cannot select by
// user agent, so AuditRequests does.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: None
  users: ["kwok", "system:kube-controller-manager", "system:apiserver"]
- level: None
  nonResourceURLs: ["/healthz*", "/readyz*", "/livez*"]
- level: Metadata
`

// AuditEvent is one request the API server completed.
type AuditEvent struct {
	// Verb is the API verb (get, list, watch, create, update, patch,
	// delete, ...), or the HTTP method's for non-resource requests.
	Verb string
	// Resource, Subresource, Namespace and Name say what it was about
	// (empty for non-resource requests).
	Resource, Subresource, Namespace, Name string
	// User and UserAgent say who asked.
	User, UserAgent string
	// Code is the HTTP status code of the response.
	Code int
	// Time is when the API server received the request; Completed, when
	// it finished answering it (for a watch, when the watch ended).
	Time, Completed time.Time
}

// AuditRequests reads the audit log's completed requests whose user agent
// starts with userAgentPrefix ("" for all), in the order they completed.
func (c *Cluster) AuditRequests(userAgentPrefix string) ([]AuditEvent, error) {
	f, err := os.Open(c.AuditLog)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	defer f.Close()
	var events []AuditEvent
	r := bufio.NewReaderSize(f, 1<<20)
	for line := 1; ; line++ {
		b, err := r.ReadBytes('\n')
		if err == io.EOF {
			break // a line still being written has no newline yet
		}
		if err != nil {
			return nil, fmt.Errorf("audit log: %w", err)
		}
		var e struct {
			Stage, Verb, UserAgent                   string
			User                                     struct{ Username string }
			ObjectRef                                *struct{ Resource, Subresource, Namespace, Name string }
			ResponseStatus                           *struct{ Code int }
			RequestReceivedTimestamp, StageTimestamp time.Time
		}
		if err := json.Unmarshal(b, &e); err != nil {
			return nil, fmt.Errorf("audit log %s:%d: %w", c.AuditLog, line, err)
		}
		if e.Stage != "ResponseComplete" || !strings.HasPrefix(e.UserAgent, userAgentPrefix) {
			continue
		}
		ev := AuditEvent{Verb: e.Verb, User: e.User.Username, UserAgent: e.UserAgent,
			Time: e.RequestReceivedTimestamp, Completed: e.StageTimestamp}
		if e.ObjectRef != nil {
			ev.Resource, ev.Subresource, ev.Namespace, ev.Name = e.ObjectRef.Resource, e.ObjectRef.Subresource, e.ObjectRef.Namespace, e.ObjectRef.Name
		}
		if e.ResponseStatus != nil {
			ev.Code = e.ResponseStatus.Code
		}
		events = append(events, ev)
	}
	return events, nil
}
