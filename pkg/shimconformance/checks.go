package shimconformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	cgroup1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	cgroup2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	sandboxapi "github.com/containerd/containerd/api/runtime/sandbox/v1"
	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	tasktypes "github.com/containerd/containerd/api/types/task"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	optionsv1 "github.com/crisp-runtime/crisp/api/options/v1"
	"github.com/crisp-runtime/crisp/api/shimapi"
)

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

func killPid(pid int) error { return unix.Kill(pid, unix.SIGKILL) }

// runChecks runs every capability in order. A check needing something that failed
// before it fails saying so.
func (s *suite) runChecks() {
	s.bootstrapChecks()
	if s.cfg.Mode == ModeSandbox {
		s.sandboxStartChecks()
	} else {
		for _, name := range []string{"sandbox.create", "sandbox.start", "sandbox.status", "sandbox.ping", "sandbox.platform", "sandbox.metrics"} {
			_ = s.check(name, false, func(context.Context) error { return unsupported("task mode: no Sandbox API is driven") })
		}
		s.podErr = s.startPauseContainer()
	}
	s.taskChecks()
	if s.cfg.Mode == ModeSandbox {
		s.sandboxEndChecks()
		_ = s.check("task.shutdown", false, func(context.Context) error {
			return unsupported("sandbox mode: the sandbox owns the shim; ShutdownSandbox ends it (sandbox.shutdown)")
		})
	} else {
		for _, name := range []string{"sandbox.stop", "sandbox.wait", "sandbox.shutdown"} {
			_ = s.check(name, false, func(context.Context) error { return unsupported("task mode: no Sandbox API is driven") })
		}
		_ = s.check("task.shutdown", false, s.checkTaskShutdown)
	}
	_ = s.check("shim.delete", false, s.checkShimDelete)
}

// needsMain reports whether any selected capability needs the pod's shim.
func (s *suite) needsMain() bool {
	for _, c := range Capabilities() {
		if s.selected(c) && c != "bootstrap.legacy" && c != "bootstrap.info" && c != "shim.delete" {
			return true
		}
	}
	return false
}

// newPod prepares a pod's bundle: in task mode the sandbox container's bundle (the
// shim starts in it and reads its config.json, as containerd's shims do), in sandbox
// mode an empty directory.
func (s *suite) newPod(id string) (*pod, error) {
	p := &pod{id: id}
	if s.cfg.Mode == ModeTask {
		c, _, err := s.prepareBundle(p, id, ctrOpts{pause: true, args: []string{"/bin/sleep", "2147483647"}})
		if err != nil {
			return nil, err
		}
		p.pause, p.bundle = c, c.bundle
		return p, nil
	}
	p.bundle = filepath.Join(s.dir, "pods", id)
	return p, os.MkdirAll(p.bundle, 0o755)
}

func (s *suite) bootstrapChecks() {
	err := s.check("bootstrap.params", s.needsMain(), func(ctx context.Context) error {
		p, err := s.newPod(s.newID("pod"))
		if err != nil {
			return err
		}
		sh, err := s.startShim(ctx, p.id, p.bundle, false)
		if sh != nil {
			p.shim = sh
		}
		if err != nil {
			return err
		}
		if sh.pid <= 0 || !alive(sh.pid) {
			return fmt.Errorf("no live process serves %s", sh.answer.address)
		}
		// A shim that ignores BootstrapParams and answers the legacy way still serves
		// (containerd ≥ 2.3 accepts that answer): the other checks go on with it.
		s.main = p
		if sh.answer.form != "BootstrapResult" {
			return unsupported("the shim ignores BootstrapParams (its socket_dir, its addresses) and answers with a %s (%s)", sh.answer.form, sh.answer.address)
		}
		setDetail(ctx, "version %d at %s, pid %d", sh.answer.version, sh.answer.address, sh.pid)
		return nil
	})
	if s.main == nil {
		s.mainErr = err
		if s.mainErr == nil {
			s.mainErr = errors.New("not run")
		}
	}

	_ = s.check("bootstrap.legacy", false, func(ctx context.Context) error {
		// A bundle without annotations: a legacy start groups by them.
		id := s.newID("legacy")
		bundle := filepath.Join(s.dir, "legacy", id)
		if err := os.MkdirAll(filepath.Join(bundle, "rootfs"), 0o755); err != nil {
			return err
		}
		spec := s.spec(&pod{id: id}, id, ctrOpts{args: []string{"/bin/true"}})
		spec.Annotations = nil
		data, err := json.Marshal(spec)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
			return err
		}
		sh, err := s.startShim(ctx, id, bundle, true)
		var se startError
		if errors.As(err, &se) && len(s.shimPids(id)) == 0 {
			return unsupported("the shim refuses a legacy start: %s", se.stderr)
		}
		if err != nil {
			return err
		}
		if sh.answer.form == "BootstrapResult" {
			return errors.New("answered a legacy start with a protobuf BootstrapResult, which containerd 2.2 and older cannot read")
		}
		// The socket serves the task API: an unknown task is NotFound.
		_, err = sh.tasks.State(ctx, "no-such-task-"+s.rand, "")
		if err == nil || !isNotFound(err) {
			return fmt.Errorf("State of an unknown task on %s: %v, want NotFound", sh.answer.address, err)
		}
		setDetail(ctx, "%s %s, task API v%d", sh.answer.form, sh.answer.address, sh.answer.version)
		// As containerd does, a task Shutdown with no task ends a plain task shim.
		_ = sh.tasks.Shutdown(ctx, id)
		if !waitGone(sh.pid, 3*time.Second) {
			sh.kill()
		}
		return nil
	})

	_ = s.check("bootstrap.again", false, func(ctx context.Context) error {
		if err := s.needMain(); err != nil {
			return err
		}
		before := s.shimPids(s.main.id)
		ans, err := s.runStart(ctx, s.main.id, s.main.bundle, false)
		if err != nil {
			return err
		}
		if socketPath(ans.address) != socketPath(s.main.shim.answer.address) {
			return fmt.Errorf("second start answered %s, the first %s", ans.address, s.main.shim.answer.address)
		}
		time.Sleep(100 * time.Millisecond)
		after := s.shimPids(s.main.id)
		if len(after) > len(before) {
			return fmt.Errorf("second start left %d shim processes for the id, %d before", len(after), len(before))
		}
		if !alive(s.main.shim.pid) {
			return errors.New("the first shim died")
		}
		setDetail(ctx, "same address, %d shim process(es)", len(after))
		return nil
	})

	_ = s.check("bootstrap.info", false, func(ctx context.Context) error {
		info, err := s.runInfo(ctx)
		if err != nil {
			return err
		}
		if info.GetName() == "" {
			return errors.New("RuntimeInfo has no name")
		}
		features := "no features"
		if f := info.GetFeatures(); f != nil {
			features = "features " + f.GetTypeUrl()
		}
		setDetail(ctx, "%s %s, %s", info.GetName(), info.GetVersion().GetVersion(), features)
		return nil
	})
}

