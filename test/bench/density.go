package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Pod is a pod the workload started, with its containers.
type Pod struct {
	ID     string
	Config *cri.PodSandboxConfig
	Ctrs   []string
}

// Parallel calls f(0) ... f(n-1) from clients goroutines, as kubelet's pod workers
// do, and returns once every call returned: the first error stops the handing out of
// further indexes, and the errors of the calls that ran are joined.
func Parallel(ctx context.Context, n, clients int, f func(ctx context.Context, i int) error) error {
	next := make(chan int)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range min(clients, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(ctx, i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
feed:
	for i := range n {
		mu.Lock()
		failed := len(errs) > 0
		mu.Unlock()
		if failed {
			break
		}
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if len(errs) > 3 {
		errs = append(errs[:3], fmt.Errorf("and %d more errors", len(errs)-3))
	}
	if len(errs) == 0 && ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.Join(errs...)
}

// StartPods starts n pods of one `sleep` container each from clients concurrent
// clients, each pod by RunPodSandbox, CreateContainer, StartContainer as kubelet does.
// It returns the pods, each pod's start time (the three calls) and the time until all
// n ran.
func (w *Workload) StartPods(ctx context.Context, name string, n, clients int) ([]*Pod, []time.Duration, time.Duration, error) {
	pods := make([]*Pod, n)
	starts := make([]time.Duration, n)
	t0 := time.Now()
	err := Parallel(ctx, n, clients, func(ctx context.Context, i int) error {
		t := time.Now()
		id, cid, err := w.PodWithSleep(ctx, fmt.Sprintf("%s%d", name, i))
		if id != "" {
			pods[i] = &Pod{ID: id, Config: w.config(id)}
		}
		if err != nil {
			return err
		}
		starts[i] = time.Since(t)
		pods[i].Ctrs = []string{cid}
		return nil
	})
	all := time.Since(t0)
	var made []*Pod
	for _, p := range pods {
		if p != nil {
			made = append(made, p)
		}
	}
	return made, starts, all, err
}

func (w *Workload) config(podID string) *cri.PodSandboxConfig {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pods[podID]
}

// AddContainers gives every pod a second `sleep` and an exited `true` (as an init
// container leaves one), from clients concurrent clients, and waits for the `true`s to
// exit.
func (w *Workload) AddContainers(ctx context.Context, pods []*Pod, clients int) error {
	var mu sync.Mutex
	err := Parallel(ctx, len(pods), clients, func(ctx context.Context, i int) error {
		p := pods[i]
		for _, c := range []*cri.ContainerConfig{w.ctrConfig("sidecar", "sleep", "3600"), w.ctrConfig("init", "true")} {
			id, err := w.runCtr(ctx, p.ID, p.Config, c)
			if err != nil {
				return err
			}
			mu.Lock()
			p.Ctrs = append(p.Ctrs, id)
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return err
	}
	return w.waitExited(ctx, len(pods))
}

// waitExited waits until the runtime lists at least n exited containers.
func (w *Workload) waitExited(ctx context.Context, n int) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		cl, err := w.D.RT.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{State: &cri.ContainerStateValue{State: cri.ContainerState_CONTAINER_EXITED}}})
		if err != nil {
			return err
		}
		if len(cl.Containers) >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d `true` containers exited", len(cl.Containers), n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// StopPods stops and removes pods from clients concurrent clients, as kubelet kills a
// pod: StopContainer for each container, then StopPodSandbox, then RemovePodSandbox.
// It returns the time until all were gone.
func (w *Workload) StopPods(ctx context.Context, pods []*Pod, clients int) (time.Duration, error) {
	rt := w.D.RT
	t0 := time.Now()
	err := Parallel(ctx, len(pods), clients, func(ctx context.Context, i int) error {
		p := pods[i]
		for _, c := range p.Ctrs {
			if _, err := rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: c, Timeout: 0}); err != nil {
				return fmt.Errorf("stop container %s: %w", c, err)
			}
		}
		if _, err := rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: p.ID}); err != nil {
			return fmt.Errorf("stop pod %s: %w", p.ID, err)
		}
		if _, err := rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: p.ID}); err != nil {
			return fmt.Errorf("remove pod %s: %w", p.ID, err)
		}
		w.mu.Lock()
		delete(w.pods, p.ID)
		w.mu.Unlock()
		return nil
	})
	return time.Since(t0), err
}

