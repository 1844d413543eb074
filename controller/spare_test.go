package controller

import (
	"github.com/crisp-runtime/crisp/internal/testutil"

	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	sandboxapi "github.com/containerd/containerd/api/runtime/sandbox/v1"

	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/store"
)

// testShimDir is where testShim built the shim; TestMain removes it.
var testShimDir string

func TestMain(m *testing.M) {
	if mode := os.Getenv(stalledShimEnv); mode != "" {
		os.Exit(stalledShim(mode))
	}
	code := m.Run()
	if testShimDir != "" {
		os.RemoveAll(testShimDir)
	}
	os.Exit(code)
}

// testShim builds cmd/shim-runc once for the tests that start real shims; CRISP_TEST_SHIM
// names a built one instead.
var testShim = sync.OnceValues(func() (string, error) {
	if p := os.Getenv("CRISP_TEST_SHIM"); p != "" {
		return p, nil
	}
	dir, err := os.MkdirTemp("", "crisp-controller-test-")
	if err != nil {
		return "", err
	}
	testShimDir = dir
	bin := filepath.Join(dir, "shim-runc")
	cmd := exec.Command("go", "build", "-tags", "seccomp grpcnotrace", "-o", bin, "./cmd/shim-runc")
	cmd.Dir = testutil.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build shim-runc: %v\n%s", err, out)
	}
	return bin, nil
})

// spareEnv is a controller with a warm spare for handler "runc", on a real shim.
type spareEnv struct {
	t     *testing.T
	dir   string
	opts  Options
	store *store.Store
	c     *Controller
}