// podSandboxConfig is the CRI PodSandboxConfig containerd 2.4 sends as CreateSandbox
// options.
func (s *suite) podSandboxConfig(id string) (*anypb.Any, error) {
	cfg := &cri.PodSandboxConfig{
		Metadata: &cri.PodSandboxMetadata{Name: "shimtest-" + id, Uid: s.rand + "-" + id, Namespace: s.namespace},
		Hostname: "shimtest",
		Labels:   map[string]string{"app": "crisp-shimtest"},
		Linux: &cri.LinuxPodSandboxConfig{
			CgroupParent: s.cgroupParent,
			SecurityContext: &cri.LinuxSandboxSecurityContext{
				NamespaceOptions: &cri.NamespaceOption{Network: cri.NamespaceMode_POD, Pid: cri.NamespaceMode_POD, Ipc: cri.NamespaceMode_POD},
			},
		},
	}
	data, err := proto.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	// containerd's typeurl names a message by its full name alone.
	return &anypb.Any{TypeUrl: "runtime.v1.PodSandboxConfig", Value: data}, nil
}

func (s *suite) sandboxClient(p *pod) sandboxapi.TTRPCSandboxService {
	return sandboxapi.NewTTRPCSandboxClient(p.shim.client)
}

// createSandbox runs CreateSandbox and StartSandbox for a pod whose shim runs.
func (s *suite) createSandbox(ctx context.Context, p *pod) error {
	opts, err := s.podSandboxConfig(p.id)
	if err != nil {
		return err
	}
	_, err = s.sandboxClient(p).CreateSandbox(ctx, &sandboxapi.CreateSandboxRequest{
		SandboxID: p.id, BundlePath: p.bundle, NetnsPath: s.netns, Options: opts,
	})
	return err
}

func (s *suite) startSandbox(ctx context.Context, p *pod) error {
	resp, err := s.sandboxClient(p).StartSandbox(ctx, &sandboxapi.StartSandboxRequest{SandboxID: p.id})
	if err != nil {
		return err
	}
	p.pid = int(resp.GetPid())
	if p.pid <= 0 || !alive(p.pid) {
		return fmt.Errorf("StartSandbox answered pid %d, which does not run", p.pid)
	}
	return nil
}

