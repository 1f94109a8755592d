// Package metrics turns what the worker runtime (package tasks) and the effect ledger
// (package idempotency) observe into Prometheus metrics.
//
//	reg := prometheus.NewRegistry()
//	m, err := metrics.New(reg, metrics.Options{MaxConcurrency: 16})
//	reg.MustRegister(metrics.NewBacklogCollector(ledger.Operations(), 2*time.Second, m, logger))
//	ledger = ledger.WithHooks(idempotency.Hooks{Observer: m, ContextLogger: tasks.Logger, Annotate: tasks.AddLogAttrs})
//	w, err := tasks.New(client, reg, tasks.Config{MaxConcurrency: 16, Observer: m, Logger: logger})
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// A worker program (package extworker's App.Run) serves them on EXTWORKER_HTTP_ADDR (default
// 127.0.0.1:9464) at /metrics, beside /healthz and /readyz. deploy/prometheus/alerts.yml
// holds the alert rules and deploy/grafana/extworker.json the dashboard.
//
// # Metrics
//
// Labels are bounded: topic (the registered topics), outcome (tasks.Outcome), classification, reason,
// operation (fixed words), scope and state (the ledger's scopes, chosen by handler
// authors, and its eight states). Task ids, process instance ids, business keys and
// intent keys never become labels: they are in the logs.
//
// Tasks (package tasks):
//
//	extworker_tasks_fetched_total{topic}                    counter   tasks locked by fetchAndLock
//	extworker_tasks_completed_total{topic}                  counter   completions the engine accepted
//	extworker_tasks_bpmn_errors_total{topic}                counter   BPMN errors reported
//	extworker_tasks_failed_total{topic,classification}      counter   failures reported (retryable, permanent, unknown-outcome)
//	extworker_incidents_total{topic,classification}         counter   failures with retries 0: incidents (retryable = retries exhausted)
//	extworker_tasks_handled_total{topic,outcome}            counter   every task run, by outcome (completed, bpmn-error, retryable,
//	                                                                  incident, deferred, unlocked, lock-lost, report-failed)
//	extworker_handler_duration_seconds{topic,outcome}       histogram handler run time
//	extworker_fetch_duration_seconds                        histogram fetchAndLock latency, including the long poll's wait
//	extworker_fetch_polls_total                             counter   fetchAndLock calls
//	extworker_fetch_empty_polls_total                       counter   successful polls that returned nothing
//	extworker_tasks_in_flight{topic}                        gauge     handlers running
//	extworker_slots_free                                    gauge     free slots (what the next fetch may ask for)
//	extworker_slots_max                                     gauge     MaxConcurrency
//	extworker_lock_extensions_total{topic}                  counter   successful extendLock calls
//	extworker_lock_extension_failures_total{topic}          counter   failed extendLock calls
//	extworker_locks_lost_total{topic,reason}                counter   locks lost: gone, taken, max-run-time
//	extworker_engine_errors_total{operation}                counter   failed engine calls: fetch-and-lock, complete, failure,
//	                                                                  bpmn-error, unlock, extend-lock, query, version (readyz)
//
// Effect ledger (package idempotency):
//
//	extworker_ledger_transitions_total{scope,state}         counter   committed state changes, by the state entered
//	extworker_ledger_duplicates_suppressed_total{scope,reason} counter a repeated dispatch prevented: replayed, in-progress
//	extworker_ledger_idempotency_conflicts_total{scope}     counter   same key, different request: refused
//	extworker_ledger_reconciliations_total{scope,result}    counter   found, absent, still-unknown, rejected
//	extworker_ledger_intents{scope,state}                   gauge     unknown, operator_hold and dispatched intents (queried at scrape)
//	extworker_ledger_oldest_intent_age_seconds{scope,state} gauge     age of the oldest of them (unknown: since first dispatch)
//	extworker_ledger_backlog_up                             gauge     1 if the scrape's backlog query worked
//	extworker_ledger_backlog_query_seconds                  gauge     how long it took
//	extworker_database_errors_total{operation}              counter   ledger-write, ledger-backlog, ping and migrations (readyz)
//
// User-task completions (package humantask, Config.Observer: HumanTaskMetrics):
//
//	extworker_humantask_commands_total{outcome,status}      counter   completion requests answered: completed (a first 200),
//	                                                                  replayed (a recorded answer again), conflict (a first 409),
//	                                                                  refused (a first 4xx), unsettled (503)
//
// Plus the Go runtime's go_* and the process's process_* metrics.
//
// The ledger gauges come from one aggregate query per scrape (BacklogCollector), bounded
// by a timeout; while the database is unreachable extworker_ledger_backlog_up is 0 and
// the gauges are absent. Counters are per process; sum them across workers in queries.
package metrics
