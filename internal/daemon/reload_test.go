package daemon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/image/remote"
	"github.com/crisp-runtime/crisp/internal/metrics"
)

// fakeImages records what the reload gave the image service.
type fakeImages struct {
	mu     sync.Mutex
	calls  int
	rc     remote.Config
	pinned []string
}

func (f *fakeImages) Reconfigure(rc remote.Config, pinned []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.rc, f.pinned = rc, pinned
}

func (f *fakeImages) got() (int, remote.Config, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls, f.rc, f.pinned
}

// logBuffer collects JSON log lines; safe for the reload goroutine and the test.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// records returns the logged records with message msg.
func (b *logBuffer) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

type reloadFixture struct {
	t      *testing.T
	path   string
	images *fakeImages
	m      *metrics.Metrics
	logs   *logBuffer
	r      *reloader
}

// newReloadFixture is a reloader of a config file that starts as initial, with a
// logger at its log level, as criserver has at start.
func newReloadFixture(t *testing.T, initial string) *reloadFixture {
	t.Helper()
	f := &reloadFixture{t: t, path: filepath.Join(t.TempDir(), "config.toml"), images: &fakeImages{}, m: metrics.New(), logs: &logBuffer{}}
	f.write(initial)
	cfg, err := config.Load(f.path)
	if err != nil {
		t.Fatal(err)
	}
	level := new(slog.LevelVar)
	level.Set(parseLevel(cfg.LogLevel))
	log := slog.New(slog.NewJSONHandler(f.logs, &slog.HandlerOptions{Level: level}))
	f.r = &reloader{path: f.path, level: level, images: f.images, metrics: f.m, log: log, running: cfg}
	return f
}

func (f *reloadFixture) write(content string) {
	f.t.Helper()
	if err := os.WriteFile(f.path, []byte(content), 0o600); err != nil {
		f.t.Fatal(err)
	}
}

// reloads reads crisp_config_reloads_total{result}.
func (f *reloadFixture) reloads(result string) float64 {
	f.t.Helper()
	families, err := f.m.Registry().Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, fam := range families {
		if fam.GetName() != "crisp_config_reloads_total" {
			continue
		}
		for _, s := range fam.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return s.GetCounter().GetValue()
				}
			}
		}
	}
	f.t.Fatalf("crisp_config_reloads_total{result=%q} not exposed", result)
	return 0
}

// checkReloads compares the reload counters with what is wanted.
func (f *reloadFixture) checkReloads(success, failure float64) {
	f.t.Helper()
	if got := f.reloads(metrics.ResultSuccess); got != success {
		f.t.Errorf("reloads{result=success} = %v, want %v", got, success)
	}
	if got := f.reloads(metrics.ResultFailure); got != failure {
		f.t.Errorf("reloads{result=failure} = %v, want %v", got, failure)
	}
}

func TestRemoteConfig(t *testing.T) {
	cfg := config.Default()
	cfg.Registry.Mirrors = map[string][]string{"docker.io": {"https://m.example"}}
	cfg.Registry.Insecure = []string{"reg.example:5000"}
	cfg.Registry.MaxConcurrentDownloads = 7
	cfg.Registry.ConfigPath = "/etc/crisp/certs.d"
	cfg.Registry.AuthFile = "/etc/crisp/auth.json"
	cfg.Image.PullProgressTimeout = config.Duration(90 * time.Second)
	got, err := remoteConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := remote.Config{
		Mirrors:                cfg.Registry.Mirrors,
		Insecure:               cfg.Registry.Insecure,
		MaxConcurrentDownloads: 7,
		HostsDir:               "/etc/crisp/certs.d",
		AuthFile:               "/etc/crisp/auth.json",
		ProgressTimeout:        90 * time.Second,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("remoteConfig = %+v, want %+v", got, want)
	}
}