func (s *suite) sandboxStartChecks() {
	err := s.check("sandbox.create", true, func(ctx context.Context) error {
		if err := s.needMain(); err != nil {
			return err
		}
		return s.createSandbox(ctx, s.main)
	})
	if err == nil {
		err = s.check("sandbox.start", true, func(ctx context.Context) error {
			if err := s.startSandbox(ctx, s.main); err != nil {
				return err
			}
			setDetail(ctx, "pid %d", s.main.pid)
			return nil
		})
	} else {
		_ = s.check("sandbox.start", false, func(context.Context) error { return fmt.Errorf("not checked: sandbox.create failed: %v", err) })
	}
	s.podErr = err
	_ = s.check("sandbox.status", false, func(ctx context.Context) error {
		if err := s.needPod(); err != nil {
			return err
		}
		resp, err := s.sandboxClient(s.main).SandboxStatus(ctx, &sandboxapi.SandboxStatusRequest{SandboxID: s.main.id, Verbose: true})
		if err != nil {
			return err
		}
		if resp.GetSandboxID() != s.main.id || int(resp.GetPid()) != s.main.pid {
			return fmt.Errorf("status names sandbox %q pid %d, want %q pid %d", resp.GetSandboxID(), resp.GetPid(), s.main.id, s.main.pid)
		}
		if resp.GetState() == "" {
			return errors.New("status has no state")
		}
		setDetail(ctx, "state %s", resp.GetState())
		return nil
	})
	_ = s.check("sandbox.ping", false, func(ctx context.Context) error {
		if err := s.needPod(); err != nil {
			return err
		}
		_, err := s.sandboxClient(s.main).PingSandbox(ctx, &sandboxapi.PingRequest{SandboxID: s.main.id})
		return err
	})
	_ = s.check("sandbox.platform", false, func(ctx context.Context) error {
		if err := s.needPod(); err != nil {
			return err
		}
		resp, err := s.sandboxClient(s.main).Platform(ctx, &sandboxapi.PlatformRequest{SandboxID: s.main.id})
		if err != nil {
			return err
		}
		p := resp.GetPlatform()
		if p.GetOS() != "linux" || p.GetArchitecture() != runtime.GOARCH {
			return fmt.Errorf("platform %s/%s, want linux/%s", p.GetOS(), p.GetArchitecture(), runtime.GOARCH)
		}
		setDetail(ctx, "%s/%s", p.GetOS(), p.GetArchitecture())
		return nil
	})
	_ = s.check("sandbox.metrics", false, func(ctx context.Context) error {
		if err := s.needPod(); err != nil {
			return err
		}
		resp, err := s.sandboxClient(s.main).SandboxMetrics(ctx, &sandboxapi.SandboxMetricsRequest{SandboxID: s.main.id})
		if err != nil {
			return err
		}
		what, err := decodeMetrics(resp.GetMetrics().GetData())
		if err != nil {
			return err
		}
		setDetail(ctx, "%s", what)
		return nil
	})
}

func (s *suite) sandboxEndChecks() {
	_ = s.check("sandbox.stop", false, func(ctx context.Context) error {
		if err := s.needPod(); err != nil {
			return err
		}
		if _, err := s.sandboxClient(s.main).StopSandbox(ctx, &sandboxapi.StopSandboxRequest{SandboxID: s.main.id, TimeoutSecs: 5}); err != nil {
			return err
		}
		if !waitGone(s.main.pid, 5*time.Second) {
			return fmt.Errorf("sandbox pid %d still runs after StopSandbox", s.main.pid)
		}
		return nil
	})
	_ = s.check("sandbox.wait", false, func(ctx context.Context) error {
		if err := s.needPod(); err != nil {
			return err
		}
		resp, err := s.sandboxClient(s.main).WaitSandbox(ctx, &sandboxapi.WaitSandboxRequest{SandboxID: s.main.id})
		if err != nil {
			return err
		}
		if resp.GetExitedAt() == nil {
			return errors.New("WaitSandbox returned no exit time")
		}
		setDetail(ctx, "exit status %d", resp.GetExitStatus())
		return nil
	})
	_ = s.check("sandbox.shutdown", false, func(ctx context.Context) error {
		if err := s.needPod(); err != nil {
			return err
		}
		if _, err := s.sandboxClient(s.main).ShutdownSandbox(ctx, &sandboxapi.ShutdownSandboxRequest{SandboxID: s.main.id}); err != nil {
			return err
		}
		if !waitGone(s.main.shim.pid, 5*time.Second) {
			return fmt.Errorf("shim pid %d still runs 5s after ShutdownSandbox", s.main.shim.pid)
		}
		return nil
	})
}

