package e2e

// The fault-injection suite (issue 12, item 5 a, b, e, f): criserver killed with
// SIGKILL under load, shims killed under running pods, criserver killed in the middle
// of CreateContainer and PullImage, and leak accounting after each. The counts are
// small by default, so that `make test` runs these quickly and without flaking;
// `make chaos` runs them with -chaos.scale (or CRISP_CHAOS_SCALE) > 1.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
)

var (
	chaosScaleFlag      = flag.Int("chaos.scale", 0, "chaos suite scale: 1 is the small run of `make test`, more multiplies the counts (default $CRISP_CHAOS_SCALE or 1)")
	chaosClientsFlag    = flag.Int("chaos.clients", 0, "parallel CRI clients while criserver is killed (default 3, 6 at scale > 1)")
	chaosKillsFlag      = flag.Int("chaos.kills", 0, "SIGKILLs of criserver under load (default 5 x scale)")
	chaosKillMinFlag    = flag.Duration("chaos.kill-min", 0, "shortest time between two kills (default 1s)")
	chaosKillMaxFlag    = flag.Duration("chaos.kill-max", 0, "longest time between two kills (default 4s)")
	chaosShimPodsFlag   = flag.Int("chaos.shim-pods", 0, "pods whose shim is killed, half with criserver down (default 4 x scale)")
	chaosIterationsFlag = flag.Int("chaos.iterations", 0, "kills during CreateContainer and during PullImage, each (default 6 x scale)")
)

// chaosCounts is how much each chaos test does.
type chaosCounts struct {
	scale, clients, kills int
	killMin, killMax      time.Duration
	shimPods, iterations  int
}

func chaosConfig() chaosCounts {
	scale := *chaosScaleFlag
	if scale <= 0 {
		scale, _ = strconv.Atoi(os.Getenv("CRISP_CHAOS_SCALE"))
	}
	scale = max(scale, 1)
	c := chaosCounts{scale: scale, clients: 3, kills: 5 * scale, killMin: time.Second, killMax: 4 * time.Second,
		shimPods: 4 * scale, iterations: 6 * scale}
	if scale > 1 {
		c.clients = 6
	}
	if *chaosClientsFlag > 0 {
		c.clients = *chaosClientsFlag
	}
	if *chaosKillsFlag > 0 {
		c.kills = *chaosKillsFlag
	}
	if *chaosKillMinFlag > 0 {
		c.killMin = *chaosKillMinFlag
	}
	if *chaosKillMaxFlag > 0 {
		c.killMax = *chaosKillMaxFlag
	}
	c.killMax = max(c.killMax, c.killMin)
	if *chaosShimPodsFlag > 0 {
		c.shimPods = *chaosShimPodsFlag
	}
	if *chaosIterationsFlag > 0 {
		c.iterations = *chaosIterationsFlag
	}
	return c
}

// chaosCtx bounds a chaos test: longer at a larger scale.
func chaosCtx(t *testing.T, c chaosCounts) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(c.scale)*5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// chaosFastConnect makes a client reconnect within ~100 ms of criserver coming back, instead
// of gRPC's default backoff (1 s, growing to 2 min).
var chaosFastConnect = grpc.WithConnectParams(grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.5, Jitter: 0.2, MaxDelay: 100 * time.Millisecond},
	MinConnectTimeout: 2 * time.Second,
})

// chaosStartOnce is e.start with chaosFastConnect, so that a restart after kill -9
// (which leaves the old socket file behind) does not wait out gRPC's first backoff
// step. It fails when criserver exits before it answers, or does not answer in 30 s.
func (e *env) chaosStartOnce() error {
	logf, err := os.OpenFile(e.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(binDir, "criserver"), "--config", e.cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	e.cmd = cmd
	conn, err := grpc.NewClient("unix://"+e.socket, grpc.WithTransportCredentials(insecure.NewCredentials()), chaosFastConnect)
	if err != nil {
		return err
	}
	e.conn = conn
	e.rt = cri.NewRuntimeServiceClient(conn)
	e.img = cri.NewImageServiceClient(conn)
	for deadline := time.Now().Add(30 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err := e.rt.Version(ctx, &cri.VersionRequest{}, grpc.WaitForReady(true))
		cancel()
		switch {
		case err == nil:
			return nil
		case !alive(cmd.Process.Pid):
			return fmt.Errorf("criserver pid %d exited while starting (before it answered)", cmd.Process.Pid)
		case time.Now().After(deadline):
			return fmt.Errorf("criserver does not answer 30 s after a start: %v", err)
		}
	}
}

// chaosStart starts criserver; the test fails if it does not come up.
func (e *env) chaosStart(t *testing.T) {
	t.Helper()
	if err := e.chaosStartOnce(); err != nil {
		t.Fatalf("%v\n%s", err, e.log())
	}
}

// chaosEnv is newEnv started with chaosStart, plus a last cleanup (after the env's
// own) that kills what is left in the env's cgroups and removes them: a test that
// exposes a runtime leaking a container's processes or cgroups must not leave them on
// the node. It only touches processes inside the env's own cgroup parent.
func chaosEnv(t *testing.T) *env {
	t.Helper()
	var e *env
	t.Cleanup(func() {
		if e != nil {
			e.chaosSweep(t)
		}
	})
	e = newEnv(t)
	// CRISP_CHAOS_KEEP_LOGS=DIR keeps criserver's whole log of a failed chaos test
	// (the env prints only its tail).
	if dir := os.Getenv("CRISP_CHAOS_KEEP_LOGS"); dir != "" {
		t.Cleanup(func() {
			if data, err := os.ReadFile(e.logPath); err == nil && t.Failed() {
				path := filepath.Join(dir, fmt.Sprintf("%s-%s.log", t.Name(), time.Now().Format("150405")))
				if os.WriteFile(path, data, 0o600) == nil {
					t.Logf("criserver's whole log: %s", path)
				}
			}
		})
	}
	e.chaosStart(t)
	return e
}

func (e *env) chaosSweep(t *testing.T) {
	killed, removed := 0, 0
	for range 3 {
		for _, p := range e.leakCgroupProcs() {
			pidStr, _, _ := strings.Cut(p, ":")
			if pid, err := strconv.Atoi(pidStr); err == nil && pid > 1 && syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed++
			}
		}
		time.Sleep(50 * time.Millisecond)
		for ctrl, dirs := range e.leakCgroupTree() {
			// Deepest first.
			sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
			for _, d := range dirs {
				if os.Remove(filepath.Join("/sys/fs/cgroup", ctrl, e.cgroup, d)) == nil {
					removed++
				}
			}
		}
		left := 0
		for _, dirs := range e.leakCgroupTree() {
			left += len(dirs)
		}
		if left == 0 {
			break
		}
	}
	for _, ctrl := range append(cgroupControllers(), "unified") {
		_ = os.Remove(filepath.Join("/sys/fs/cgroup", ctrl, e.cgroup))
	}
	rules := e.chaosSweepIptables()
	if killed+removed+rules > 0 {
		t.Logf("swept after the test: %d processes killed, %d cgroups and %d iptables rules removed (left by the runtime)", killed, removed, rules)
	}
}

