package testenv

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// lbSessions is how many requests HAProxy has sent node i (its stot).
func lbSessions(t *testing.T, c *Cluster, i int) int {
	t.Helper()
	row, err := c.lbStats(i)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(row[7])
	if err != nil {
		t.Fatalf("node%d's stot %q: %v", i, row[7], err)
	}
	return n
}

// versions sends n GET /version through the balancer and fails on any answer but 200.
func versions(t *testing.T, c *Cluster, n int) {
	t.Helper()
	for k := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.URL()+"/version", nil)
		resp, err := http.DefaultClient.Do(req)
		cancel()
		if err != nil {
			t.Fatalf("request %d through the balancer: %v", k, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d through the balancer: %s", k, resp.Status)
		}
	}
}

// A test cluster balances requests over its nodes round robin; a SIGKILLed node costs the
// balancer's clients nothing for requests that were not sent to it yet (its refused
// connections are redispatched to the other node, before and after HAProxy's health check
// counts it down); a restarted node is balanced to again.
func TestClusterBalancesKillAndRestart(t *testing.T) {
	c := StartCluster(t, 2)
	before := [2]int{lbSessions(t, c, 0), lbSessions(t, c, 1)}
	versions(t, c, 20)
	for i := range 2 {
		if got := lbSessions(t, c, i) - before[i]; got != 10 {
			t.Errorf("node %d got %d of 20 requests, want 10 (round robin)", i, got)
		}
	}

	k := c.Kill(t, 1)
	versions(t, c, 20) // at once: HAProxy has not noticed yet, the first ones meet the dead port
	c.WaitBalanced(t, 1, false, 30*time.Second)
	t.Logf("HAProxy counted the killed node down %v after the SIGKILL", time.Since(k.At).Round(time.Millisecond))
	if ok, status, err := c.Balanced(1); err != nil || ok {
		t.Fatalf("node 1 after the kill: status %q (%v), want DOWN", status, err)
	}
	versions(t, c, 10)

	c.Restart(t, 1)
	was := lbSessions(t, c, 1)
	versions(t, c, 10)
	if got := lbSessions(t, c, 1) - was; got != 5 {
		t.Errorf("the restarted node got %d of 10 requests, want 5", got)
	}
}