// startPauseContainer creates and starts the pod's sandbox container (task mode).
func (s *suite) startPauseContainer() error {
	if err := s.needMain(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	return s.startPause(ctx, s.main)
}

func (s *suite) startPause(ctx context.Context, p *pod) error {
	c := p.pause
	s.addCleanup(func() { s.removeContainer(p.shim, c) })
	req := &taskapi.CreateTaskRequest{ID: c.id, Bundle: c.bundle, Options: s.cfg.TaskOptions}
	req.Rootfs = overlayMount(s.lower, c.dir)
	if _, err := p.shim.tasks.Create(ctx, req); err != nil {
		return fmt.Errorf("create the sandbox container: %w", err)
	}
	resp, err := p.shim.tasks.Start(ctx, c.id, "")
	if err != nil {
		return fmt.Errorf("start the sandbox container: %w", err)
	}
	p.pid = int(resp.GetPid())
	c.pid = p.pid
	return nil
}

func (s *suite) checkTaskShutdown(ctx context.Context) error {
	if err := s.needPod(); err != nil {
		return err
	}
	t := s.main.shim.tasks
	// Every container is removed first (as a pod's are before its sandbox's), then
	// the sandbox container.
	for _, c := range s.main.containers {
		s.removeContainer(s.main.shim, c)
	}
	c := s.main.pause
	_ = t.Kill(ctx, c.id, uint32(unix.SIGKILL), true)
	if _, err := waitExit(ctx, t, c.id, ""); err != nil {
		return err
	}
	if _, err := t.Delete(ctx, c.id, ""); err != nil {
		return fmt.Errorf("delete the sandbox container: %w", err)
	}
	c.deleted = true
	if err := t.Shutdown(ctx, s.main.id); err != nil && !strings.Contains(err.Error(), "closed") {
		return fmt.Errorf("shutdown: %w", err)
	}
	if !waitGone(s.main.shim.pid, 5*time.Second) {
		return fmt.Errorf("shim pid %d still runs 5s after Shutdown with no task left", s.main.shim.pid)
	}
	return nil
}

// decodeMetrics decodes a cgroup v1 or v2 metrics Any, saying which.
func decodeMetrics(a *anypb.Any) (string, error) {
	if a == nil {
		return "", errors.New("no metrics")
	}
	name := a.GetTypeUrl()
	switch {
	case strings.HasSuffix(name, "io.containerd.cgroups.v1.Metrics"):
		var m cgroup1stats.Metrics
		if err := proto.Unmarshal(a.GetValue(), &m); err != nil {
			return "", fmt.Errorf("decode %s: %w", name, err)
		}
		if m.GetMemory() == nil && m.GetCPU() == nil && m.GetPids() == nil {
			return "", fmt.Errorf("%s has no memory, cpu or pids figures", name)
		}
		return fmt.Sprintf("cgroup v1 metrics, memory usage %d", m.GetMemory().GetUsage().GetUsage()), nil
	case strings.HasSuffix(name, "io.containerd.cgroups.v2.Metrics"):
		var m cgroup2stats.Metrics
		if err := proto.Unmarshal(a.GetValue(), &m); err != nil {
			return "", fmt.Errorf("decode %s: %w", name, err)
		}
		if m.GetMemory() == nil && m.GetCPU() == nil && m.GetPids() == nil {
			return "", fmt.Errorf("%s has no memory, cpu or pids figures", name)
		}
		return fmt.Sprintf("cgroup v2 metrics, memory usage %d", m.GetMemory().GetUsage()), nil
	}
	return "", fmt.Errorf("metrics of type %q, want io.containerd.cgroups.v1.Metrics or v2", name)
}

// memoryCgroup returns the memory cgroup path of pid (v1 memory controller, else v2).
func memoryCgroup(pid int) (root, path string, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return "", "", err
	}
	var v2 string
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, ctl := range strings.Split(parts[1], ",") {
			if ctl == "memory" {
				return "/sys/fs/cgroup/memory", parts[2], nil
			}
		}
		if parts[0] == "0" && parts[1] == "" {
			v2 = parts[2]
		}
	}
	if v2 != "" {
		for _, r := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
			if _, err := os.Stat(filepath.Join(r, "cgroup.controllers")); err == nil {
				return r, v2, nil
			}
		}
	}
	return "", "", errors.New("no memory cgroup")
}

func readLimit(root, path string) (int64, error) {
	file := "memory.limit_in_bytes"
	if !strings.HasSuffix(root, "/memory") {
		file = "memory.max"
	}
	data, err := os.ReadFile(filepath.Join(root, path, file))
	if err != nil {
		return 0, err
	}
	v := strings.TrimSpace(string(data))
	if v == "max" {
		return -1, nil
	}
	return strconv.ParseInt(v, 10, 64)
}

func resourcesAny(r *specs.LinuxResources) (*anypb.Any, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	return &anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources", Value: data}, nil
}

func sleeper() []string { return []string{"/bin/sleep", "1000"} }

// taskChecks checks the task API on the pod's shim: each check makes its own
// containers.
func (s *suite) taskChecks() {
	run := func(name string, fn func(ctx context.Context, p *pod) error) {
		_ = s.check(name, false, func(ctx context.Context) error {
			if err := s.needPod(); err != nil {
				return err
			}
			return fn(ctx, s.main)
		})
	}
	run("task.create", s.checkCreate)
	run("task.start", s.checkStart)
	run("task.exit-code", s.checkExitCode)
	run("task.state", s.checkState)
	run("task.pids", s.checkPids)
	run("task.kill", s.checkKill)
	run("task.kill-all", s.checkKillAll)
	run("task.exec", s.checkExec)
	run("task.tty", s.checkTTY)
	run("task.stdin", s.checkStdin)
	run("task.attach", s.checkAttach)
	run("task.stats", s.checkStats)
	run("task.update", s.checkUpdate)
	run("task.pause", s.checkPause)
	run("task.oom", s.checkOOM)
	run("task.delete", s.checkDelete)
	run("events.order", s.checkEvents)
	run("shim.reconnect", s.checkReconnect)
}

func (s *suite) checkCreate(ctx context.Context, p *pod) error {
	c, err := s.create(ctx, p, s.newID("create"), ctrOpts{args: sleeper()})
	if err != nil {
		return err
	}
	s.shared["created"] = c
	if c.pid <= 0 {
		return fmt.Errorf("create answered pid %d", c.pid)
	}
	st, err := p.shim.tasks.State(ctx, c.id, "")
	if err != nil {
		return fmt.Errorf("state after create: %w", err)
	}
	if st.GetStatus() != tasktypes.Status_CREATED {
		return fmt.Errorf("state after create is %s, want CREATED", st.GetStatus())
	}
	setDetail(ctx, "pid %d", c.pid)
	return nil
}

func (s *suite) checkStart(ctx context.Context, p *pod) error {
	c := s.shared["created"]
	if c == nil {
		return errors.New("not checked: task.create failed")
	}
	resp, err := p.shim.tasks.Start(ctx, c.id, "")
	if err != nil {
		return err
	}
	if int(resp.GetPid()) != c.pid {
		return fmt.Errorf("start answered pid %d, create %d", resp.GetPid(), c.pid)
	}
	st, err := p.shim.tasks.State(ctx, c.id, "")
	if err != nil {
		return fmt.Errorf("state after start: %w", err)
	}
	if st.GetStatus() != tasktypes.Status_RUNNING {
		return fmt.Errorf("state after start is %s, want RUNNING", st.GetStatus())
	}
	setDetail(ctx, "pid %d", c.pid)
	return nil
}