// chaosSweepIptables deletes the iptables rules and per-pod chains of the env's
// subnet (leakIptablesRules) that leaked pods left, and returns how many rules.
func (e *env) chaosSweepIptables() int {
	rules := e.leakIptablesRules()
	if len(rules) == 0 || strings.HasPrefix(rules[0], "iptables-save failed") {
		return 0
	}
	type tableOps struct{ del, flush []string }
	ops := map[string]*tableOps{}
	for _, r := range rules {
		table, rule, _ := strings.Cut(r, " ")
		if ops[table] == nil {
			ops[table] = &tableOps{}
		}
		o := ops[table]
		switch {
		case strings.HasPrefix(rule, ":"):
			chain, _, _ := strings.Cut(rule[1:], " ")
			o.flush = append(o.flush, chain)
		case strings.HasPrefix(rule, "-A "):
			chain, _, _ := strings.Cut(rule[3:], " ")
			if !leakCNIChain.MatchString(chain) {
				o.del = append(o.del, "-D "+rule[3:])
			}
		}
	}
	var in strings.Builder
	for table, o := range ops {
		fmt.Fprintf(&in, "*%s\n", table)
		for _, d := range o.del {
			fmt.Fprintln(&in, d)
		}
		for _, c := range o.flush {
			fmt.Fprintf(&in, "-F %s\n", c)
		}
		for _, c := range o.flush {
			fmt.Fprintf(&in, "-X %s\n", c)
		}
		fmt.Fprintln(&in, "COMMIT")
	}
	cmd := exec.Command("iptables-restore", "--noflush")
	cmd.Stdin = strings.NewReader(in.String())
	if err := cmd.Run(); err != nil {
		return 0
	}
	return len(rules)
}

// chaosDaemon counts kills of criserver and the times it died by itself.
type chaosDaemon struct {
	kills   int
	crashes []string
}

// kill9 kills criserver with SIGKILL and records whether it was still running: a
// process that exited before the kill (a panic exits with status 2) is a crash.
func (d *chaosDaemon) kill9(e *env) {
	d.kills++
	d.reap(e)
}

// reap kills criserver if it still runs, waits for it and records a crash if it had
// exited by itself.
func (d *chaosDaemon) reap(e *env) {
	cmd := e.cmd
	// The process first, then the client connection: a call in flight must be cut by
	// the death, not cancelled a moment before it.
	if cmd != nil {
		_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
	}
	e.kill9()
	if cmd != nil && cmd.ProcessState != nil {
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && !(ws.Signaled() && ws.Signal() == syscall.SIGKILL) {
			d.crashes = append(d.crashes, fmt.Sprintf("criserver pid %d exited by itself: %v", cmd.Process.Pid, cmd.ProcessState))
		}
	}
}

// restart starts criserver after a kill. One that dies while starting (a panic in
// recovery, or just after it) is recorded as a crash and started again, up to three
// times, so that the test goes on and reports every crash.
func (d *chaosDaemon) restart(t *testing.T, e *env) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		err := e.chaosStartOnce()
		if err == nil {
			return
		}
		d.reap(e)
		if attempt == 3 {
			t.Fatalf("criserver does not come up after a kill (3 attempts): %v\n%s", err, e.log())
		}
	}
}

// chaosPanics lists the panics and fatal runtime errors in criserver's whole log
// (every run of this env), each with the line after it.
func (e *env) chaosPanics() []string {
	data, _ := os.ReadFile(e.logPath)
	lines := strings.Split(string(data), "\n")
	var out []string
	for i, l := range lines {
		if strings.Contains(l, "panic:") || strings.HasPrefix(l, "fatal error:") {
			s := l
			for j := i + 1; j < len(lines) && j < i+12; j++ {
				s += "\n" + lines[j]
			}
			out = append(out, s)
		}
	}
	return out
}

// chaosCheckDaemon fails the test for every crash and panic of criserver and returns
// how many there were.
func (e *env) chaosCheckDaemon(t *testing.T, d *chaosDaemon) int {
	t.Helper()
	if e.cmd != nil && !alive(e.cmd.Process.Pid) {
		d.crashes = append(d.crashes, fmt.Sprintf("criserver pid %d is not running at the end", e.cmd.Process.Pid))
	}
	panics := e.chaosPanics()
	for _, c := range d.crashes {
		t.Errorf("daemon crash: %s", c)
	}
	for _, p := range panics {
		t.Errorf("daemon panic in criserver's log:\n%s", p)
	}
	return max(len(panics), len(d.crashes))
}

// chaosWarmUp runs one pod with a container and an exec and removes it, so that what
// the first pod creates for good (the bridge, the cgroup parent, IPAM's
// last_reserved_ip, state_dir/exec, criserver's idle threads) is in the leak baseline.
func (e *env) chaosWarmUp(t *testing.T, ctx context.Context, img string) {
	t.Helper()
	pod := e.podConfig("warmup")
	id := e.runPod(ctx, pod)
	ctr := e.runCtr(ctx, id, pod, ctrConfig("warmup", img, "sleep", "1000"))
	if resp, err := e.execSync(ctx, ctr, 10, "echo", "warm"); err != nil || string(resp.Stdout) != "warm\n" {
		t.Fatalf("warm-up exec: %v %v", resp, err)
	}
	e.stopRemove(ctx, t, id)
}

// chaosCtrPid is the host pid of a container's init (ContainerStatus verbose info).
func chaosCtrPid(ctx context.Context, rt cri.RuntimeServiceClient, id string) (int, error) {
	resp, err := rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		return 0, err
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(resp.Info["info"]), &info); err != nil || info.Pid == 0 {
		return 0, fmt.Errorf("no pid in the verbose info of %s: %v %q", id, err, resp.Info["info"])
	}
	return info.Pid, nil
}

