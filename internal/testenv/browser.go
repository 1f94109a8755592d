package testenv

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// chromiumNames are the executables Browser looks for on PATH, Debian's first (`make
// up` installs the chromium package, services/tools-up.sh).
var chromiumNames = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}

// ChromiumPath is EXTWORKER_TEST_CHROMIUM, or the first Chromium found on PATH.
func ChromiumPath() (string, error) {
	if p := os.Getenv("EXTWORKER_TEST_CHROMIUM"); p != "" {
		return p, nil
	}
	for _, n := range chromiumNames {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no chromium on PATH (apt-get install chromium, or set EXTWORKER_TEST_CHROMIUM)")
}

// Browser starts a headless Chromium of the test's own (a fresh profile in a temporary
// directory) and returns a chromedp context for its first tab, valid for d: chromedp.Do
// and chromedp.Run (chromedp v0.23's generic API) drive it. The browser is closed when
// the test ends. Without Chromium the test fails in CI and is skipped
// elsewhere, like a missing engine.
func Browser(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	path, err := ChromiumPath()
	if err != nil {
		unavailable(t, "chromium", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(filepath.Join(t.TempDir(), "profile")),
		chromedp.NoSandbox, // tests run as root in CI; the pages are our own
		chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-dev-shm-usage", true),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	ctx, cancelTimeout := context.WithTimeout(ctx, d)
	t.Cleanup(func() { cancelTimeout(); cancelCtx(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		unavailable(t, "chromium", err)
	}
	return ctx
}