func (s *suite) checkExitCode(ctx context.Context, p *pod) error {
	c, err := s.createStarted(ctx, p, s.newID("exit"), ctrOpts{args: []string{"/bin/sh", "-c", "exit 3"}})
	if err != nil {
		return err
	}
	s.shared["exited"] = c
	w, err := waitExit(ctx, p.shim.tasks, c.id, "")
	if err != nil {
		return err
	}
	if w.GetExitStatus() != 3 || w.GetExitedAt() == nil {
		return fmt.Errorf("wait: exit status %d (exited at %v), want 3", w.GetExitStatus(), w.GetExitedAt())
	}
	return nil
}

func (s *suite) checkState(ctx context.Context, p *pod) error {
	t := p.shim.tasks
	c, err := s.createStarted(ctx, p, s.newID("state"), ctrOpts{args: sleeper()})
	if err != nil {
		return err
	}
	st, err := t.State(ctx, c.id, "")
	if err != nil {
		return err
	}
	if st.GetID() != c.id || st.GetStatus() != tasktypes.Status_RUNNING || int(st.GetPid()) != c.pid || st.GetBundle() != c.bundle {
		return fmt.Errorf("state of a running task: id %q status %s pid %d bundle %q; want %q RUNNING %d %q",
			st.GetID(), st.GetStatus(), st.GetPid(), st.GetBundle(), c.id, c.pid, c.bundle)
	}
	if err := t.Kill(ctx, c.id, uint32(unix.SIGKILL), false); err != nil {
		return err
	}
	if _, err := waitExit(ctx, t, c.id, ""); err != nil {
		return err
	}
	st, err = t.State(ctx, c.id, "")
	if err != nil {
		return err
	}
	if st.GetStatus() != tasktypes.Status_STOPPED || st.GetExitStatus() != 137 || st.GetExitedAt() == nil {
		return fmt.Errorf("state of a killed task: status %s exit %d exited_at %v; want STOPPED 137", st.GetStatus(), st.GetExitStatus(), st.GetExitedAt())
	}
	return nil
}