// chaosProcStart is a process's start time (field 22 of /proc/PID/stat), so that a pid
// reused by another process is not taken for the same one.
func chaosProcStart(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

// chaosSleeper is a container command that runs until it is stopped and exits 0 on SIGTERM.
var chaosSleeper = []string{"sh", "-c", "trap 'exit 0' TERM; sleep 100000 & wait"}

// chaosWitness is a pod with a running container that must live through everything.
type chaosWitness struct {
	name, pod, ctr, ip     string
	pausePid, shimPid      int
	pauseStart, shimStart  string
	ctrPid                 int
	ctrStart               string
	info                   podInfo
	survived, checks       int
	firstFailure, lastSeen string
}

func (e *env) newChaosWitness(t *testing.T, ctx context.Context, name, img string) *chaosWitness {
	t.Helper()
	cfg := e.podConfig(name)
	w := &chaosWitness{name: name}
	w.pod = e.runPod(ctx, cfg)
	w.ctr = e.runCtr(ctx, w.pod, cfg, ctrConfig(name, img, chaosSleeper...))
	st, info := e.status(ctx, w.pod)
	w.info, w.ip = info, st.GetNetwork().GetIp()
	w.pausePid, w.shimPid = info.Pid, info.ShimPid
	w.pauseStart, w.shimStart = chaosProcStart(info.Pid), chaosProcStart(info.ShimPid)
	pid, err := chaosCtrPid(ctx, e.rt, w.ctr)
	if err != nil {
		t.Fatal(err)
	}
	w.ctrPid, w.ctrStart = pid, chaosProcStart(pid)
	if w.ip == "" || w.pauseStart == "" || w.shimStart == "" || w.ctrStart == "" {
		t.Fatalf("witness %s: ip %q, pause %d, shim %d, container %d", name, w.ip, w.pausePid, w.shimPid, w.ctrPid)
	}
	return w
}

// check verifies the witness is as it was: READY with the same IP, the same pause,
// shim and container processes (pid and start time), the container RUNNING and
// answering an exec. It records the first failure.
func (w *chaosWitness) check(ctx context.Context, rt cri.RuntimeServiceClient) {
	w.checks++
	var problems []string
	resp, err := rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: w.pod, Verbose: true})
	if err != nil {
		problems = append(problems, fmt.Sprintf("PodSandboxStatus: %v", err))
	} else {
		var info podInfo
		_ = json.Unmarshal([]byte(resp.Info["info"]), &info)
		if resp.Status.State != cri.PodSandboxState_SANDBOX_READY {
			problems = append(problems, fmt.Sprintf("pod %v", resp.Status.State))
		}
		if ip := resp.Status.GetNetwork().GetIp(); ip != w.ip {
			problems = append(problems, fmt.Sprintf("IP %q, was %q", ip, w.ip))
		}
		if info.Pid != w.pausePid || info.ShimPid != w.shimPid {
			problems = append(problems, fmt.Sprintf("pause/shim pid %d/%d, were %d/%d", info.Pid, info.ShimPid, w.pausePid, w.shimPid))
		}
	}
	pause, shim, ctr := chaosStillRunning(w.pausePid, w.pauseStart), chaosStillRunning(w.shimPid, w.shimStart), chaosStillRunning(w.ctrPid, w.ctrStart)
	if !pause || !shim || !ctr {
		problems = append(problems, fmt.Sprintf("still running (same pid and start time): pause %d %v, shim %d %v, container %d %v",
			w.pausePid, pause, w.shimPid, shim, w.ctrPid, ctr))
	}
	cs, err := rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: w.ctr})
	if err != nil {
		problems = append(problems, fmt.Sprintf("ContainerStatus: %v", err))
	} else if cs.Status.State != cri.ContainerState_CONTAINER_RUNNING {
		problems = append(problems, fmt.Sprintf("container %v (exit %d %s)", cs.Status.State, cs.Status.ExitCode, cs.Status.Reason))
	}
	if pid, err := chaosCtrPid(ctx, rt, w.ctr); err == nil && pid != w.ctrPid {
		problems = append(problems, fmt.Sprintf("container pid %d, was %d", pid, w.ctrPid))
	}
	if ex, err := rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: w.ctr, Cmd: []string{"echo", w.name}, Timeout: 10}); err != nil || string(ex.Stdout) != w.name+"\n" {
		problems = append(problems, fmt.Sprintf("exec: %v %q", err, ex.GetStdout()))
	}
	if len(problems) == 0 {
		w.survived++
		return
	}
	w.lastSeen = strings.Join(problems, "; ")
	if w.firstFailure == "" {
		w.firstFailure = fmt.Sprintf("check %d: %s", w.checks, w.lastSeen)
	}
}

// chaosTransient tells the errors of a call cut short by criserver's death (or made
// while it is down) from the answers of a running criserver.
func chaosTransient(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded:
		return true
	}
	return false
}

// chaosClient runs full pod and container cycles through its own connection,
// retrying each step that criserver's death cut short, and keeps track of every pod
// it created and removed.
type chaosClient struct {
	e        *env
	n        int
	img      string
	conn     *grpc.ClientConn
	rt       cri.RuntimeServiceClient
	deadline time.Time
	// ctx ends every call when the test ends, however it ends.
	ctx context.Context

	created, removed map[string]bool
	cycles, retries  int
	lost             []string
	problems         []string
}

func (c *chaosClient) problem(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf("client %d: ", c.n)+fmt.Sprintf(format, args...))
}

// do calls fn until it returns something other than a transient error (criserver
// down or killed during the call), or the client's deadline passes.
func (c *chaosClient) do(step string, fn func(ctx context.Context) error) error {
	for {
		if c.ctx.Err() != nil {
			return fmt.Errorf("%s: the test ended", step)
		}
		ctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
		err := fn(ctx)
		cancel()
		if err == nil || !chaosTransient(err) {
			if err != nil {
				return fmt.Errorf("%s: %w", step, err)
			}
			return nil
		}
		c.retries++
		if time.Now().After(c.deadline) {
			return fmt.Errorf("%s: still failing at the deadline: %w", step, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var chaosWaitReady = grpc.WaitForReady(true)

// cycle runs RunPodSandbox, CreateContainer, StartContainer, ExecSync, StopContainer,
// RemoveContainer, StopPodSandbox and RemovePodSandbox. A step cut short is retried;
// one whose object may have been made before the cut (a pod, a container) is found
// again by its labels when the retry says the name is taken.
func (c *chaosClient) cycle(n int) {
	name := fmt.Sprintf("chaos%d-%d", c.n, n)
	cfg := c.e.podConfig(name)
	cfg.Labels["chaos-client"] = strconv.Itoa(c.n)
	cfg.Labels["chaos-cycle"] = strconv.Itoa(n)
	var pod string
	err := c.do("RunPodSandbox "+name, func(ctx context.Context) error {
		resp, err := c.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg}, chaosWaitReady)
		if status.Code(err) == codes.AlreadyExists {
			// A call cut short made the pod: it is this client's.
			list, lerr := c.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{Filter: &cri.PodSandboxFilter{
				LabelSelector: map[string]string{"chaos-client": cfg.Labels["chaos-client"], "chaos-cycle": cfg.Labels["chaos-cycle"]}}}, chaosWaitReady)
			if lerr != nil {
				return lerr
			}
			if len(list.Items) != 1 {
				return fmt.Errorf("name taken (%v) but %d pods listed with its labels", err, len(list.Items))
			}
			pod = list.Items[0].Id
			return nil
		}
		if err == nil {
			pod = resp.PodSandboxId
		}
		return err
	})
	if err != nil {
		c.problem("%v", err)
		return
	}
	c.created[pod] = true
	defer c.teardown(pod)

	ccfg := ctrConfig("work", c.img, chaosSleeper...)
	var ctr string
	err = c.do("CreateContainer", func(ctx context.Context) error {
		resp, err := c.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: pod, Config: ccfg, SandboxConfig: cfg}, chaosWaitReady)
		if status.Code(err) == codes.AlreadyExists {
			list, lerr := c.rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{
				PodSandboxId: pod, LabelSelector: map[string]string{"ctr": "work"}}}, chaosWaitReady)
			if lerr != nil {
				return lerr
			}
			if len(list.Containers) != 1 {
				return fmt.Errorf("name taken (%v) but %d containers listed", err, len(list.Containers))
			}
			ctr = list.Containers[0].Id
			return nil
		}
		if err == nil {
			ctr = resp.ContainerId
		}
		return err
	})
	if err != nil {
		if status.Code(err) == codes.NotFound {
			c.lost = append(c.lost, fmt.Sprintf("pod %s (%s) vanished before CreateContainer: %v", pod, name, err))
		}
		c.problem("pod %s: %v", name, err)
		return
	}
	err = c.do("StartContainer", func(ctx context.Context) error {
		_, err := c.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: ctr}, chaosWaitReady)
		if status.Code(err) == codes.FailedPrecondition {
			// A start cut short may have started it.
			st, serr := c.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: ctr}, chaosWaitReady)
			if serr == nil && st.Status.State == cri.ContainerState_CONTAINER_RUNNING {
				return nil
			}
		}
		return err
	})
	if err == nil {
		err = c.do("ExecSync", func(ctx context.Context) error {
			resp, err := c.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: ctr, Cmd: []string{"echo", name}, Timeout: 10}, chaosWaitReady)
			if err == nil && (string(resp.Stdout) != name+"\n" || resp.ExitCode != 0) {
				return fmt.Errorf("exec echo: exit %d, stdout %q, stderr %q", resp.ExitCode, resp.Stdout, resp.Stderr)
			}
			return err
		})
	}
	if err == nil {
		err = c.do("StopContainer", func(ctx context.Context) error {
			_, err := c.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: ctr, Timeout: 5}, chaosWaitReady)
			return err
		})
	}
	if err == nil {
		err = c.do("RemoveContainer", func(ctx context.Context) error {
			_, err := c.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: ctr}, chaosWaitReady)
			return err
		})
	}
	if err != nil {
		if status.Code(err) == codes.NotFound {
			c.lost = append(c.lost, fmt.Sprintf("container %s of pod %s vanished: %v", ctr, name, err))
		}
		c.problem("pod %s container %s: %v", name, ctr, err)
	}
}