// TestReload walks a config file through the changes an operator makes, reloading
// after each: reloadable keys are applied and named, restart keys are named in a
// warning until the file agrees with what runs again, and a bad file changes nothing.
func TestReload(t *testing.T) {
	const initial = "log_level = \"info\"\n"
	f := newReloadFixture(t, initial)
	const changed = `log_level = "debug"
socket = "/run/crisp-other/crisp.sock"
[registry]
max_concurrent_downloads = 5
[registry.mirrors]
"docker.io" = ["https://mirror.example"]
[image]
pinned = ["registry.k8s.io/pause:3.10"]
`
	f.write(changed)
	if err := f.r.reload(syscall.SIGHUP); err != nil {
		t.Fatalf("reload: %v", err)
	}
	if got := f.r.level.Level(); got != slog.LevelDebug {
		t.Errorf("log level %v, want debug", got)
	}
	calls, rc, pinned := f.images.got()
	if calls != 1 || rc.MaxConcurrentDownloads != 5 || !reflect.DeepEqual(rc.Mirrors, map[string][]string{"docker.io": {"https://mirror.example"}}) ||
		!reflect.DeepEqual(pinned, []string{"registry.k8s.io/pause:3.10"}) {
		t.Errorf("Reconfigure calls %d with %+v, pinned %q", calls, rc, pinned)
	}
	if recs := f.logs.records(t, "config reloaded"); len(recs) != 1 ||
		!reflect.DeepEqual(recs[0]["changed"], []any{"image.pinned", "log_level", "registry.max_concurrent_downloads", "registry.mirrors"}) {
		t.Errorf("info of the reload: %v", recs)
	}
	const restartMsg = "config keys changed that take effect only when criserver restarts; they keep their running values until then"
	if recs := f.logs.records(t, restartMsg); len(recs) != 1 || recs[0]["level"] != "WARN" || !reflect.DeepEqual(recs[0]["keys"], []any{"socket"}) {
		t.Errorf("restart warning: %v", recs)
	}
	f.checkReloads(1, 0)

	// Bad files: refused whole, with the reason naming the key; nothing changes.
	const refusedMsg = "config reload refused: the settings in force are unchanged"
	for i, bad := range []struct{ file, inErr string }{
		{"log_level = \"loud\"\n[registry]\nmax_concurrent_downloads = 1\n", "log_level"},
		{"[registry]\nmax_concurrent_downloads = 0\n", "registry.max_concurrent_downloads"},
		{"log_level = \n", "parse config"},
		{"no_such_key = 1\n", "no_such_key"},
	} {
		f.write(bad.file)
		err := f.r.reload(syscall.SIGHUP)
		if err == nil || !strings.Contains(err.Error(), bad.inErr) {
			t.Errorf("reload of %q: %v, want an error naming %s", bad.file, err, bad.inErr)
		}
		recs := f.logs.records(t, refusedMsg)
		if len(recs) != i+1 || recs[i]["level"] != "ERROR" || !strings.Contains(fmt.Sprint(recs[i]["err"]), bad.inErr) || recs[i]["file"] != f.path {
			t.Errorf("error logged for %q: %v", bad.file, recs)
		}
		f.checkReloads(1, float64(i+1))
	}
	if got := f.r.level.Level(); got != slog.LevelDebug {
		t.Errorf("log level after bad files %v, want debug still", got)
	}
	if calls, rc, _ := f.images.got(); calls != 1 || rc.MaxConcurrentDownloads != 5 {
		t.Errorf("bad files reconfigured the images: %d calls, %+v", calls, rc)
	}

	// The same file again: the socket still differs from what runs, so it is named again.
	f.write(changed)
	if err := f.r.reload(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if recs := f.logs.records(t, restartMsg); len(recs) != 2 {
		t.Errorf("restart warnings after the same file again: %d, want 2", len(recs))
	}
	// The file as at start: no restart needed, the level back to info.
	f.write(initial)
	if err := f.r.reload(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if recs := f.logs.records(t, restartMsg); len(recs) != 2 {
		t.Errorf("restart warnings after the file was put back: %d, want still 2", len(recs))
	}
	if got := f.r.level.Level(); got != slog.LevelInfo {
		t.Errorf("log level %v, want info", got)
	}
	if _, rc, pinned := f.images.got(); len(rc.Mirrors) != 0 || len(pinned) != 0 {
		t.Errorf("mirrors %v and pinned %q after the file was put back", rc.Mirrors, pinned)
	}
	f.checkReloads(3, 4)
}

// TestReloadWithoutFile: criserver on the defaults has nothing to read; a request
// says so and changes nothing.
func TestReloadWithoutFile(t *testing.T) {
	f := newReloadFixture(t, "")
	f.r.path = ""
	if err := f.r.reload(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if recs := f.logs.records(t, "reload requested, but criserver runs without a config file: nothing to reload"); len(recs) != 1 {
		t.Errorf("log: %v", recs)
	}
	if calls, _, _ := f.images.got(); calls != 0 {
		t.Errorf("Reconfigure called %d times", calls)
	}
	f.checkReloads(0, 0)
}

// TestReloaderLoop: requests sent to the channel are applied by the loop, and once
// stop has returned the loop is gone and reads no more.
func TestReloaderLoop(t *testing.T) {
	f := newReloadFixture(t, "")
	requests := make(chan os.Signal, 1)
	stop := f.r.start(requests)
	f.write("log_level = \"error\"\n")
	requests <- syscall.SIGHUP
	deadline := time.Now().Add(10 * time.Second)
	for f.r.level.Level() != slog.LevelError {
		if time.Now().After(deadline) {
			t.Fatal("the request was not applied")
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	requests <- syscall.SIGHUP
	time.Sleep(50 * time.Millisecond)
	if calls, _, _ := f.images.got(); calls != 1 || len(requests) != 1 {
		t.Errorf("after stop: %d reloads, %d requests waiting; want 1 and 1", calls, len(requests))
	}
}