// pidsOf polls Pids until it lists at least n processes.
func pidsOf(ctx context.Context, t *taskClient, id string, n int) ([]uint32, error) {
	for {
		resp, err := t.Pids(ctx, id)
		if err != nil {
			return nil, err
		}
		var pids []uint32
		for _, pi := range resp.GetProcesses() {
			pids = append(pids, pi.GetPid())
		}
		if len(pids) >= n {
			return pids, nil
		}
		select {
		case <-ctx.Done():
			return pids, fmt.Errorf("pids lists %v, want at least %d", pids, n)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (s *suite) checkPids(ctx context.Context, p *pod) error {
	c, err := s.createStarted(ctx, p, s.newID("pids"), ctrOpts{args: []string{"/bin/sh", "-c", "sleep 1000 & sleep 1000 & wait"}})
	if err != nil {
		return err
	}
	pids, err := pidsOf(ctx, p.shim.tasks, c.id, 3)
	if err != nil {
		return err
	}
	found := false
	for _, pid := range pids {
		found = found || int(pid) == c.pid
	}
	if !found {
		return fmt.Errorf("pids %v do not include the init pid %d", pids, c.pid)
	}
	setDetail(ctx, "%d processes", len(pids))
	return nil
}

func (s *suite) checkKill(ctx context.Context, p *pod) error {
	t := p.shim.tasks
	c, err := s.createStarted(ctx, p, s.newID("kill"), ctrOpts{args: sleeper()})
	if err != nil {
		return err
	}
	if err := t.Kill(ctx, c.id, uint32(unix.SIGTERM), false); err != nil {
		return err
	}
	w, err := waitExit(ctx, t, c.id, "")
	if err != nil {
		return err
	}
	if w.GetExitStatus() != 128+uint32(unix.SIGTERM) {
		return fmt.Errorf("SIGTERM to sleep: exit status %d, want 143", w.GetExitStatus())
	}
	return nil
}

func (s *suite) checkKillAll(ctx context.Context, p *pod) error {
	t := p.shim.tasks
	c, err := s.createStarted(ctx, p, s.newID("killall"), ctrOpts{args: []string{"/bin/sh", "-c", "sleep 1000 & sleep 1000 & wait"}})
	if err != nil {
		return err
	}
	pids, err := pidsOf(ctx, t, c.id, 3)
	if err != nil {
		return err
	}
	if err := t.Kill(ctx, c.id, uint32(unix.SIGKILL), true); err != nil {
		return err
	}
	w, err := waitExit(ctx, t, c.id, "")
	if err != nil {
		return err
	}
	if w.GetExitStatus() != 137 {
		return fmt.Errorf("exit status %d after SIGKILL to all, want 137", w.GetExitStatus())
	}
	for _, pid := range pids {
		if inCgroup(int(pid), c.spec.Linux.CgroupsPath) && !waitGone(int(pid), 2*time.Second) {
			return fmt.Errorf("process %d of the container still runs", pid)
		}
	}
	return nil
}

// inCgroup reports whether pid lives in a cgroup whose path ends in path.
func inCgroup(pid int, path string) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	return err == nil && strings.Contains(string(data), path)
}

func (s *suite) exec(ctx context.Context, p *pod, c *container, execID string, terminal, stdin bool, args ...string) (*collector, string, error) {
	spec, err := processSpec(c, terminal, args...)
	if err != nil {
		return nil, "", err
	}
	base := filepath.Join(c.dir, execID)
	out, err := newCollector(base + ".out")
	if err != nil {
		return nil, "", err
	}
	s.addCleanup(out.close)
	req := &taskapi.ExecProcessRequest{ID: c.id, ExecID: execID, Terminal: terminal, Stdout: base + ".out", Spec: spec}
	if !terminal {
		req.Stderr = base + ".err"
		errOut, err := newCollector(req.Stderr)
		if err != nil {
			return nil, "", err
		}
		s.addCleanup(errOut.close)
	}
	if stdin {
		req.Stdin = base + ".in"
		if err := unix.Mkfifo(req.Stdin, 0o600); err != nil {
			return nil, "", err
		}
	}
	if err := p.shim.tasks.Exec(ctx, req); err != nil {
		return nil, "", fmt.Errorf("exec: %w", err)
	}
	if _, err := p.shim.tasks.Start(ctx, c.id, execID); err != nil {
		return nil, "", fmt.Errorf("start exec: %w", err)
	}
	return out, req.Stdin, nil
}

func (s *suite) checkExec(ctx context.Context, p *pod) error {
	t := p.shim.tasks
	c, err := s.createStarted(ctx, p, s.newID("exec"), ctrOpts{args: sleeper()})
	if err != nil {
		return err
	}
	out, _, err := s.exec(ctx, p, c, "e1", false, false, "/bin/sh", "-c", "echo hello-exec; exit 5")
	if err != nil {
		return err
	}
	w, err := waitExit(ctx, t, c.id, "e1")
	if err != nil {
		return err
	}
	if w.GetExitStatus() != 5 {
		return fmt.Errorf("exec exit status %d, want 5", w.GetExitStatus())
	}
	if _, err := out.waitFor(ctx, "hello-exec\n"); err != nil {
		return err
	}
	d, err := t.Delete(ctx, c.id, "e1")
	if err != nil {
		return fmt.Errorf("delete exec: %w", err)
	}
	if d.GetExitStatus() != 5 {
		return fmt.Errorf("delete exec: exit status %d, want 5", d.GetExitStatus())
	}
	return nil
}

func (s *suite) checkTTY(ctx context.Context, p *pod) error {
	t := p.shim.tasks
	c, err := s.createStarted(ctx, p, s.newID("tty"), ctrOpts{args: sleeper()})
	if err != nil {
		return err
	}
	out, stdin, err := s.exec(ctx, p, c, "t1", true, true, "/bin/sh", "-c", "echo ready; read x; stty size")
	if err != nil {
		return err
	}
	in, err := openWriter(ctx, stdin)
	if err != nil {
		return err
	}
	defer in.Close()
	if _, err := out.waitFor(ctx, "ready"); err != nil {
		return fmt.Errorf("terminal output: %w", err)
	}
	if err := t.ResizePty(ctx, c.id, "t1", 100, 40); err != nil {
		return fmt.Errorf("resize: %w", err)
	}
	if _, err := in.WriteString("go\n"); err != nil {
		return err
	}
	if _, err := out.waitFor(ctx, "40 100"); err != nil {
		return fmt.Errorf("after ResizePty 100x40: %w", err)
	}
	w, err := waitExit(ctx, t, c.id, "t1")
	if err != nil {
		return err
	}
	if w.GetExitStatus() != 0 {
		return fmt.Errorf("exit status %d, want 0", w.GetExitStatus())
	}
	_, _ = t.Delete(ctx, c.id, "t1")
	return nil
}

func (s *suite) checkStdin(ctx context.Context, p *pod) error {
	t := p.shim.tasks
	c, err := s.createStarted(ctx, p, s.newID("stdin"), ctrOpts{args: []string{"/bin/cat"}, stdin: true, stdout: true})
	if err != nil {
		return err
	}
	in, err := openWriter(ctx, c.stdin)
	if err != nil {
		return err
	}
	_, err = in.WriteString("hello-stdin\n")
	_ = in.Close()
	if err != nil {
		return err
	}
	if _, err := c.out.waitFor(ctx, "hello-stdin\n"); err != nil {
		return err
	}
	if err := t.CloseIO(ctx, c.id, ""); err != nil {
		return fmt.Errorf("close stdin: %w", err)
	}
	w, err := waitExit(ctx, t, c.id, "")
	if err != nil {
		return err
	}
	if w.GetExitStatus() != 0 {
		return fmt.Errorf("cat exited %d after CloseIO, want 0", w.GetExitStatus())
	}
	return nil
}

func (s *suite) checkAttach(ctx context.Context, p *pod) error {
	c, err := s.createStarted(ctx, p, s.newID("attach"), ctrOpts{args: []string{"/bin/sh", "-c", "while :; do echo tick; sleep 0.1; done"}})
	if err != nil {
		return err
	}
	out, err := newCollector(filepath.Join(c.dir, "attach.out"))
	if err != nil {
		return err
	}
	defer out.close()
	_, err = shimapi.NewClient(p.shim.client).Attach(ctx, &optionsv1.AttachRequest{ContainerId: c.id, Stdout: filepath.Join(c.dir, "attach.out")})
	if err != nil {
		if isUnimplemented(err) {
			return unsupported("crisp.shim.v1.Shim/Attach: %v", err)
		}
		return err
	}
	_, err = out.waitFor(ctx, "tick\n")
	return err
}

func (s *suite) checkStats(ctx context.Context, p *pod) error {
	c, err := s.createStarted(ctx, p, s.newID("stats"), ctrOpts{args: sleeper()})
	if err != nil {
		return err
	}
	resp, err := p.shim.tasks.Stats(ctx, c.id)
	if err != nil {
		return err
	}
	what, err := decodeMetrics(resp.GetStats())
	if err != nil {
		return err
	}
	setDetail(ctx, "%s", what)
	return nil
}

func (s *suite) checkUpdate(ctx context.Context, p *pod) error {
	c, err := s.createStarted(ctx, p, s.newID("update"), ctrOpts{args: sleeper()})
	if err != nil {
		return err
	}
	limit := int64(48 << 20)
	res, err := resourcesAny(&specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}})
	if err != nil {
		return err
	}
	if err := p.shim.tasks.Update(ctx, &taskapi.UpdateTaskRequest{ID: c.id, Resources: res}); err != nil {
		return err
	}
	root, path, err := memoryCgroup(c.pid)
	if err != nil || !strings.HasSuffix(path, c.spec.Linux.CgroupsPath) {
		setDetail(ctx, "limit not checked: pid %d is not in the spec's cgroup %s (%s): no host cgroup per container", c.pid, c.spec.Linux.CgroupsPath, path)
		return nil
	}
	got, err := readLimit(root, path)
	if err != nil {
		return err
	}
	if got != limit {
		return fmt.Errorf("memory limit in %s is %d after Update, want %d", filepath.Join(root, path), got, limit)
	}
	setDetail(ctx, "memory limit %d in %s", got, path)
	return nil
}

