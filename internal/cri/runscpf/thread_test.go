package runscpf

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/crisp-runtime/crisp/internal/testutil"
)

// fakeRunscEnv makes the test binary stand in for runsc port-forward (TestMain): it
// waits as long as the variable says, as a runsc talking to a slow sandbox would, then
// connects to the socket and exits 0.
const fakeRunscEnv = "RUNSCPF_TEST_FAKE_RUNSC"

func TestMain(m *testing.M) {
	if d := os.Getenv(fakeRunscEnv); d != "" {
		os.Exit(fakeRunsc(d, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// fakeRunsc is runsc port-forward --stream SOCK ID PORT after a delay.
func fakeRunsc(delay string, args []string) int {
	d, err := time.ParseDuration(delay)
	if err != nil || len(args) < 3 {
		fmt.Fprintf(os.Stderr, "fake runsc: delay %q, args %q\n", delay, args)
		return 2
	}
	time.Sleep(d)
	conn, err := net.Dial("unix", args[len(args)-3]) //nolint:gosec // G704: the socket Dial listens on, from its own command line
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake runsc:", err)
		return 1
	}
	_ = conn.Close()
	return 0
}

// runsc is killed by nothing but its own end or Dial's timeout: not when the OS thread
// that started it ends, which happens whenever a goroutine that locked its thread
// returns (crisp's netns and idmap code does that on some paths) and the runtime had
// given that goroutine the thread runsc was forked from.
func TestDialSurvivesEndingThreads(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakeRunscEnv, "1s")
	cfg := Config{Binary: exe, Root: t.TempDir()}
	dir := t.TempDir()
	testutil.EndThreads(t)
	const dials = 8
	errs := make(chan error, dials)
	var wg sync.WaitGroup
	for range dials {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := cfg.Dial(context.Background(), dir, "k8s.io", "pod", 80)
			if err == nil {
				_ = conn.Close()
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Dial while threads end: %v", err)
		}
	}
}
