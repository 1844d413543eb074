package controller

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/store"
	"github.com/crisp-runtime/crisp/internal/testutil"
)

// stalledShimEnv makes the test binary a shim whose `start` forks the serving shim,
// as every runtime-v2 shim does, and then hangs before it records or prints anything:
// the state a start killed in that window leaves.
const stalledShimEnv = "CRISP_TEST_STALLED_SHIM"

// stalledShim is the test binary run as that shim; mode is "start" or "serve".
func stalledShim(mode string) int {
	args := os.Args[1:]
	action := ""
	if len(args) > 0 {
		action = args[len(args)-1]
	}
	switch {
	case mode == "serve":
		// Bounded, so that a failed test leaves nothing for long.
		time.Sleep(time.Minute)
		return 0
	case action == "delete":
		// An empty DeleteResponse.
		return 0
	case action == "start":
		_, _ = io.Copy(io.Discard, os.Stdin)
		cmd := exec.Command(os.Args[0], args[:len(args)-1]...)
		cmd.Env = append(os.Environ(), stalledShimEnv+"=serve")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			return 1
		}
		select {}
	}
	return 2
}

// stalledEnv is a controller whose handler "stalled" runs stalledShim.
func stalledEnv(t *testing.T, warmSpare bool) (*Controller, Options) {
	t.Helper()
	testutil.RequiresRoot(t, "the controller's state dirs")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(stalledShimEnv, "start")
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "meta.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	opts := Options{
		StateDir:         filepath.Join(dir, "state"),
		Runtimes:         map[string]config.Runtime{"stalled": {Shim: self, Namespace: "k8s.io", WarmSpare: warmSpare}},
		ShimStartTimeout: 30 * time.Second,
		Address:          filepath.Join(dir, "crisp.sock"),
	}
	c, err := New(opts, st, nil, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Recover(context.Background()); err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c, opts
}

// awaitServing waits for the serving shim a stalled start forked into bundle, and
// kills it at the test's end if the test failed to.
func awaitServing(t *testing.T, bundle, id string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if shim := findShim(bundle, id); shim != 0 {
			t.Cleanup(func() {
				if processAlive(shim) && isShimOf(shim, id) {
					_ = syscall.Kill(shim, syscall.SIGKILL)
				}
			})
			return shim
		}
		if time.Now().After(deadline) {
			t.Fatal("the stalled start never forked its serving shim")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A shim start that is killed after it forked the serving shim and before it said
// where that shim is (here by the caller's cancel; a kill -9 of criserver leaves the
// same for Recover, which undoes the pod the same way) must not leave the serving
// shim behind when the pod is undone.
func TestCreateCancelledMidStartLeavesNoShim(t *testing.T) {
	c, opts := stalledEnv(t, false)
	defer c.Close()
	const id = "stalled-start"
	bundle := filepath.Join(opts.bundleRoot(), id)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Create(ctx, Spec{ID: id, Handler: "stalled", Name: "p", Namespace: "default", UID: "u", HostNetwork: true})
		done <- err
	}()
	shim := awaitServing(t, bundle, id)
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Create succeeded with its start cancelled")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Create did not return after its cancel")
	}
	if !waitGone(shim, 5*time.Second) {
		t.Errorf("the serving shim %d of the cancelled start still runs", shim)
	}
	if _, err := os.Stat(bundle); !os.IsNotExist(err) {
		t.Errorf("bundle left: %v", err)
	}
	if c.get(id) != nil {
		t.Error("the pod is still known")
	}
}

// The same for a warm spare whose start Close cuts short.
func TestSpareStartCutByCloseLeavesNoShim(t *testing.T) {
	c, opts := stalledEnv(t, true)
	closed := false
	defer func() {
		if !closed {
			c.Close()
		}
	}()
	var id string
	deadline := time.Now().Add(10 * time.Second)
	for id == "" {
		if time.Now().After(deadline) {
			t.Fatal("no warm spare bundle appeared")
		}
		time.Sleep(10 * time.Millisecond)
		entries, _ := os.ReadDir(opts.bundleRoot())
		if len(entries) > 0 {
			id = entries[0].Name()
		}
	}
	bundle := filepath.Join(opts.bundleRoot(), id)
	shim := awaitServing(t, bundle, id)
	c.Close()
	closed = true
	if !waitGone(shim, 5*time.Second) {
		t.Errorf("the serving shim %d of the spare's cut start still runs", shim)
	}
	if _, err := os.Stat(bundle); !os.IsNotExist(err) {
		t.Errorf("bundle left: %v", err)
	}
}