func (s *suite) checkPause(ctx context.Context, p *pod) error {
	t := p.shim.tasks
	c, err := s.createStarted(ctx, p, s.newID("pause"), ctrOpts{args: sleeper()})
	if err != nil {
		return err
	}
	if err := t.Pause(ctx, c.id); err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	st, err := t.State(ctx, c.id, "")
	if err != nil {
		return err
	}
	if st.GetStatus() != tasktypes.Status_PAUSED {
		return fmt.Errorf("state after Pause is %s, want PAUSED", st.GetStatus())
	}
	if err := t.Resume(ctx, c.id); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	if st, err = t.State(ctx, c.id, ""); err != nil {
		return err
	}
	if st.GetStatus() != tasktypes.Status_RUNNING {
		return fmt.Errorf("state after Resume is %s, want RUNNING", st.GetStatus())
	}
	return nil
}

func (s *suite) checkOOM(ctx context.Context, p *pod) error {
	// dd fills a 64 MiB buffer: killed under a 24 MiB limit, and bounded (and quick)
	// where the limit is not enforced.
	c, err := s.createStarted(ctx, p, s.newID("oom"), ctrOpts{
		args:   []string{"/bin/dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"},
		memory: 24 << 20,
	})
	if err != nil {
		return err
	}
	w, err := waitExit(ctx, p.shim.tasks, c.id, "")
	if err != nil {
		return err
	}
	if w.GetExitStatus() != 137 {
		return fmt.Errorf("a memory hog under a 24 MiB limit exited %d, want 137", w.GetExitStatus())
	}
	if !s.events.waitFor(c.id, "/tasks/oom", 3*time.Second) {
		return errors.New("exit 137, but no /tasks/oom event for the container")
	}
	return nil
}

func (s *suite) checkDelete(ctx context.Context, p *pod) error {
	t := p.shim.tasks
	c := s.shared["exited"]
	if c == nil {
		var err error
		if c, err = s.createStarted(ctx, p, s.newID("delete"), ctrOpts{args: []string{"/bin/sh", "-c", "exit 3"}}); err != nil {
			return err
		}
		if _, err := waitExit(ctx, t, c.id, ""); err != nil {
			return err
		}
	}
	d, err := t.Delete(ctx, c.id, "")
	if err != nil {
		return err
	}
	c.deleted = true
	if d.GetExitStatus() != 3 || d.GetExitedAt() == nil {
		return fmt.Errorf("delete answered exit status %d (exited at %v), want 3", d.GetExitStatus(), d.GetExitedAt())
	}
	if _, err := t.State(ctx, c.id, ""); err == nil || !isNotFound(err) {
		return fmt.Errorf("state after delete: %v, want NotFound", err)
	}
	if mounted(filepath.Join(c.bundle, "rootfs")) {
		return errors.New("the rootfs is still mounted after delete")
	}
	return nil
}

