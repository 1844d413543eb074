package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Workload drives one runtime through the CRI calls kubelet makes. Every runtime gets
// exactly the same requests.
type Workload struct {
	D     *Daemon
	Image string // a busybox image, pulled before use
	// Handler is the runtime handler of the pods it runs ("" for the default).
	Handler string
	seq     atomic.Int64

	mu   sync.Mutex
	pods map[string]*cri.PodSandboxConfig // the configs of the pods PodWithSleep made
}

func (w *Workload) podConfig(name string) *cri.PodSandboxConfig {
	n := w.seq.Add(1)
	uid := fmt.Sprintf("%s-%d-%d", name, os.Getpid(), n)
	return &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: fmt.Sprintf("%s-%d", name, n), Uid: uid, Namespace: "bench"},
		Hostname:     fmt.Sprintf("%s-%d", name, n),
		LogDirectory: filepath.Join(w.D.Dir, "logs", uid),
		Linux: &cri.LinuxPodSandboxConfig{
			CgroupParent: w.D.CgroupParent,
			SecurityContext: &cri.LinuxSandboxSecurityContext{
				NamespaceOptions: &cri.NamespaceOption{Network: cri.NamespaceMode_POD, Pid: cri.NamespaceMode_CONTAINER, Ipc: cri.NamespaceMode_POD},
			},
		},
	}
}

func (w *Workload) ctrConfig(name string, cmd ...string) *cri.ContainerConfig {
	return &cri.ContainerConfig{
		Metadata: &cri.ContainerMetadata{Name: name},
		Image:    &cri.ImageSpec{Image: w.Image},
		Command:  cmd,
		LogPath:  name + ".log",
		Linux:    &cri.LinuxContainerConfig{SecurityContext: &cri.LinuxContainerSecurityContext{}},
	}
}

// CycleTimes are the phases of one pod cycle.
type CycleTimes struct {
	Run, Create, Start, Stop, StopPod, Remove time.Duration
}

// Total is the whole cycle.
func (c CycleTimes) Total() time.Duration {
	return c.Run + c.Create + c.Start + c.Stop + c.StopPod + c.Remove
}

// PodStart is what a pod takes to run its first container.
func (c CycleTimes) PodStart() time.Duration { return c.Run + c.Create + c.Start }

// Cycle runs a pod with one `sleep` container, stops and removes it.
func (w *Workload) Cycle(ctx context.Context) (CycleTimes, error) {
	var ct CycleTimes
	rt := w.D.RT
	pod := w.podConfig("cycle")
	t := time.Now()
	rp, err := rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: pod, RuntimeHandler: w.Handler})
	if err != nil {
		return ct, fmt.Errorf("run pod: %w", err)
	}
	ct.Run = time.Since(t)
	id := rp.PodSandboxId
	cleanup := func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_, _ = rt.StopPodSandbox(cctx, &cri.StopPodSandboxRequest{PodSandboxId: id})
		_, _ = rt.RemovePodSandbox(cctx, &cri.RemovePodSandboxRequest{PodSandboxId: id})
	}
	t = time.Now()
	cc, err := rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: id, Config: w.ctrConfig("sleep", "sleep", "3600"), SandboxConfig: pod})
	if err != nil {
		cleanup()
		return ct, fmt.Errorf("create container: %w", err)
	}
	ct.Create = time.Since(t)
	t = time.Now()
	if _, err := rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: cc.ContainerId}); err != nil {
		cleanup()
		return ct, fmt.Errorf("start container: %w", err)
	}
	ct.Start = time.Since(t)
	t = time.Now()
	if _, err := rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: cc.ContainerId, Timeout: 0}); err != nil {
		cleanup()
		return ct, fmt.Errorf("stop container: %w", err)
	}
	ct.Stop = time.Since(t)
	t = time.Now()
	if _, err := rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		cleanup()
		return ct, fmt.Errorf("stop pod: %w", err)
	}
	ct.StopPod = time.Since(t)
	t = time.Now()
	if _, err := rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		cleanup()
		return ct, fmt.Errorf("remove pod: %w", err)
	}
	ct.Remove = time.Since(t)
	return ct, nil
}

// pickTimes is one phase of each cycle.
func pickTimes(cs []CycleTimes, f func(CycleTimes) time.Duration) []time.Duration {
	out := make([]time.Duration, len(cs))
	for i, c := range cs {
		out[i] = f(c)
	}
	return out
}

// Cycles runs n sequential cycles.
func (w *Workload) Cycles(ctx context.Context, n int) ([]CycleTimes, error) {
	out := make([]CycleTimes, 0, n)
	for range n {
		c, err := w.Cycle(ctx)
		if err != nil {
			return out, err
		}
		out = append(out, c)
	}
	return out, nil
}