// teardown stops and removes the pod (and whatever containers it still has).
func (c *chaosClient) teardown(pod string) {
	err := c.do("StopPodSandbox", func(ctx context.Context) error {
		_, err := c.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: pod}, chaosWaitReady)
		return err
	})
	if err == nil {
		err = c.do("RemovePodSandbox", func(ctx context.Context) error {
			_, err := c.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: pod}, chaosWaitReady)
			return err
		})
	}
	if err != nil {
		c.problem("pod %s: %v", pod, err)
		return
	}
	c.removed[pod] = true
	c.cycles++
}

// TestE2EChaosKillCriserver: parallel clients doing full pod and container cycles
// with exec while criserver is killed with SIGKILL at random moments and restarted.
// Every pod a client created is either still listed or was removed by that client;
// two witness pods keep running with the same IP and pids; criserver never panics;
// everything is back to the leak baseline at the end.
func TestE2EChaosKillCriserver(t *testing.T) {
	cc := chaosConfig()
	e := chaosEnv(t)
	ctx := chaosCtx(t, cc)
	started := time.Now()
	img := e.busybox(ctx)
	e.chaosWarmUp(t, ctx, img)
	before := e.leakSnapshot(t)
	witnesses := []*chaosWitness{e.newChaosWitness(t, ctx, "witness1", img), e.newChaosWitness(t, ctx, "witness2", img)}

	deadline, _ := ctx.Deadline()
	clientCtx, stopClients := context.WithCancel(ctx)
	clients := make([]*chaosClient, cc.clients)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// However the test ends (a Fatal included), the clients stop before the env goes.
	t.Cleanup(func() {
		stopClients()
		wg.Wait()
	})
	for i := range clients {
		conn, err := grpc.NewClient("unix://"+e.socket, grpc.WithTransportCredentials(insecure.NewCredentials()), chaosFastConnect)
		if err != nil {
			t.Fatal(err)
		}
		clients[i] = &chaosClient{e: e, n: i, img: img, conn: conn, rt: cri.NewRuntimeServiceClient(conn),
			deadline: deadline.Add(-time.Minute), ctx: clientCtx, created: map[string]bool{}, removed: map[string]bool{}}
	}
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.conn.Close()
			for n := 0; ; n++ {
				select {
				case <-stop:
					if n > 0 {
						return
					}
				default:
				}
				if time.Now().After(c.deadline) {
					c.problem("deadline reached after %d cycles", n)
					return
				}
				if c.ctx.Err() != nil {
					return
				}
				c.cycle(n)
			}
		}()
	}

	// The killer: SIGKILL at random moments, restart, check the witnesses.
	var d chaosDaemon
	for range cc.kills {
		wait := cc.killMin + rand.N(cc.killMax-cc.killMin+1)
		for end := time.Now().Add(wait); time.Now().Before(end); {
			if e.cmd != nil && !alive(e.cmd.Process.Pid) {
				break // died by itself: restart it now (kill9 records the crash)
			}
			time.Sleep(20 * time.Millisecond)
		}
		d.kill9(e)
		d.restart(t, e)
		for _, w := range witnesses {
			w.check(ctx, e.rt)
		}
	}
	close(stop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Until(deadline) - 30*time.Second):
		t.Fatalf("clients did not finish their cycles")
	}

	// Every pod a client created: removed by it, or still listed.
	list, err := e.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, p := range list.Items {
		listed[p.Id] = true
	}
	cycles, retries, created := 0, 0, 0
	var lost, leftover []string
	known := map[string]bool{}
	for _, c := range clients {
		cycles += c.cycles
		retries += c.retries
		created += len(c.created)
		for _, p := range c.problems {
			t.Errorf("%s", p)
		}
		lost = append(lost, c.lost...)
		for id := range c.created {
			known[id] = true
			switch {
			case c.removed[id]:
			case listed[id]:
				leftover = append(leftover, id)
			default:
				lost = append(lost, fmt.Sprintf("pod %s of client %d is neither listed nor removed", id, c.n))
			}
		}
	}
	for _, w := range witnesses {
		known[w.pod] = true
	}
	for _, p := range list.Items {
		if !known[p.Id] {
			t.Errorf("pod %s (%s) is listed but no client created it", p.Id, p.Metadata.GetName())
			leftover = append(leftover, p.Id)
		}
	}
	for _, l := range lost {
		t.Errorf("lost: %s", l)
	}
	if ctrs, err := e.rt.ListContainers(ctx, &cri.ListContainersRequest{}); err != nil {
		t.Errorf("ListContainers: %v", err)
	} else {
		for _, c := range ctrs.Containers {
			if !slices.ContainsFunc(witnesses, func(w *chaosWitness) bool { return w.ctr == c.Id }) {
				t.Errorf("container %s (%s, pod %s) is listed after every client removed its pods", c.Id, c.Metadata.GetName(), c.PodSandboxId)
			}
		}
	}
	for _, id := range leftover {
		if _, err := e.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Errorf("stop leftover %s: %v", id, err)
		}
		if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Errorf("remove leftover %s: %v", id, err)
		}
	}
	survived := 0
	for _, w := range witnesses {
		w.check(ctx, e.rt)
		survived += w.survived
		if w.firstFailure != "" {
			t.Errorf("witness %s: first failure at %s; at the end: %s", w.name, w.firstFailure, w.lastSeen)
		}
		e.stopRemove(ctx, t, w.pod)
		e.assertPodGone(t, w.pod, w.info)
	}
	panics := e.chaosCheckDaemon(t, &d)
	after := e.assertNoLeaks(t, before, 10*time.Second)
	checks := 0
	for _, w := range witnesses {
		checks += w.checks
	}
	t.Logf("chaos (a) figures: clients %d, cycles %d (pods created %d), kills %d, retried calls %d, panics %d, lost pods %d, leftover pods %d, leaked objects %d, witness checks passed %d/%d, duration %v",
		cc.clients, cycles, created, d.kills, retries, panics, len(lost), len(leftover), before.leakedObjects(after), survived, checks, time.Since(started).Round(time.Millisecond))
	if cycles < cc.clients {
		t.Errorf("only %d full cycles for %d clients", cycles, cc.clients)
	}
}

