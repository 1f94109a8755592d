package testenv_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/extworker/extworker/internal/testenv"
)

// TestBrowserReadsAPage checks the harness itself: a page served by the test is read
// back through headless Chromium.
func TestBrowserReadsAPage(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(`<!doctype html><title>t</title><p id="greeting">hello from the test</p>`))
	}))
	defer srv.Close()
	ctx := testenv.Browser(t, time.Minute)
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL)); err != nil {
		t.Fatal(err)
	}
	text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#greeting")))
	if err != nil {
		t.Fatal(err)
	}
	if text != "hello from the test" {
		t.Fatalf("read %q", text)
	}
}