// Churn runs cycles from clients concurrent clients for d and returns the completed
// cycles per second and the number of failed cycles.
func (w *Workload) Churn(ctx context.Context, clients int, d time.Duration) (float64, int, error) {
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var done, failed atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for cctx.Err() == nil {
				// Cycles run to their end even past the deadline, so no pod is left
				// half made; only whole cycles inside the window count.
				_, err := w.Cycle(context.WithoutCancel(cctx))
				if err != nil {
					failed.Add(1)
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					continue
				}
				if cctx.Err() == nil {
					done.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return float64(done.Load()) / d.Seconds(), int(failed.Load()), firstErr
}

// PodWithSleep runs a pod with one running `sleep` container and returns the pod id.
func (w *Workload) PodWithSleep(ctx context.Context, name string) (string, string, error) {
	rt := w.D.RT
	pod := w.podConfig(name)
	rp, err := rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: pod, RuntimeHandler: w.Handler})
	if err != nil {
		return "", "", fmt.Errorf("run pod: %w", err)
	}
	w.mu.Lock()
	if w.pods == nil {
		w.pods = map[string]*cri.PodSandboxConfig{}
	}
	w.pods[rp.PodSandboxId] = pod
	w.mu.Unlock()
	cid, err := w.runCtr(ctx, rp.PodSandboxId, pod, w.ctrConfig("sleep", "sleep", "3600"))
	if err != nil {
		return rp.PodSandboxId, "", err
	}
	return rp.PodSandboxId, cid, nil
}

func (w *Workload) runCtr(ctx context.Context, podID string, pod *cri.PodSandboxConfig, cfg *cri.ContainerConfig) (string, error) {
	cc, err := w.D.RT.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: cfg, SandboxConfig: pod})
	if err != nil {
		return "", fmt.Errorf("create container: %w", err)
	}
	if _, err := w.D.RT.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: cc.ContainerId}); err != nil {
		return "", fmt.Errorf("start container: %w", err)
	}
	return cc.ContainerId, nil
}

// ListLatency makes pods with a running `sleep` and an exited `true` container until the
// runtime has n pods, then times ListPodSandbox and ListContainers calls.
func (w *Workload) ListLatency(ctx context.Context, pods, calls int) (listPods, listCtrs []time.Duration, err error) {
	rt := w.D.RT
	have, err := rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return nil, nil, err
	}
	for i := len(have.Items); i < pods; i++ {
		if _, _, err := w.PodWithSleep(ctx, "list"); err != nil {
			return nil, nil, err
		}
	}
	// Every pod gets an exited container besides its sleeper: 2 containers per pod.
	all, err := rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return nil, nil, err
	}
	for _, p := range all.Items {
		w.mu.Lock()
		cfg := w.pods[p.Id]
		w.mu.Unlock()
		if cfg == nil {
			return nil, nil, fmt.Errorf("pod %s was not made by this workload", p.Id)
		}
		if _, err := w.runCtr(ctx, p.Id, cfg, w.ctrConfig("true", "true")); err != nil {
			return nil, nil, err
		}
	}
	// Let the `true`s exit, so the lists carry exited containers.
	deadline := time.Now().Add(30 * time.Second)
	for {
		cl, err := rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{State: &cri.ContainerStateValue{State: cri.ContainerState_CONTAINER_EXITED}}})
		if err != nil {
			return nil, nil, err
		}
		if len(cl.Containers) >= len(all.Items) {
			break
		}
		if time.Now().After(deadline) {
			return nil, nil, fmt.Errorf("only %d of %d `true` containers exited", len(cl.Containers), len(all.Items))
		}
		time.Sleep(100 * time.Millisecond)
	}
	for range calls {
		t := time.Now()
		pl, err := rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
		if err != nil {
			return nil, nil, err
		}
		listPods = append(listPods, time.Since(t))
		t = time.Now()
		cl, err := rt.ListContainers(ctx, &cri.ListContainersRequest{})
		if err != nil {
			return nil, nil, err
		}
		listCtrs = append(listCtrs, time.Since(t))
		if len(pl.Items) != pods || len(cl.Containers) != 2*pods {
			return nil, nil, fmt.Errorf("lists returned %d pods and %d containers, want %d and %d", len(pl.Items), len(cl.Containers), pods, 2*pods)
		}
	}
	return listPods, listCtrs, nil
}

// ExecLatency times n ExecSync `echo` calls into a running container.
func (w *Workload) ExecLatency(ctx context.Context, containerID string, n int) ([]time.Duration, error) {
	var out []time.Duration
	for range n {
		t := time.Now()
		r, err := w.D.RT.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: containerID, Cmd: []string{"echo", "hi"}, Timeout: 10})
		if err != nil {
			return nil, err
		}
		out = append(out, time.Since(t))
		if r.ExitCode != 0 || string(r.Stdout) != "hi\n" {
			return nil, fmt.Errorf("exec echo: exit %d stdout %q stderr %q", r.ExitCode, r.Stdout, r.Stderr)
		}
	}
	return out, nil
}

// Pull times pulling ref (a first pull: the image must not be present).
func (w *Workload) Pull(ctx context.Context, ref string) (time.Duration, error) {
	t := time.Now()
	if _, err := w.D.Img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}}); err != nil {
		return 0, fmt.Errorf("pull %s: %w", ref, err)
	}
	return time.Since(t), nil
}

// SandboxPid is the pid of a pod's sandbox (pause) process from the verbose status
// both runtimes report.
func (w *Workload) SandboxPid(ctx context.Context, podID string) (int, error) {
	st, err := w.D.RT.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: podID, Verbose: true})
	if err != nil {
		return 0, err
	}
	return sandboxPid(st.GetInfo()["info"])
}

// Percentile is the p-th percentile (0-100) of ds by nearest rank.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s))*p/100+0.5) - 1
	i = max(0, min(i, len(s)-1))
	return s[i]
}

var errNoPid = errors.New("verbose status carries no sandbox pid")