// chaosShimPod is a pod with two running containers whose shim the test kills.
type chaosShimPod struct {
	name, pod string
	info      podInfo
	ctrs      []string
	ctrPids   []int
	cfg       *cri.PodSandboxConfig
	// Start times, so that a reused pid is not taken for the process the test watches.
	pauseStart string
	ctrStarts  []string
}

// chaosStillRunning reports whether pid is the process that had start time start and has
// not exited (a zombie counts as exited).
func chaosStillRunning(pid int, start string) bool {
	return start != "" && alive(pid) && chaosProcStart(pid) == start
}

func (e *env) newChaosShimPod(t *testing.T, ctx context.Context, name, img string) *chaosShimPod {
	t.Helper()
	p := &chaosShimPod{name: name, cfg: e.podConfig(name)}
	p.pod = e.runPod(ctx, p.cfg)
	for _, c := range []string{"a", "b"} {
		id := e.runCtr(ctx, p.pod, p.cfg, ctrConfig(name+c, img, chaosSleeper...))
		pid, err := chaosCtrPid(ctx, e.rt, id)
		if err != nil {
			t.Fatal(err)
		}
		p.ctrs, p.ctrPids, p.ctrStarts = append(p.ctrs, id), append(p.ctrPids, pid), append(p.ctrStarts, chaosProcStart(pid))
	}
	_, p.info = e.status(ctx, p.pod)
	p.pauseStart = chaosProcStart(p.info.Pid)
	if !alive(p.info.ShimPid) || !alive(p.info.Pid) {
		t.Fatalf("pod %s: shim %d or pause %d not running", name, p.info.ShimPid, p.info.Pid)
	}
	return p
}

// deadState reports whether criserver shows the pod NotReady and all its containers
// exited, and what it shows.
func (p *chaosShimPod) deadState(ctx context.Context, rt cri.RuntimeServiceClient) (bool, string, error) {
	resp, err := rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: p.pod})
	if err != nil {
		return false, "", err
	}
	done := resp.Status.State == cri.PodSandboxState_SANDBOX_NOTREADY
	desc := []string{"pod " + resp.Status.State.String()}
	for _, id := range p.ctrs {
		cs, err := rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			return false, "", err
		}
		done = done && cs.Status.State == cri.ContainerState_CONTAINER_EXITED
		desc = append(desc, fmt.Sprintf("container %.12s %v exit %d reason %q message %q", id, cs.Status.State, cs.Status.ExitCode, cs.Status.Reason, cs.Status.Message))
	}
	return done, strings.Join(desc, "; "), nil
}

// checkDead checks what must hold once criserver reports the pod dead: the pause and
// container processes are gone, and every container exited 137 with reason "Error"
// (or a reason naming the shim's death).
func (p *chaosShimPod) checkDead(t *testing.T, ctx context.Context, rt cri.RuntimeServiceClient, when string) {
	t.Helper()
	if chaosStillRunning(p.info.Pid, p.pauseStart) {
		t.Errorf("pod %s %s: pause process %d still running when the pod is reported NotReady", p.name, when, p.info.Pid)
	}
	for i, pid := range p.ctrPids {
		if chaosStillRunning(pid, p.ctrStarts[i]) {
			t.Errorf("pod %s %s: container %.12s process %d still running when reported exited", p.name, when, p.ctrs[i], pid)
		}
	}
	for _, id := range p.ctrs {
		cs, err := rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			t.Errorf("ContainerStatus %s: %v", id, err)
			continue
		}
		st := cs.Status
		why := strings.ToLower(st.Reason + " " + st.Message)
		if !(st.ExitCode == 137 && st.Reason == "Error") && !strings.Contains(why, "shim") {
			t.Errorf("pod %s %s: container %.12s exited %d reason %q message %q; want 137 \"Error\" or a reason naming the shim", p.name, when, id, st.ExitCode, st.Reason, st.Message)
		}
		if st.FinishedAt == 0 {
			t.Errorf("pod %s %s: container %.12s has no finish time", p.name, when, id)
		}
	}
}

// stopRemoveTimed stops and removes the pod, returning how long the stop took, and
// checks nothing of it is left, the containers' cgroups included.
func (p *chaosShimPod) stopRemoveTimed(t *testing.T, ctx context.Context, e *env) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := e.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: p.pod}); err != nil {
		t.Errorf("StopPodSandbox of %s after its shim died: %v", p.name, err)
	}
	took := time.Since(start)
	if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: p.pod}); err != nil {
		t.Errorf("RemovePodSandbox of %s after its shim died: %v", p.name, err)
	}
	e.assertPodGone(t, p.pod, p.info)
	for ctrl, dirs := range e.leakCgroupTree() {
		for _, d := range dirs {
			for _, id := range append([]string{p.pod}, p.ctrs...) {
				if strings.Contains(d, id) {
					t.Errorf("pod %s: cgroup %s/%s left after removal", p.name, ctrl, d)
				}
			}
		}
	}
	for i, pid := range p.ctrPids {
		if chaosStillRunning(pid, p.ctrStarts[i]) {
			t.Errorf("pod %s: container %.12s process %d still running after removal", p.name, p.ctrs[i], pid)
		}
	}
	return took
}

// Limits of TestE2EChaosShimKill: how soon a shim's death must show, and how long
// stopping such a pod may take (it has nothing left to stop).
const (
	chaosShimDeathNotice = 500 * time.Millisecond
	chaosDeadPodStop     = time.Second
)