func (s *suite) checkEvents(ctx context.Context, p *pod) error {
	t := p.shim.tasks
	c, err := s.createStarted(ctx, p, s.newID("events"), ctrOpts{args: sleeper()})
	if err != nil {
		return err
	}
	if _, _, err := s.exec(ctx, p, c, "ev1", false, false, "/bin/true"); err != nil {
		return err
	}
	if _, err := waitExit(ctx, t, c.id, "ev1"); err != nil {
		return err
	}
	_, _ = t.Delete(ctx, c.id, "ev1")
	if err := t.Kill(ctx, c.id, uint32(unix.SIGKILL), false); err != nil {
		return err
	}
	if _, err := waitExit(ctx, t, c.id, ""); err != nil {
		return err
	}
	if _, err := t.Delete(ctx, c.id, ""); err != nil {
		return err
	}
	c.deleted = true
	want := []string{"/tasks/create", "/tasks/start", "/tasks/exec-added", "/tasks/exec-started", "/tasks/exit", "/tasks/delete"}
	s.events.waitFor(c.id, "/tasks/delete", 3*time.Second)
	var got []string
	for _, ev := range s.events.of(c.id) {
		got = append(got, ev.topic)
	}
	i := 0
	for _, topic := range got {
		if i < len(want) && topic == want[i] {
			i++
		}
	}
	if i < len(want) {
		return fmt.Errorf("events for the container: %v; want %v in this order (missing from %s)", got, want, want[i])
	}
	setDetail(ctx, "%s", strings.Join(got, " "))
	return nil
}

func (s *suite) checkReconnect(ctx context.Context, p *pod) error {
	c, err := s.createStarted(ctx, p, s.newID("reconnect"), ctrOpts{args: sleeper()})
	if err != nil {
		return err
	}
	// A first client waits on the container and goes away, as a restarted containerd.
	first, _, err := dial(ctx, p.shim.answer.address)
	if err != nil {
		return err
	}
	waited := make(chan error, 1)
	go func() {
		_, err := newTaskClient(first, p.shim.answer.version).Wait(ctx, c.id, "")
		waited <- err
	}()
	time.Sleep(50 * time.Millisecond)
	_ = first.Close()
	<-waited
	second, _, err := dial(ctx, p.shim.answer.address)
	if err != nil {
		return fmt.Errorf("second dial: %w", err)
	}
	defer second.Close()
	t := newTaskClient(second, p.shim.answer.version)
	st, err := t.State(ctx, c.id, "")
	if err != nil {
		return fmt.Errorf("state on a new connection: %w", err)
	}
	if st.GetStatus() != tasktypes.Status_RUNNING || int(st.GetPid()) != c.pid {
		return fmt.Errorf("state on a new connection: %s pid %d, want RUNNING %d", st.GetStatus(), st.GetPid(), c.pid)
	}
	if err := t.Kill(ctx, c.id, uint32(unix.SIGKILL), false); err != nil {
		return err
	}
	w, err := waitExit(ctx, t, c.id, "")
	if err != nil {
		return err
	}
	if w.GetExitStatus() != 137 {
		return fmt.Errorf("wait on a new connection: exit status %d, want 137", w.GetExitStatus())
	}
	return nil
}

// checkShimDelete kills a second pod's shim with SIGKILL while a container runs, and
// runs `shim delete` as containerd does after a dead shim: for the pod (sandbox mode),
// for each task (task mode).
func (s *suite) checkShimDelete(ctx context.Context) error {
	p, err := s.newPod(s.newID("dpod"))
	if err != nil {
		return err
	}
	sh, err := s.startShim(ctx, p.id, p.bundle, false)
	if err != nil {
		return err
	}
	p.shim = sh
	if s.cfg.Mode == ModeSandbox {
		if err := s.createSandbox(ctx, p); err != nil {
			return err
		}
		if err := s.startSandbox(ctx, p); err != nil {
			return err
		}
	} else if err := s.startPause(ctx, p); err != nil {
		return err
	}
	c, err := s.createStarted(ctx, p, s.newID("dctr"), ctrOpts{args: sleeper()})
	if err != nil {
		return err
	}
	pids := []int{p.pid, c.pid}
	if err := unix.Kill(sh.pid, unix.SIGKILL); err != nil {
		return err
	}
	if !waitGone(sh.pid, 5*time.Second) {
		return fmt.Errorf("shim %d survived SIGKILL", sh.pid)
	}
	_ = sh.client.Close()
	c.deleted = true
	var answers []string
	if s.cfg.Mode == ModeTask {
		d, err := s.runDelete(ctx, c.id, c.bundle)
		if err != nil {
			return fmt.Errorf("%s: %w", c.id, err)
		}
		answers = append(answers, fmt.Sprintf("%s exit %d", c.id, d.GetExitStatus()))
	}
	d, err := s.runDelete(ctx, p.id, p.bundle)
	if err != nil {
		return fmt.Errorf("%s: %w", p.id, err)
	}
	sh.stopped = true
	if p.pause != nil {
		p.pause.deleted = true
	}
	answers = append(answers, fmt.Sprintf("%s exit %d", p.id, d.GetExitStatus()))
	for _, pid := range pids {
		if pid > 0 && !waitGone(pid, 5*time.Second) {
			return fmt.Errorf("process %d of the pod still runs after shim delete", pid)
		}
	}
	if _, err := os.Stat(socketPath(sh.answer.address)); err == nil {
		return fmt.Errorf("socket %s is still there after shim delete", sh.answer.address)
	}
	setDetail(ctx, "%s", strings.Join(answers, ", "))
	return nil
}

func overlayMount(lower, dir string) []*types.Mount {
	return []*types.Mount{{
		Type:   "overlay",
		Source: "overlay",
		Options: []string{
			"lowerdir=" + lower,
			"upperdir=" + filepath.Join(dir, "upper"),
			"workdir=" + filepath.Join(dir, "work"),
		},
	}}
}
