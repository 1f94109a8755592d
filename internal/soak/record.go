package soak

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/internal/oracle"
)

// The run directory's files (Config.LogDir/<seed>-<time>/), the Jepsen-style history of
// one run. A passing run keeps only reportFile and tailFile unless Config.KeepHistory.
const (
	reportFile          = "report.txt"
	tailFile            = "worker-logs-tail.txt"
	providerHistoryFile = "provider-history.jsonl" // every request the provider saw (fakeprovider.Request)
	ledgerIntentsFile   = "ledger-intents.jsonl"   // extworker_intents of the run's namespace, one row per line
	ledgerEventsFile    = "ledger-events.jsonl"    // extworker_intent_events of those intents
	engineHistoryFile   = "engine-history.json"    // engineHistory
	workerLogGlob       = "worker-*.log"           // one per worker process started
	tailLines           = 40                       // lines kept of each worker log on a passing run
	historyFanout       = 4                        // concurrent external task log queries
	historyBatch        = 100                      // instance ids per variable query
)

// engineHistory is the engine's record of the run's instances.
type engineHistory struct {
	ProcessInstances []admin.HistoricProcessInstance `json:"processInstances"`
	// ExternalTaskLog is each instance's external task log, by process instance id.
	ExternalTaskLog map[string][]camunda7.ExternalTaskLogEntry `json:"externalTaskLog"`
	Incidents       []admin.Incident                           `json:"incidents"`
	// ErrorDetails of the incidents' external tasks, by external task id.
	ErrorDetails map[string]string                `json:"errorDetails"`
	Variables    []admin.HistoricVariableInstance `json:"variables"`
}

// recordProvider writes the provider's history, one request per line.
func recordProvider(dir string, pay *fakeprovider.Server) error {
	return writeFile(filepath.Join(dir, providerHistoryFile), pay.WriteHistory)
}

// recordLedger dumps the run's intents and their events as JSON lines: digests, keys,
// states and results, never request bodies (the ledger has none).
func recordLedger(ctx context.Context, dir string, pool *pgxpool.Pool, namespace string) error {
	dump := func(name, query string) error {
		return writeFile(filepath.Join(dir, name), func(w io.Writer) error {
			rows, err := pool.Query(ctx, query, namespace)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					return err
				}
				if _, err := io.WriteString(w, line+"\n"); err != nil {
					return err
				}
			}
			return rows.Err()
		})
	}
	if err := dump(ledgerIntentsFile, `SELECT row_to_json(i)::text FROM extworker_intents i WHERE i.namespace = $1 ORDER BY i.id`); err != nil {
		return fmt.Errorf("dump ledger intents: %w", err)
	}
	if err := dump(ledgerEventsFile, `SELECT row_to_json(e)::text FROM extworker_intent_events e
		JOIN extworker_intents i ON i.id = e.intent_id WHERE i.namespace = $1 ORDER BY e.id`); err != nil {
		return fmt.Errorf("dump ledger events: %w", err)
	}
	return nil
}

// readEngineHistory reads the engine's record of the run's instances: the instances
// and incidents the oracle read (st), each instance's external task log, the incidents'
// errorDetails, and the instances' variables.
func readEngineHistory(ctx context.Context, c *admin.Client, st oracle.EngineState) (engineHistory, error) {
	h := engineHistory{ProcessInstances: st.Instances, Incidents: st.Incidents,
		ExternalTaskLog: map[string][]camunda7.ExternalTaskLogEntry{}, ErrorDetails: map[string]string{}}
	ids := make([]string, 0, len(st.Instances))
	for _, p := range st.Instances {
		ids = append(ids, p.ID)
	}
	// The engine's external task log cannot be filtered by a set of instances, so ask
	// per instance, a few at a time.
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		firstErr error
		next     = make(chan string)
	)
	for range historyFanout {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range next {
				log, err := c.ExternalTaskLog(ctx, url.Values{"processInstanceId": {id}, "sortBy": {"timestamp"}, "sortOrder": {"asc"}})
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("external task log of %s: %w", id, err)
				}
				h.ExternalTaskLog[id] = log
				mu.Unlock()
			}
		}()
	}
	for _, id := range ids {
		next <- id
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return h, firstErr
	}
	for _, in := range st.Incidents {
		if in.IncidentType != admin.IncidentTypeFailedExternalTask || in.Configuration == "" {
			continue
		}
		d, err := c.ExternalTaskErrorDetails(ctx, in.Configuration)
		if err != nil {
			return h, fmt.Errorf("error details of external task %s: %w", in.Configuration, err)
		}
		h.ErrorDetails[in.Configuration] = d
	}
	for batch := range slices.Chunk(ids, historyBatch) {
		vars, err := c.HistoricVariableInstances(ctx, url.Values{"processInstanceIdIn": {strings.Join(batch, ",")}})
		if err != nil {
			return h, fmt.Errorf("historic variables: %w", err)
		}
		h.Variables = append(h.Variables, vars...)
	}
	return h, nil
}

// recordEngine writes the engine's history as one JSON document.
func recordEngine(dir string, h engineHistory) error {
	return writeFile(filepath.Join(dir, engineHistoryFile), func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetIndent("", " ")
		return enc.Encode(h)
	})
}

// prune leaves a passing run's directory with the report and the tail of each worker
// log: the whole history is only worth its space when something failed.
func prune(dir string) error {
	logs, err := filepath.Glob(filepath.Join(dir, workerLogGlob))
	if err != nil {
		return err
	}
	slices.Sort(logs)
	err = writeFile(filepath.Join(dir, tailFile), func(w io.Writer) error {
		for _, l := range logs {
			lines, err := tail(l, tailLines)
			if err != nil {
				return err
			}
			if len(lines) == 0 {
				continue
			}
			if _, err := fmt.Fprintf(w, "==> %s <==\n%s\n", filepath.Base(l), strings.Join(lines, "\n")); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("worker logs' tail: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if n := e.Name(); n != reportFile && n != tailFile {
			if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
				return err
			}
		}
	}
	return nil
}

// tail returns the last n lines of a file.
func tail(path string, n int) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ring []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		ring = append(ring, sc.Text())
		if len(ring) > n {
			ring = ring[1:]
		}
	}
	return ring, sc.Err()
}

// writeFile creates path and fills it with write.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 256<<10)
	if err := write(w); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