// TestE2EChaosShimKill: kill -9 of the shim of pods with running containers, with
// criserver running (the pod must turn NotReady and its containers Exited quickly,
// with the pause and container processes already dead), and with criserver down (the
// same found at recovery). Stopping and removing such a pod is fast and leaves
// nothing.
func TestE2EChaosShimKill(t *testing.T) {
	cc := chaosConfig()
	e := chaosEnv(t)
	ctx := chaosCtx(t, cc)
	started := time.Now()
	img := e.busybox(ctx)
	e.chaosWarmUp(t, ctx, img)
	before := e.leakSnapshot(t)
	var d chaosDaemon
	var notice, recovered, stops []time.Duration
	for i := range max(cc.shimPods, 2) {
		p := e.newChaosShimPod(t, ctx, fmt.Sprintf("shimkill%d", i), img)
		if i%2 == 0 {
			// criserver running: time how long until it reports the death.
			start := time.Now()
			if err := syscall.Kill(p.info.ShimPid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			var desc string
			for {
				done, s, err := p.deadState(ctx, e.rt)
				if err != nil {
					t.Fatalf("pod %s after its shim was killed: %v", p.name, err)
				}
				desc = s
				if done {
					break
				}
				if time.Since(start) > 10*time.Second {
					t.Fatalf("pod %s: 10 s after its shim was killed: %s", p.name, desc)
				}
				time.Sleep(2 * time.Millisecond)
			}
			took := time.Since(start)
			notice = append(notice, took)
			p.checkDead(t, ctx, e.rt, "after its shim was killed")
			if took > chaosShimDeathNotice {
				t.Errorf("pod %s: shim death reported after %v (limit %v): %s", p.name, took, chaosShimDeathNotice, desc)
			}
		} else {
			// criserver down: the shim is found dead at recovery.
			d.kill9(e)
			if err := syscall.Kill(p.info.ShimPid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			for end := time.Now().Add(5 * time.Second); alive(p.info.ShimPid) && time.Now().Before(end); {
				time.Sleep(5 * time.Millisecond)
			}
			start := time.Now()
			d.restart(t, e)
			ready := time.Since(start)
			done, desc, err := p.deadState(ctx, e.rt)
			if err != nil {
				t.Fatalf("pod %s after a restart with its shim dead: %v", p.name, err)
			}
			// Recovery has run before criserver serves: the first answer must be the
			// settled one.
			if !done {
				t.Errorf("pod %s: right after the restart that found its shim dead: %s", p.name, desc)
			}
			recovered = append(recovered, ready)
			if i%4 == 3 {
				// Every other time, give it the same time as a live death to settle
				// before checking the processes and stopping the pod; else all at once,
				// as kubelet may.
				for end := time.Now().Add(chaosShimDeathNotice); !done && time.Now().Before(end); {
					time.Sleep(2 * time.Millisecond)
					if done, desc, err = p.deadState(ctx, e.rt); err != nil {
						t.Fatal(err)
					}
				}
				if !done {
					t.Errorf("pod %s: %v after the restart that found its shim dead: %s", p.name, chaosShimDeathNotice, desc)
				}
				p.checkDead(t, ctx, e.rt, fmt.Sprintf("found dead at recovery (checked after it settled, %v)", time.Since(start)-ready))
			} else {
				p.checkDead(t, ctx, e.rt, "found dead at recovery (checked at once)")
			}
		}
		took := p.stopRemoveTimed(t, ctx, e)
		stops = append(stops, took)
		if took > chaosDeadPodStop {
			t.Errorf("pod %s: StopPodSandbox took %v after its shim died (limit %v)", p.name, took, chaosDeadPodStop)
		}
	}
	panics := e.chaosCheckDaemon(t, &d)
	after := e.assertNoLeaks(t, before, 10*time.Second)
	t.Logf("chaos (b) figures: shims killed %d (%d with criserver running, %d while it was down), NotReady+Exited detection %s, restart that found the shim dead %s, StopPodSandbox of a dead pod %s, panics %d, leaked objects %d, duration %v",
		len(notice)+len(recovered), len(notice), len(recovered), chaosDurations(notice), chaosDurations(recovered), chaosDurations(stops),
		panics, before.leakedObjects(after), time.Since(started).Round(time.Millisecond))
}

// chaosDurations summarises a sample as min/median/max.
func chaosDurations(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	return fmt.Sprintf("min %v median %v max %v", r(s[0]), r(s[len(s)/2]), r(s[len(s)-1]))
}

// chaosOwnership lists what the image store and the container bundles hold that no
// record in criserver's database owns: container bundles (state_dir/containers/<id>)
// and writable snapshots without a container record, snapshot directories
// (root_dir/images/snapshots/<n>) no layer or writable snapshot record names, layer
// snapshots no image needs, blobs no image references, and anything in ingest/. It
// reads the database, so criserver must not be running.
func (e *env) chaosOwnership(t *testing.T) []string {
	t.Helper()
	db, err := bolt.Open(filepath.Join(e.root, "meta.db"), 0o600, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("open criserver's database: %v", err)
	}
	defer db.Close()
	keys := func(bucket string, fn func(k string, v []byte)) {
		_ = db.View(func(tx *bolt.Tx) error {
			if b := tx.Bucket([]byte(bucket)); b != nil {
				return b.ForEach(func(k, v []byte) error { fn(string(k), v); return nil })
			}
			return nil
		})
	}
	containers := map[string]bool{}
	keys("containers", func(k string, _ []byte) { containers[k] = true })
	snapIDs := map[string]bool{}
	var out []string
	keys("snapshot-active", func(k string, v []byte) {
		var rec struct {
			ID uint64 `json:"id"`
		}
		_ = json.Unmarshal(v, &rec)
		snapIDs[strconv.FormatUint(rec.ID, 10)] = true
		if !containers[k] {
			out = append(out, fmt.Sprintf("writable snapshot %s (dir %d) has no container record", k, rec.ID))
		}
	})
	blobs := map[string]bool{}
	chains := map[string]bool{}
	keys("images", func(_ string, v []byte) {
		var img struct {
			ID             string   `json:"id"`
			ManifestDigest string   `json:"manifest_digest"`
			IndexDigest    string   `json:"index_digest"`
			ChainIDs       []string `json:"chain_ids"`
			Layers         []struct{ Digest string }
		}
		_ = json.Unmarshal(v, &img)
		for _, d := range []string{img.ID, img.ManifestDigest, img.IndexDigest} {
			blobs[d] = d != ""
		}
		for _, l := range img.Layers {
			blobs[l.Digest] = true
		}
		for _, c := range img.ChainIDs {
			chains[c] = true
		}
	})
	keys("snapshots", func(k string, v []byte) {
		var rec struct {
			ID uint64 `json:"id"`
		}
		_ = json.Unmarshal(v, &rec)
		snapIDs[strconv.FormatUint(rec.ID, 10)] = true
		if !chains[k] {
			out = append(out, fmt.Sprintf("layer snapshot %s (dir %d) belongs to no image", k, rec.ID))
		}
	})
	for _, id := range leakDirNames(filepath.Join(e.state, "containers")) {
		if !containers[id] {
			out = append(out, fmt.Sprintf("container bundle %s has no container record", filepath.Join(e.state, "containers", id)))
		}
	}
	snapRoot := filepath.Join(e.root, "images", "snapshots")
	for _, n := range leakDirNames(snapRoot) {
		if !snapIDs[n] {
			out = append(out, fmt.Sprintf("snapshot dir %s has no record", filepath.Join(snapRoot, n)))
		}
	}
	content := filepath.Join(e.root, "images", "content")
	for _, alg := range leakDirNames(filepath.Join(content, "blobs")) {
		for _, h := range leakDirNames(filepath.Join(content, "blobs", alg)) {
			if !blobs[alg+":"+h] {
				out = append(out, fmt.Sprintf("blob %s:%s belongs to no image", alg, h))
			}
		}
	}
	_ = filepath.WalkDir(filepath.Join(content, "ingest"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, "ingest file "+p)
		}
		return nil
	})
	// CreateContainer mounts the rootfs for a moment under state_dir/rootfs-* to read
	// the image's users and groups.
	for _, n := range leakDirNames(e.state) {
		if strings.HasPrefix(n, "rootfs-") {
			out = append(out, fmt.Sprintf("temporary rootfs dir %s left", filepath.Join(e.state, n)))
		}
	}
	sort.Strings(out)
	return out
}