func newSpareEnv(t *testing.T) *spareEnv {
	t.Helper()
	testutil.RequiresRoot(t, "the shim's subreaper and sockets")
	shim, err := testShim()
	if err != nil {
		t.Fatal(err)
	}
	// Short: the shim's socket path must fit 108 bytes.
	dir, err := os.MkdirTemp("/tmp", "cspare-")
	if err != nil {
		t.Fatal(err)
	}
	e := &spareEnv{t: t, dir: dir, opts: Options{
		StateDir:         filepath.Join(dir, "state"),
		Runtimes:         map[string]config.Runtime{"runc": {Shim: shim, Namespace: "k8s.io", WarmSpare: true}, "cold": {Shim: shim}},
		ShimStartTimeout: 10 * time.Second,
		Address:          filepath.Join(dir, "crisp.sock"),
	}}
	t.Cleanup(func() {
		if e.c != nil {
			e.c.Close()
		}
		if e.store != nil {
			e.store.Close()
		}
		// Whatever a failed test left running.
		pids, _ := filepath.Glob(filepath.Join(e.opts.StateDir, "sandboxes", "*", "shim.pid"))
		for _, p := range pids {
			if pid := readShimPid(filepath.Dir(p)); isShimOf(pid, filepath.Base(filepath.Dir(p))) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		os.RemoveAll(dir)
	})
	e.open()
	return e
}

// open starts a controller (and Recover) on the env's state, as criserver does.
func (e *spareEnv) open() {
	e.t.Helper()
	st, err := store.Open(filepath.Join(e.dir, "meta.db"))
	if err != nil {
		e.t.Fatal(err)
	}
	e.store = st
	log := slog.New(slog.NewTextHandler(testWriter{e.t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c, err := New(e.opts, st, nil, log)
	if err != nil {
		e.t.Fatal(err)
	}
	e.c = c
	if _, err := c.Recover(context.Background()); err != nil {
		e.t.Fatal(err)
	}
}

// crash drops the controller as a kill -9 would: its keepers stop, its spares stay.
func (e *spareEnv) crash() {
	e.c.stopBG()
	e.c.spares.wg.Wait()
	e.c = nil
	e.store.Close()
	e.store = nil
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", p)
	return len(p), nil
}

// ready waits for handler's ready spare that is none of old.
func (e *spareEnv) ready(handler string, old ...*spare) *spare {
	e.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		e.c.spares.mu.Lock()
		sp := e.c.spares.ready[handler]
		e.c.spares.mu.Unlock()
		fresh := sp != nil
		for _, o := range old {
			if sp == o || (sp != nil && o != nil && sp.sb.rec.ID == o.sb.rec.ID) {
				fresh = false
			}
		}
		if fresh {
			return sp
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no new ready spare for %s", handler)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// assertGone checks that nothing of a spare is left: process, socket, bundle, record.
func (e *spareEnv) assertGone(sp *spare, pid int) {
	e.t.Helper()
	if waitGone(pid, 5*time.Second); processAlive(pid) && isShimOf(pid, sp.sb.rec.ID) {
		e.t.Errorf("spare %s: shim %d still runs", sp.sb.rec.ID, pid)
	}
	if _, err := os.Stat(sp.sb.rec.Bundle); !os.IsNotExist(err) {
		e.t.Errorf("spare %s: bundle left (%v)", sp.sb.rec.ID, err)
	}
	if _, err := os.Stat(trimUnix(sp.sb.rec.Address)); !os.IsNotExist(err) {
		e.t.Errorf("spare %s: socket %s left (%v)", sp.sb.rec.ID, sp.sb.rec.Address, err)
	}
	if e.store != nil {
		var r spareRecord
		if err := e.store.Get(spareBucket, sp.sb.rec.ID, &r); err == nil {
			e.t.Errorf("spare %s: record left", sp.sb.rec.ID)
		}
	}
}

// shimsIn counts the shims serving from the env's bundles.
func (e *spareEnv) shimsIn() int {
	n := 0
	pids, _ := filepath.Glob(filepath.Join(e.opts.StateDir, "sandboxes", "*", "shim.pid"))
	for _, p := range pids {
		if pid := readShimPid(filepath.Dir(p)); isShimOf(pid, filepath.Base(filepath.Dir(p))) && processAlive(pid) {
			n++
		}
	}
	return n
}

// One caller of ten gets the spare's id; the claim hands over a live, connected shim;
// the replacement starts once the adoption ends; a handler without warm_spare has none.
func TestSpareHandOutAndReplace(t *testing.T) {
	e := newSpareEnv(t)
	sp := e.ready("runc")
	pid := sp.sb.shimPid
	if !isShimOf(pid, sp.sb.rec.ID) {
		t.Fatalf("spare %s: pid %d is not its shim", sp.sb.rec.ID, pid)
	}
	if _, err := os.Stat(filepath.Join(sp.sb.rec.Bundle, SpareMarker)); err != nil {
		t.Errorf("spare bundle not marked: %v", err)
	}
	ids := make([]string, 10)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i] = e.c.NewSandboxID("runc")
		}()
	}
	wg.Wait()
	got := 0
	for _, id := range ids {
		if id == sp.sb.rec.ID {
			got++
		}
		if len(id) != 64 {
			t.Errorf("id %q is not 64 hex digits", id)
		}
	}
	if got != 1 {
		t.Fatalf("%d of 10 callers got the spare's id, want 1", got)
	}
	if id := e.c.NewSandboxID("cold"); id == sp.sb.rec.ID || e.c.spares.kick["cold"] != nil {
		t.Errorf("handler without warm_spare: id %s, keeper %v", id, e.c.spares.kick["cold"] != nil)
	}
	claimed, err := e.c.claimSpare(context.Background(), sp.sb.rec.ID, "runc")
	if err != nil || claimed != sp {
		t.Fatalf("claim of the offered id returned %v, %v", claimed, err)
	}
	if again, err := e.c.claimSpare(context.Background(), sp.sb.rec.ID, "runc"); again != nil || err != nil {
		t.Fatalf("a spare was claimed twice (%v)", err)
	}
	// While the adopting Create runs, no replacement starts (it would compete with it).
	time.Sleep(200 * time.Millisecond)
	e.c.spares.mu.Lock()
	early := e.c.spares.ready["runc"]
	e.c.spares.mu.Unlock()
	if early != nil {
		t.Errorf("replacement ready while the adoption runs")
	}
	if _, err := claimed.sb.svc.PingSandbox(context.Background(), &sandboxapi.PingRequest{SandboxID: claimed.sb.rec.ID}); err != nil {
		t.Errorf("adopted shim does not answer: %v", err)
	}
	e.c.adopted("runc")
	next := e.ready("runc", sp)
	if next.sb.shimPid == pid {
		t.Errorf("replacement is the adopted spare's shim %d", pid)
	}
	// The adopted shim is the caller's now: Close leaves it be and shuts the spare down.
	e.c.Close()
	e.c = nil
	if !processAlive(pid) {
		t.Errorf("adopted shim %d stopped by Close", pid)
	}
	e.assertGone(next, next.sb.shimPid)
}

// A spare whose shim is killed is noticed, removed and replaced, and never handed out.
func TestSpareDiesAndIsReplaced(t *testing.T) {
	e := newSpareEnv(t)
	sp := e.ready("runc")
	pid := sp.sb.shimPid
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	next := e.ready("runc", sp)
	e.assertGone(sp, pid)
	if id := e.c.NewSandboxID("runc"); id != next.sb.rec.ID {
		t.Errorf("next pod id %s, want the replacement's %s", id, next.sb.rec.ID)
	}
	if e.shimsIn() != 1 {
		t.Errorf("%d shims run, want the replacement alone", e.shimsIn())
	}
}

// An id handed out whose Create never comes gives its shim back; a Create that comes
// after all starts a shim of its own under the id.
func TestSpareOfferExpires(t *testing.T) {
	e := newSpareEnv(t)
	sp := e.ready("runc")
	pid := sp.sb.shimPid
	id := e.c.NewSandboxID("runc")
	if id != sp.sb.rec.ID {
		t.Fatalf("id %s, want the spare's %s", id, sp.sb.rec.ID)
	}
	next := e.ready("runc", sp)
	e.assertGone(sp, pid)
	if claimed, err := e.c.claimSpare(context.Background(), id, "runc"); claimed != nil || err != nil {
		t.Errorf("expired offer claimed (%v)", err)
	}
	if e.shimsIn() != 1 {
		t.Errorf("%d shims run, want the replacement %s alone", e.shimsIn(), next.sb.rec.ID)
	}
}

// A killed criserver's spare is removed by the next Recover, which leaves exactly one
// spare; Close leaves none and nothing of them.
func TestSpareRecoverAndClose(t *testing.T) {
	e := newSpareEnv(t)
	sp := e.ready("runc")
	pid := sp.sb.shimPid
	e.crash()
	if !processAlive(pid) {
		t.Fatal("spare died with the controller")
	}
	e.open()
	next := e.ready("runc", sp)
	e.assertGone(sp, pid)
	if n := e.shimsIn(); n != 1 {
		t.Errorf("%d shims after recovery, want 1", n)
	}
	e.c.Close()
	e.c = nil
	e.assertGone(next, next.sb.shimPid)
	for _, d := range []string{"sandboxes", "s"} {
		if entries, _ := os.ReadDir(filepath.Join(e.opts.StateDir, d)); len(entries) != 0 {
			t.Errorf("%s left after Close: %v", d, entries)
		}
	}
	n := 0
	_ = e.store.ForEach(spareBucket, func(string, []byte) error { n++; return nil })
	if n != 0 {
		t.Errorf("%d spare records left after Close", n)
	}
}