// RemoveAll stops and removes every pod the runtime has, from clients concurrent
// clients: a clean slate for the next measurement.
func (w *Workload) RemoveAll(ctx context.Context, clients int) error {
	list, err := w.D.RT.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return err
	}
	pods := make([]*Pod, len(list.Items))
	for i, p := range list.Items {
		pods[i] = &Pod{ID: p.Id}
	}
	_, err = w.StopPods(ctx, pods, clients)
	return err
}

// Procs are the processes of a runtime with its pods: the daemon, each pod's shim
// and each pod's sandbox (pause) process.
type Procs struct {
	Daemon int
	Shims  []int
	Pauses []int
}

// All is every pid of p.
func (p Procs) All() []int { return append(append([]int{p.Daemon}, p.Shims...), p.Pauses...) }

// RuntimeProcs finds the shim and pause process of every pod as the memory figures do:
// the sandbox pid from the verbose status, the shim as its parent. A shim serving
// several pods counts once.
func (w *Workload) RuntimeProcs(ctx context.Context) (Procs, error) {
	procs := Procs{Daemon: w.D.Pid()}
	list, err := w.D.RT.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return procs, err
	}
	seen := map[int]bool{}
	for _, p := range list.Items {
		pid, err := w.SandboxPid(ctx, p.Id)
		if err != nil {
			return procs, fmt.Errorf("sandbox pid of %s: %w", p.Id, err)
		}
		shim, err := PPid(pid)
		if err != nil {
			return procs, err
		}
		procs.Pauses = append(procs.Pauses, pid)
		if !seen[shim] {
			seen[shim] = true
			procs.Shims = append(procs.Shims, shim)
		}
	}
	return procs, nil
}

// SumMem is the memory of pids together.
func SumMem(pids []int) (Mem, error) {
	var sum Mem
	for _, pid := range pids {
		m, err := ReadMem(pid)
		if err != nil {
			return sum, fmt.Errorf("memory of %d (%s): %w", pid, Comm(pid), err)
		}
		sum = sum.Add(m)
	}
	return sum, nil
}

// IdleCPU is the CPU time pids used together over window, doing nothing asked of
// them.
func IdleCPU(ctx context.Context, pids []int, window time.Duration) (time.Duration, error) {
	read := func() (time.Duration, error) {
		var sum time.Duration
		for _, pid := range pids {
			c, err := CPUTime(pid)
			if err != nil {
				return 0, err
			}
			sum += c
		}
		return sum, nil
	}
	before, err := read()
	if err != nil {
		return 0, err
	}
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(window):
	}
	after, err := read()
	if err != nil {
		return 0, err
	}
	return after - before, nil
}

// The list calls timed at density.
const (
	ListPods     = "ListPodSandbox"
	ListCtrs     = "ListContainers"
	ListCtrStats = "ListContainerStats"
	ListPodStats = "ListPodSandboxStats"
)

// ListTimes times calls of each list RPC (after a few untimed ones), round robin so
// that every RPC sees the same conditions, and checks that they list pods pods and
// ctrs containers. An RPC the runtime does not implement is left out of the result.
func (w *Workload) ListTimes(ctx context.Context, calls, pods, ctrs int) (map[string][]time.Duration, error) {
	rt := w.D.RT
	rpcs := map[string]func() (int, error){
		ListPods: func() (int, error) {
			r, err := rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
			return len(r.GetItems()), err
		},
		ListCtrs: func() (int, error) {
			r, err := rt.ListContainers(ctx, &cri.ListContainersRequest{})
			return len(r.GetContainers()), err
		},
		// Stats cover the containers there are to measure; how many a runtime reports
		// for exited ones differs, so their count is not checked.
		ListCtrStats: func() (int, error) {
			_, err := rt.ListContainerStats(ctx, &cri.ListContainerStatsRequest{})
			return -1, err
		},
		ListPodStats: func() (int, error) {
			r, err := rt.ListPodSandboxStats(ctx, &cri.ListPodSandboxStatsRequest{})
			return len(r.GetStats()), err
		},
	}
	want := map[string]int{ListPods: pods, ListCtrs: ctrs, ListPodStats: pods}
	out := map[string][]time.Duration{}
	for i := -5; i < calls; i++ {
		for name, call := range rpcs {
			t := time.Now()
			n, err := call()
			d := time.Since(t)
			if status.Code(err) == codes.Unimplemented {
				delete(rpcs, name)
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if wn, ok := want[name]; ok && n != wn {
				return nil, fmt.Errorf("%s returned %d items, want %d", name, n, wn)
			}
			if i >= 0 {
				out[name] = append(out[name], d)
			}
		}
	}
	return out, nil
}