// chaosCheckOwnership kills criserver (after it recovered: nothing is in flight),
// checks ownership and starts it again. Each orphan is reported once (seen), when it
// first shows; it returns how many new ones there were.
func (e *env) chaosCheckOwnership(t *testing.T, d *chaosDaemon, seen map[string]bool, when string) int {
	t.Helper()
	d.kill9(e)
	n := 0
	for _, o := range e.chaosOwnership(t) {
		if !seen[o] {
			seen[o] = true
			n++
			t.Errorf("%s: %s", when, o)
		}
	}
	d.restart(t, e)
	return n
}

// chaosCutShort runs call in a goroutine, kills criserver after delay and restarts it.
// It returns the call's error (nil: it completed before the kill).
func (e *env) chaosCutShort(t *testing.T, d *chaosDaemon, delay time.Duration, call func() error) error {
	t.Helper()
	res := make(chan error, 1)
	go func() { res <- call() }()
	time.Sleep(delay)
	d.kill9(e)
	err := <-res
	d.restart(t, e)
	return err
}

// TestE2EChaosKillDuringCreate: criserver killed with SIGKILL in the middle of
// CreateContainer. After the restart the container is either listed (and can be
// started: item 1's "close of closed channel" panic) or is not, and nothing is left
// that no record owns: no bundle, no writable snapshot.
func TestE2EChaosKillDuringCreate(t *testing.T) {
	cc := chaosConfig()
	e := chaosEnv(t)
	ctx := chaosCtx(t, cc)
	started := time.Now()
	img := e.busybox(ctx)
	e.chaosWarmUp(t, ctx, img)
	before := e.leakSnapshot(t)
	pod := e.podConfig("creates")
	podID := e.runPod(ctx, pod)
	var d chaosDaemon

	// Item 1: a CREATED container started after a restart (kill -9, then SIGTERM).
	// runSurvivor starts a container created before a restart, execs in it, stops it
	// (its own exit, seen by the monitor StartContainer began: where item 1's "close of
	// closed channel" panic happened) and removes it.
	runSurvivor := func(id, when string) {
		t.Helper()
		if _, err := e.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: id}); err != nil {
			t.Errorf("%s: StartContainer of a container created before the restart: %v", when, err)
		} else {
			if resp, err := e.execSync(ctx, id, 10, "echo", "ok"); err != nil || string(resp.Stdout) != "ok\n" {
				t.Errorf("%s: exec in the started container: %v %v", when, resp, err)
			}
			if _, err := e.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: id, Timeout: 5}); err != nil {
				t.Errorf("%s: StopContainer: %v", when, err)
			} else if cs, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id}); err != nil {
				t.Errorf("%s: ContainerStatus after StopContainer: %v", when, err)
			} else if cs.Status.State != cri.ContainerState_CONTAINER_EXITED {
				t.Errorf("%s: StopContainer returned with the container %v: it must return once the container exited", when, cs.Status.State)
			}
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
				cs, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
				if err == nil && cs.Status.State == cri.ContainerState_CONTAINER_EXITED {
					break
				}
			}
		}
		// A panic in the monitor takes criserver down a moment after the exit.
		time.Sleep(150 * time.Millisecond)
		if e.cmd == nil || !alive(e.cmd.Process.Pid) {
			t.Errorf("%s: criserver died when the container started after the restart exited (its log shows why)", when)
			d.kill9(e)
			d.restart(t, e)
		}
		if _, err := e.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: id}); err != nil {
			t.Errorf("%s: RemoveContainer: %v", when, err)
		}
	}
	for _, how := range []string{"kill -9", "SIGTERM"} {
		resp, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: ctrConfig("restarted", img, chaosSleeper...), SandboxConfig: pod})
		if err != nil {
			t.Fatal(err)
		}
		if how == "kill -9" {
			d.kill9(e)
		} else {
			e.stop()
		}
		d.restart(t, e)
		runSurvivor(resp.ContainerId, "created, then criserver restarted after "+how)
	}

	// How long a create takes, so that the kills fall before, during and after it.
	var createTook time.Duration
	for i := range 3 {
		start := time.Now()
		resp, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: ctrConfig(fmt.Sprintf("timed%d", i), img, chaosSleeper...), SandboxConfig: pod})
		if err != nil {
			t.Fatal(err)
		}
		createTook += time.Since(start)
		if _, err := e.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: resp.ContainerId}); err != nil {
			t.Fatal(err)
		}
	}
	createTook /= 3
	maxDelay := max(2*createTook, 20*time.Millisecond)
	var completed, survived, undone, orphans, lost int
	seen := map[string]bool{}
	for i := range cc.iterations {
		name := fmt.Sprintf("cut%d", i)
		rt := e.rt
		var created string
		delay := rand.N(maxDelay)
		err := e.chaosCutShort(t, &d, delay, func() error {
			resp, err := rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: ctrConfig(name, img, chaosSleeper...), SandboxConfig: pod})
			if err == nil {
				created = resp.ContainerId
			}
			return err
		})
		if err == nil {
			completed++
		}
		list, lerr := e.rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{LabelSelector: map[string]string{"ctr": name}}})
		if lerr != nil {
			t.Fatal(lerr)
		}
		switch {
		case len(list.Containers) > 1:
			t.Errorf("kill %v into CreateContainer: %d containers listed", delay, len(list.Containers))
		case created != "" && (len(list.Containers) == 0 || list.Containers[0].Id != created):
			lost++
			t.Errorf("kill %v into CreateContainer: it returned %s, which is not listed after the restart", delay, created)
		}
		orphans += e.chaosCheckOwnership(t, &d, seen, fmt.Sprintf("kill %v into CreateContainer (call error: %v)", delay, err))
		if len(list.Containers) == 0 {
			undone++
			continue
		}
		survived++
		c := list.Containers[0]
		if c.State != cri.ContainerState_CONTAINER_CREATED {
			t.Errorf("kill %v into CreateContainer: the surviving container is %v, want CREATED", delay, c.State)
		}
		runSurvivor(c.Id, fmt.Sprintf("kill %v into CreateContainer", delay))
	}
	e.stopRemove(ctx, t, podID)
	panics := e.chaosCheckDaemon(t, &d)
	after := e.assertNoLeaks(t, before, 10*time.Second)
	t.Logf("chaos (e) create figures: kills during CreateContainer %d (delays 0-%v, a create takes %v): completed before the kill %d, container listed after restart %d, undone %d, lost %d, orphaned files %d; kills %d, panics %d, leaked objects %d, duration %v",
		cc.iterations, maxDelay.Round(time.Millisecond), createTook.Round(100*time.Microsecond), completed, survived, undone, lost, orphans,
		d.kills, panics, before.leakedObjects(after), time.Since(started).Round(time.Millisecond))
}

