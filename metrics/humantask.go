package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/extworker/extworker/humantask"
)

// HumanTaskMetrics implements humantask.Observer (Config.Observer) on one counter:
//
//	extworker_humantask_commands_total{outcome,status}   completion requests answered, by outcome
//
// The outcomes: completed (this request's command completed the task: a first 200),
// replayed (a command's recorded answer given again from the ledger; status is that
// answer's), conflict (a first 409: another command, or someone outside the service,
// completed the task), refused (a first 4xx: 400, 401, 403, 404, 412, 422, 428) and
// unsettled (503: the outcome not settled yet; the client sends the command again). No
// label carries a task, a command or a user. Create it with NewHumanTaskMetrics.
type HumanTaskMetrics struct {
	commands *prometheus.CounterVec
}

var _ humantask.Observer = (*HumanTaskMetrics)(nil)

// NewHumanTaskMetrics creates the completion service's metrics and registers them on
// reg. It fails if the name is already registered there.
func NewHumanTaskMetrics(reg prometheus.Registerer) (*HumanTaskMetrics, error) {
	m := &HumanTaskMetrics{commands: counterVec("humantask_commands_total",
		"User-task completion requests answered, by outcome: completed (a first 200), replayed (a recorded answer given again; status is its status), conflict (a first 409: completed by another command), refused (a first 4xx), unsettled (503, sent again by the client).",
		"outcome", "status")}
	if err := reg.Register(m.commands); err != nil {
		return nil, err
	}
	// The series alerts rely on exist from the start, at zero.
	m.commands.WithLabelValues("completed", "200")
	m.commands.WithLabelValues("conflict", "409")
	m.commands.WithLabelValues("unsettled", "503")
	return m, nil
}

// Completed implements humantask.Observer.
func (m *HumanTaskMetrics) Completed() { m.commands.WithLabelValues("completed", "200").Inc() }

// Replayed implements humantask.Observer.
func (m *HumanTaskMetrics) Replayed(status int) {
	m.commands.WithLabelValues("replayed", strconv.Itoa(status)).Inc()
}

// Conflict implements humantask.Observer.
func (m *HumanTaskMetrics) Conflict() { m.commands.WithLabelValues("conflict", "409").Inc() }

// Refused implements humantask.Observer.
func (m *HumanTaskMetrics) Refused(status int) {
	m.commands.WithLabelValues("refused", strconv.Itoa(status)).Inc()
}

// Unsettled implements humantask.Observer.
func (m *HumanTaskMetrics) Unsettled() { m.commands.WithLabelValues("unsettled", "503").Inc() }
