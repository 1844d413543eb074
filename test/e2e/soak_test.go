package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The soak's counts and bounds: how much a pod's shim and criserver may grow between
// an early and a late reading of the same work repeated. The early reading comes
// after the warm-up (the shim's memory grows for its first ~100 execs, criserver's
// for its first ~50 pod cycles, then stays flat). With GOGC=20 (see the test) the
// growth measured without a leak was -112..+144 KiB for the shim's USS (100 to 400
// execs; once +412 KiB in CI, so its slack is 768 KiB) and -96..+96 KiB for criserver's anonymous memory (40 to 200 cycles); the
// slack is well above that and well below what a leak of 4 KiB per exec (1.2 MiB)
// or 8 KiB per pod cycle (1.3 MiB) adds.
const (
	soakExecsFirst = 100
	soakExecs      = 400
	// soakShimSlackKiB bounds the growth of the shim's private memory (USS).
	soakShimSlackKiB = 768

	soakCyclesFirst = 40
	soakCycles      = 200
	soakClients     = 4
	// soakDaemonSlackKiB bounds the growth of criserver's anonymous memory.
	soakDaemonSlackKiB = 512

	// soakSettle is how long memory is left to settle before a reading: the shim
	// returns what work freed to the kernel a second after the work.
	soakSettle = 2 * time.Second
)

// TestE2ESoak repeats work that must leave nothing behind and compares memory early
// and late: the private memory (USS) of a pod's shim after soakExecsFirst ExecSyncs
// and after soakExecs, and criserver's anonymous resident memory after
// soakCyclesFirst pod cycles and after soakCycles, each reading after a settle.
// A shorter form of `make bench BENCHFLAGS=-soak`, with bounds that hold on a busy
// node: the readings are of one process's own pages, which other processes do not
// change, and the slack is above the growth measured without a leak.
func TestE2ESoak(t *testing.T) {
	// A tight GC target for criserver and the shims (they inherit it): their heap
	// then stays close to what is live, so a reading depends little on when the last
	// GC ran, and what is retained (a leak) shows as it is.
	t.Setenv("GOGC", "20")
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)

	cfg := e.podConfig("soak")
	pod := e.runPod(ctx, cfg)
	ctr := e.runCtr(ctx, pod, cfg, ctrConfig("sleep", img, "sleep", "3600"))
	_, info := e.status(ctx, pod)
	execs := func(n int) {
		t.Helper()
		for i := range n {
			r, err := e.execSync(ctx, ctr, 10, "true")
			if err != nil || r.ExitCode != 0 {
				t.Fatalf("exec %d: %v %+v", i, err, r)
			}
		}
	}
	execs(soakExecsFirst)
	first := soakMem(t, info.ShimPid)
	execs(soakExecs - soakExecsFirst)
	last := soakMem(t, info.ShimPid)
	t.Logf("shim after %d execs: %v; after %d: %v; USS growth %d KiB",
		soakExecsFirst, first, soakExecs, last, last.uss-first.uss)
	if last.uss > first.uss+soakShimSlackKiB {
		t.Errorf("the shim's private memory grew by %d KiB from exec %d to %d, more than %d KiB: a leak per exec",
			last.uss-first.uss, soakExecsFirst, soakExecs, soakShimSlackKiB)
	}
	e.stopRemove(ctx, t, pod)

	daemon := e.cmd.Process.Pid
	cycles := func(from, to int) {
		t.Helper()
		if err := soakCyclesRun(ctx, e, img, from, to); err != nil {
			t.Fatal(err)
		}
	}
	cycles(0, soakCyclesFirst)
	first = soakMem(t, daemon)
	cycles(soakCyclesFirst, soakCycles)
	last = soakMem(t, daemon)
	t.Logf("criserver after %d pod cycles: %v; after %d: %v; anonymous growth %d KiB",
		soakCyclesFirst, first, soakCycles, last, last.anon-first.anon)
	if last.anon > first.anon+soakDaemonSlackKiB {
		t.Errorf("criserver's anonymous memory grew by %d KiB from pod cycle %d to %d, more than %d KiB: a leak per pod",
			last.anon-first.anon, soakCyclesFirst, soakCycles, soakDaemonSlackKiB)
	}
}

// soakCyclesRun runs pod cycles from to to (each a pod with a `true` container, run,
// stopped and removed) from soakClients concurrent clients.
func soakCyclesRun(ctx context.Context, e *env, img string, from, to int) error {
	next := make(chan int)
	errs := make(chan error, soakClients)
	var wg sync.WaitGroup
	for range soakClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := soakCycle(ctx, e, img, i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := from; i < to; i++ {
		select {
		case next <- i:
		case err = <-errs:
			break feed
		}
	}
	close(next)
	wg.Wait()
	close(errs)
	if err == nil {
		err = <-errs
	}
	return err
}

func soakCycle(ctx context.Context, e *env, img string, i int) (retErr error) {
	cfg := e.podConfig(fmt.Sprintf("soak-cycle-%d", i))
	p, err := e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		return fmt.Errorf("cycle %d: run pod: %w", i, err)
	}
	defer func() {
		if retErr != nil {
			_, _ = e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: p.PodSandboxId})
		}
	}()
	c, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: p.PodSandboxId, Config: ctrConfig("true", img, "true"), SandboxConfig: cfg})
	if err != nil {
		return fmt.Errorf("cycle %d: create container: %w", i, err)
	}
	if _, err := e.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		return fmt.Errorf("cycle %d: start container: %w", i, err)
	}
	if _, err := e.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: p.PodSandboxId}); err != nil {
		return fmt.Errorf("cycle %d: stop pod: %w", i, err)
	}
	if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: p.PodSandboxId}); err != nil {
		return fmt.Errorf("cycle %d: remove pod: %w", i, err)
	}
	return nil
}

// soakReading is a process's memory in KiB.
type soakReading struct {
	rss, pss, uss, anon int
}

func (r soakReading) String() string {
	return fmt.Sprintf("RSS %d PSS %d USS %d anon %d KiB", r.rss, r.pss, r.uss, r.anon)
}

// soakMem reads a process's memory after soakSettle.
func soakMem(t *testing.T, pid int) soakReading {
	t.Helper()
	time.Sleep(soakSettle)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		t.Fatal(err)
	}
	var r soakReading
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		switch f[0] {
		case "Rss:":
			r.rss = v
		case "Pss:":
			r.pss = v
		case "Private_Clean:", "Private_Dirty:":
			r.uss += v
		case "Anonymous:":
			r.anon = v
		}
	}
	if r.rss == 0 {
		t.Fatalf("no Rss in /proc/%d/smaps_rollup", pid)
	}
	return r
}