// chaosBigImage is a busybox base and four 3 MiB layers of random data: a pull of
// several MB in several layers, long enough to be killed in the middle.
func chaosBigImage(t *testing.T) (v1.Image, int) {
	t.Helper()
	layers := []v1.Layer{imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.BusyboxEntries(t)...)}
	const n, size = 4, 3 << 20
	for i := range n {
		layers = append(layers, imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.RandomFile(fmt.Sprintf("data%d", i), size, uint64(i)+1)))
	}
	return imagetest.NewImage(t, imagetest.ImageOptions{}, layers...), n * size
}

// chaosSlowBlobs throttles blob downloads while on is set (64 KiB, then 2 ms), so that a
// kill lands in the middle of a blob, with partial files in ingest/.
func chaosSlowBlobs(on *atomic.Bool) imagetest.RegistryOption {
	return imagetest.WithMiddleware(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if on.Load() && r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
				w = chaosThrottledWriter{w}
			}
			next.ServeHTTP(w, r)
		})
	})
}

type chaosThrottledWriter struct{ http.ResponseWriter }

func (w chaosThrottledWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), 64<<10)
		m, err := w.ResponseWriter.Write(p[:k])
		n += m
		if err != nil {
			return n, err
		}
		p = p[k:]
		time.Sleep(2 * time.Millisecond)
	}
	return n, nil
}

// TestE2EChaosKillDuringPull: criserver killed with SIGKILL in the middle of PullImage
// of a multi-layer image of several MB, from a fast registry and (every other time) a
// throttled one. After the restart the image is either listed or not; no blob, ingest
// file or snapshot is left that no image owns; the image pulls again and runs a
// container whose files are whole.
func TestE2EChaosKillDuringPull(t *testing.T) {
	cc := chaosConfig()
	e := chaosEnv(t)
	ctx := chaosCtx(t, cc)
	started := time.Now()
	var slow atomic.Bool
	host := imagetest.StartRegistry(t, chaosSlowBlobs(&slow))
	img, dataSize := chaosBigImage(t)
	imagetest.Push(t, host, "chaos/big:v1", img)
	ref := host + "/chaos/big:v1"
	imageID := imagetest.ConfigDigest(t, img).String()
	warm := e.podConfig("warmup")
	podID := e.runPod(ctx, warm)
	pod := warm
	var d chaosDaemon

	pull := func(rt cri.ImageServiceClient) error {
		resp, err := rt.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}})
		if err == nil && resp.ImageRef != imageID {
			return fmt.Errorf("pulled image ref %s, want %s", resp.ImageRef, imageID)
		}
		return err
	}
	// Runs a container of the image that checks its data files are whole, then
	// removes the container and the image.
	useAndRemove := func(when string) {
		t.Helper()
		cfg := ctrConfig("check", ref, "sh", "-c", fmt.Sprintf("test $(cat /data0 /data1 /data2 /data3 | wc -c) -eq %d", dataSize))
		id := e.runCtr(ctx, podID, pod, cfg)
		if st := e.waitExit(ctx, id, 20*time.Second); st.ExitCode != 0 {
			t.Errorf("%s: the image's files are not whole in a container: exit %d", when, st.ExitCode)
		}
		if _, err := e.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: id}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.img.RemoveImage(ctx, &cri.RemoveImageRequest{Image: &cri.ImageSpec{Image: imageID}}); err != nil {
			t.Fatalf("%s: RemoveImage: %v", when, err)
		}
	}
	// Warm up and time a pull, fast and throttled; then the baseline has no image.
	var pullTook [2]time.Duration
	for i := range 2 {
		slow.Store(i == 1)
		start := time.Now()
		if err := pull(e.img); err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		pullTook[i] = time.Since(start)
		useAndRemove("warm-up")
	}
	slow.Store(false)
	e.stopRemove(ctx, t, podID)
	before := e.leakSnapshot(t)
	pod = e.podConfig("pulls")
	podID = e.runPod(ctx, pod)
	var completed, listedAfter, undone, orphans, lost int
	seen := map[string]bool{}
	for i := range cc.iterations {
		mode := i % 2
		maxDelay := max(pullTook[mode]*6/5, 20*time.Millisecond)
		delay := rand.N(maxDelay)
		what := fmt.Sprintf("kill %v into a %s PullImage", delay, []string{"fast", "throttled"}[mode])
		rt := e.img
		slow.Store(mode == 1)
		err := e.chaosCutShort(t, &d, delay, func() error { return pull(rt) })
		slow.Store(false)
		if err == nil {
			completed++
		}
		st, serr := e.img.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: ref}})
		if serr != nil {
			t.Fatalf("ImageStatus after the restart: %v", serr)
		}
		if st.Image != nil {
			listedAfter++
			if st.Image.Id != imageID {
				t.Errorf("%s: image listed with id %s, want %s", what, st.Image.Id, imageID)
			}
		} else {
			undone++
			if err == nil {
				lost++
				t.Errorf("%s: the pull returned, the image is not listed after the restart", what)
			}
		}
		orphans += e.chaosCheckOwnership(t, &d, seen, fmt.Sprintf("%s (call error: %v)", what, err))
		// Whatever the kill left, the image pulls again and is whole.
		if err := pull(e.img); err != nil {
			t.Fatalf("%s: the next pull: %v", what, err)
		}
		useAndRemove(what)
	}
	e.stopRemove(ctx, t, podID)
	orphans += e.chaosCheckOwnership(t, &d, seen, "at the end")
	panics := e.chaosCheckDaemon(t, &d)
	after := e.assertNoLeaks(t, before, 10*time.Second)
	t.Logf("chaos (e) pull figures: kills during PullImage %d (a pull of %d MiB in 5 layers takes %v, throttled %v; delays up to 1.2x that): completed before the kill %d, image listed after restart %d, undone %d, lost %d, orphaned files %d; kills %d, panics %d, leaked objects %d, duration %v",
		cc.iterations, dataSize>>20, pullTook[0].Round(time.Millisecond), pullTook[1].Round(time.Millisecond), completed, listedAfter, undone, lost, orphans,
		d.kills, panics, before.leakedObjects(after), time.Since(started).Round(time.Millisecond))
}
