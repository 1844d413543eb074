package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
)

// busybox pulls a busybox-static image into the env's criserver and returns its ref.
func (e *env) busybox(ctx context.Context) string {
	e.t.Helper()
	host := imagetest.StartRegistry(e.t)
	imagetest.Push(e.t, host, "busybox:e2e", imagetest.BusyboxImage(e.t, imagetest.OCI, imagetest.Gzip))
	ref := host + "/busybox:e2e"
	if _, err := e.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}}); err != nil {
		e.t.Fatalf("pull busybox: %v", err)
	}
	return ref
}

func ctrConfig(name, image string, cmd ...string) *cri.ContainerConfig {
	return &cri.ContainerConfig{
		Metadata: &cri.ContainerMetadata{Name: name},
		Image:    &cri.ImageSpec{Image: image},
		Command:  cmd,
		LogPath:  name + ".log",
		Labels:   map[string]string{"ctr": name},
		Linux:    &cri.LinuxContainerConfig{SecurityContext: &cri.LinuxContainerSecurityContext{}},
	}
}

func (e *env) runCtr(ctx context.Context, podID string, pod *cri.PodSandboxConfig, cfg *cri.ContainerConfig) string {
	e.t.Helper()
	resp, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: cfg, SandboxConfig: pod})
	if err != nil {
		e.t.Fatalf("CreateContainer %s: %v", cfg.Metadata.Name, err)
	}
	if _, err := e.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		e.t.Fatalf("StartContainer %s: %v", cfg.Metadata.Name, err)
	}
	return resp.ContainerId
}

// waitExit polls until the container exited and returns its status.
func (e *env) waitExit(ctx context.Context, id string, within time.Duration) *cri.ContainerStatus {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		resp, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			e.t.Fatal(err)
		}
		if resp.Status.State == cri.ContainerState_CONTAINER_EXITED {
			return resp.Status
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("container %s still %v after %v", id, resp.Status.State, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var criLogLine = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z (stdout|stderr) (F|P) (.*)$`)

// logLines parses a CRI log file into "stream text" lines.
func logLines(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read log: %v", err)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if l == "" {
			continue
		}
		m := criLogLine.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("log line not in CRI format: %q", l)
		}
		out = append(out, m[1]+" "+m[3])
	}
	return out
}

// eventually polls cond until it holds (true) or within passes (false): for a state
// that settles after the call that causes it returned, which one look can miss.
func eventually(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// waitLogLine waits until the CRI log at path (which may not exist yet) has line
// ("stdout text"), and returns its lines; the test fails if it does not within.
func waitLogLine(t *testing.T, path, line string, within time.Duration) []string {
	t.Helper()
	var got []string
	if !eventually(within, func() bool {
		got = nil
		if _, err := os.Stat(path); err == nil {
			got = logLines(t, path)
		}
		return slices.Contains(got, line)
	}) {
		t.Fatalf("log %s: %q after %v, want a line %q", path, got, within, line)
	}
	return got
}

func (e *env) execSync(ctx context.Context, id string, timeout int64, cmd ...string) (*cri.ExecSyncResponse, error) {
	return e.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: timeout})
}

func TestE2EContainerLifecycleAndLogs(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	pod := e.podConfig("ctrs")
	podID := e.runPod(ctx, pod)

	id := e.runCtr(ctx, podID, pod, ctrConfig("exits", img, "sh", "-c", "echo hello; echo oops >&2; exit 3"))
	st := e.waitExit(ctx, id, 10*time.Second)
	if st.ExitCode != 3 || st.Reason != "Error" || st.FinishedAt < st.StartedAt || st.StartedAt < st.CreatedAt {
		t.Errorf("status: code %d reason %q times %d %d %d", st.ExitCode, st.Reason, st.CreatedAt, st.StartedAt, st.FinishedAt)
	}
	if st.ImageId == "" || st.ImageRef == "" || st.LogPath != filepath.Join(pod.LogDirectory, "exits.log") {
		t.Errorf("status image %q ref %q log %q", st.ImageId, st.ImageRef, st.LogPath)
	}
	lines := logLines(t, st.LogPath)
	sort.Strings(lines)
	if strings.Join(lines, "|") != "stderr oops|stdout hello" {
		t.Errorf("log lines %q", lines)
	}
	if _, err := e.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: id}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("second start: %v", err)
	}

	ok := e.runCtr(ctx, podID, pod, ctrConfig("completes", img, "true"))
	if st := e.waitExit(ctx, ok, 10*time.Second); st.ExitCode != 0 || st.Reason != "Completed" {
		t.Errorf("true: %d %q", st.ExitCode, st.Reason)
	}

	// ExecSync against a running container.
	// "trapped" tells when the shell ignores SIGTERM: the stop below must come after.
	run := e.runCtr(ctx, podID, pod, ctrConfig("sleeper", img, "sh", "-c", "trap '' TERM; echo trapped; sleep 1000 & wait"))
	resp, err := e.execSync(ctx, run, 10, "echo", "hi")
	if err != nil || string(resp.Stdout) != "hi\n" || resp.ExitCode != 0 {
		t.Fatalf("exec echo: %v %v", resp, err)
	}
	resp, err = e.execSync(ctx, run, 10, "sh", "-c", "echo out; echo err >&2; exit 7")
	if err != nil || string(resp.Stdout) != "out\n" || string(resp.Stderr) != "err\n" || resp.ExitCode != 7 {
		t.Fatalf("exec exit 7: %v %v", resp, err)
	}
	if _, err := e.execSync(ctx, run, 10, "sh", "-c", "yes | head -c 5000000"); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "cap") {
		t.Errorf("exec past the output cap: %v", err)
	}
	start := time.Now()
	_, err = e.execSync(ctx, run, 1, "sleep", "30")
	if status.Code(err) != codes.DeadlineExceeded || time.Since(start) > 5*time.Second {
		t.Fatalf("exec timeout: %v after %v", err, time.Since(start))
	}
	list, err := e.rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{PodSandboxId: podID, State: &cri.ContainerStateValue{State: cri.ContainerState_CONTAINER_RUNNING}}})
	if err != nil || len(list.Containers) != 1 || list.Containers[0].Id != run {
		t.Fatalf("list running: %v %v", list, err)
	}
	list, _ = e.rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{LabelSelector: map[string]string{"ctr": "exits"}}})
	if len(list.GetContainers()) != 1 {
		t.Fatalf("label filter: %v", list)
	}
	// The shell ignores SIGTERM: the timeout's SIGKILL ends it.
	waitLogLine(t, filepath.Join(pod.LogDirectory, "sleeper.log"), "stdout trapped", 10*time.Second)
	start = time.Now()
	if _, err := e.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: run, Timeout: 1}); err != nil {
		t.Fatal(err)
	}
	if st := e.waitExit(ctx, run, 5*time.Second); st.ExitCode != 137 || time.Since(start) < time.Second {
		t.Errorf("stop: exit %d after %v", st.ExitCode, time.Since(start))
	}
	for _, c := range []string{id, ok, run} {
		if _, err := e.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: c}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id}); status.Code(err) != codes.NotFound {
		t.Errorf("status of removed: %v", err)
	}
	_, info := e.status(ctx, podID)
	e.stopRemove(ctx, t, podID)
	e.assertPodGone(t, podID, info)
	e.assertNodeClean(t)
	if entries, _ := os.ReadDir(filepath.Join(e.state, "containers")); len(entries) != 0 {
		t.Errorf("container bundles left: %d", len(entries))
	}
}

func TestE2EContainerErrors(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	pod := e.podConfig("errs")
	podID := e.runPod(ctx, pod)
	missingMount := ctrConfig("badmount", img, "true")
	missingMount.Mounts = []*cri.Mount{{HostPath: "/nonexistent/crisp", ContainerPath: "/data"}}
	badUser := ctrConfig("baduser", img, "true")
	badUser.Linux.SecurityContext.RunAsUsername = "nosuchuser"
	cases := []struct {
		name string
		pod  string
		cfg  *cri.ContainerConfig
		code codes.Code
	}{
		{"unknown pod", "nope", ctrConfig("a", img, "true"), codes.NotFound},
		{"image not pulled", podID, ctrConfig("b", "docker.io/library/notpulled:1", "true"), codes.NotFound},
		{"missing mount source", podID, missingMount, codes.InvalidArgument},
		{"unknown user", podID, badUser, codes.NotFound},
		{"no config", podID, nil, codes.InvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: tc.pod, Config: tc.cfg, SandboxConfig: pod})
			if status.Code(err) != tc.code {
				t.Fatalf("err = %v, want %v", err, tc.code)
			}
		})
	}
	list, _ := e.rt.ListContainers(ctx, &cri.ListContainersRequest{})
	if len(list.GetContainers()) != 0 {
		t.Fatalf("failed creates left containers: %v", list.Containers)
	}
	if entries, _ := os.ReadDir(filepath.Join(e.state, "containers")); len(entries) != 0 {
		t.Errorf("failed creates left bundles: %d", len(entries))
	}
	// A stopped pod takes no new containers.
	if _, err := e.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: ctrConfig("late", img, "true"), SandboxConfig: pod}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("create in stopped pod: %v", err)
	}
	if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Fatal(err)
	}
	e.assertNodeClean(t)
}

func TestE2EContainersSharePod(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	pod := e.podConfig("shared")
	pod.Linux.SecurityContext.NamespaceOptions.Pid = cri.NamespaceMode_POD
	podID := e.runPod(ctx, pod)
	server := ctrConfig("server", img, "sh", "-c", "echo shared > /dev/shm/marker; while true; do echo pong | nc -l -p 7070; done")
	a := e.runCtr(ctx, podID, pod, server)
	b := e.runCtr(ctx, podID, pod, ctrConfig("client", img, "sleep", "1000"))
	var out string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := e.execSync(ctx, b, 5, "sh", "-c", "echo ping | nc 127.0.0.1 7070")
		if err == nil && strings.Contains(string(resp.Stdout), "pong") {
			out = string(resp.Stdout)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out == "" {
		t.Fatal("the second container never reached the first on localhost")
	}
	// IPC, UTS and net namespaces are the pod's; /dev/shm is shared too.
	nsOf := func(id string) string {
		resp, err := e.execSync(ctx, id, 5, "readlink", "/proc/self/ns/ipc", "/proc/self/ns/uts", "/proc/self/ns/net", "/proc/self/ns/pid")
		if err != nil {
			t.Fatal(err)
		}
		return string(resp.Stdout)
	}
	if na, nb := nsOf(a), nsOf(b); na != nb {
		t.Errorf("containers of one pod are in different namespaces:\n%s\n%s", na, nb)
	}
	host, _ := os.Readlink("/proc/thread-self/ns/ipc")
	if strings.Contains(nsOf(a), host) {
		t.Errorf("container shares the host's IPC namespace %s", host)
	}
	resp, err := e.execSync(ctx, b, 5, "cat", "/dev/shm/marker")
	if err != nil || string(resp.Stdout) != "shared\n" {
		t.Errorf("shared /dev/shm: %v %q", err, resp.GetStdout())
	}
	resp, err = e.execSync(ctx, b, 5, "ps")
	if err != nil || !strings.Contains(string(resp.Stdout), "nc -l -p 7070") {
		t.Errorf("shared pid namespace: %v %q", err, resp.GetStdout())
	}
	_ = a
	_, info := e.status(ctx, podID)
	e.stopRemove(ctx, t, podID)
	e.assertPodGone(t, podID, info)
	e.assertNodeClean(t)
}

func TestE2EContainerOOMKilled(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	pod := e.podConfig("oom")
	podID := e.runPod(ctx, pod)
	cfg := ctrConfig("hog", img, "sh", "-c", "x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done")
	cfg.Linux.Resources = &cri.LinuxContainerResources{MemoryLimitInBytes: 32 << 20}
	id := e.runCtr(ctx, podID, pod, cfg)
	st := e.waitExit(ctx, id, 30*time.Second)
	if st.Reason != "OOMKilled" || st.ExitCode != 137 {
		t.Errorf("reason %q exit %d, want OOMKilled 137", st.Reason, st.ExitCode)
	}
	e.stopRemove(ctx, t, podID)
	e.assertNodeClean(t)
}

func TestE2EContainerSecurity(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	pod := e.podConfig("sec")
	podID := e.runPod(ctx, pod)

	cfg := ctrConfig("locked", img, "sleep", "1000")
	sc := cfg.Linux.SecurityContext
	sc.RunAsUser = &cri.Int64Value{Value: 65534}
	sc.RunAsGroup = &cri.Int64Value{Value: 65534}
	sc.SupplementalGroups = []int64{4242}
	sc.ReadonlyRootfs = true
	sc.Capabilities = &cri.Capability{DropCapabilities: []string{"ALL"}}
	sc.NoNewPrivs = true
	profile := filepath.Join(e.dir, "deny-mkdir.json")
	if err := os.WriteFile(profile, []byte(`{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["mkdir","mkdirat"],"action":"SCMP_ACT_ERRNO"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	sc.Seccomp = &cri.SecurityProfile{ProfileType: cri.SecurityProfile_Localhost, LocalhostRef: profile}
	sc.MaskedPaths = []string{"/proc/kcore", "/proc/keys"}
	sc.ReadonlyPaths = []string{"/proc/sys"}
	id := e.runCtr(ctx, podID, pod, cfg)
	check := func(name, want string, cmd ...string) {
		t.Helper()
		resp, err := e.execSync(ctx, id, 10, cmd...)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := strings.TrimSpace(string(resp.Stdout) + string(resp.Stderr)); !strings.Contains(got, want) {
			t.Errorf("%s: got %q, want it to contain %q", name, got, want)
		}
	}
	check("uid", "65534", "id", "-u")
	check("gid", "65534", "id", "-g")
	check("groups", "4242", "id", "-G")
	check("read-only rootfs", "Read-only file system", "sh", "-c", "touch /newfile 2>&1; true")
	check("no capabilities", "CapEff:\t0000000000000000", "grep", "CapEff", "/proc/self/status")
	check("no new privs", "NoNewPrivs:\t1", "grep", "NoNewPrivs", "/proc/self/status")
	check("seccomp denies mkdir", "Operation not permitted", "sh", "-c", "mkdir /tmp/x 2>&1; true")
	check("masked /proc/keys", "0", "sh", "-c", "wc -c < /proc/keys")
	check("read-only /proc/sys", "Read-only file system", "sh", "-c", "echo 1 > /proc/sys/kernel/shm_rmid_forced 2>&1; true")
	st, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
	if err != nil || st.Status.User.GetLinux().GetUid() != 65534 {
		t.Errorf("status user: %v %v", st.GetStatus().GetUser(), err)
	}

	// Privileged (in a privileged pod, as kubelet requires): all capabilities.
	ppod := e.podConfig("privpod")
	ppod.Linux.SecurityContext.Privileged = true
	ppodID := e.runPod(ctx, ppod)
	priv := ctrConfig("priv", img, "sleep", "1000")
	priv.Linux.SecurityContext.Privileged = true
	pid := e.runCtr(ctx, ppodID, ppod, priv)
	resp, err := e.execSync(ctx, pid, 10, "grep", "CapEff", "/proc/self/status")
	if err != nil || strings.Contains(string(resp.Stdout), "0000000000000000") {
		t.Errorf("privileged caps: %v %q", err, resp.GetStdout())
	}
	e.stopRemove(ctx, t, ppodID)
	e.stopRemove(ctx, t, podID)
	e.assertNodeClean(t)
}

func TestE2EContainersSurviveKill9(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	pod := e.podConfig("survive")
	podID := e.runPod(ctx, pod)
	ticker := e.runCtr(ctx, podID, pod, ctrConfig("ticker", img, "sh", "-c", "while true; do echo tick; sleep 0.1; done"))
	quitter := e.runCtr(ctx, podID, pod, ctrConfig("quitter", img, "sh", "-c", "sleep 1; exit 5"))
	st, _ := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: ticker})
	logPath := st.Status.LogPath
	e.kill9()
	before := len(logLines(t, logPath))
	after := before
	if !eventually(10*time.Second, func() bool { after = len(logLines(t, logPath)); return after > before+5 }) {
		t.Errorf("log did not keep growing while criserver was down: %d -> %d lines in 10 s", before, after)
	}
	e.start()
	rs, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: ticker})
	if err != nil || rs.Status.State != cri.ContainerState_CONTAINER_RUNNING {
		t.Errorf("ticker after restart: %v %v", rs, err)
	}
	qs := e.waitExit(ctx, quitter, 5*time.Second)
	if qs.ExitCode != 5 || qs.Reason != "Error" {
		t.Errorf("quitter after restart: exit %d reason %q", qs.ExitCode, qs.Reason)
	}
	e.stopRemove(ctx, t, podID)
	e.assertNodeClean(t)
}

func TestE2EUpdateResourcesAndReopenLog(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	pod := e.podConfig("upd")
	podID := e.runPod(ctx, pod)
	cfg := ctrConfig("ticker", img, "sh", "-c", "while true; do echo tick; sleep 0.05; done")
	cfg.Linux.Resources = &cri.LinuxContainerResources{MemoryLimitInBytes: 64 << 20, CpuShares: 512, CpuPeriod: 100000, CpuQuota: 50000, OomScoreAdj: 500}
	id := e.runCtr(ctx, podID, pod, cfg)
	limit := func() string {
		data, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", e.cgroup, "crisp-"+id, "memory.limit_in_bytes"))
		if err != nil {
			t.Fatalf("read container memory limit: %v", err)
		}
		return strings.TrimSpace(string(data))
	}
	if got := limit(); got != fmt.Sprint(64<<20) {
		t.Fatalf("memory limit %s, want 64 MiB", got)
	}
	if _, err := e.rt.UpdateContainerResources(ctx, &cri.UpdateContainerResourcesRequest{ContainerId: id, Linux: &cri.LinuxContainerResources{MemoryLimitInBytes: 128 << 20, CpuShares: 256}}); err != nil {
		t.Fatal(err)
	}
	if got := limit(); got != fmt.Sprint(128<<20) {
		t.Errorf("memory limit after update %s, want 128 MiB", got)
	}
	st, _ := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
	if st.GetStatus().GetResources().GetLinux().GetMemoryLimitInBytes() != 128<<20 {
		t.Errorf("status resources: %v", st.GetStatus().GetResources())
	}
	// A partial update (crictl update --memory) keeps in the status, the verbose spec
	// and the cgroup what it does not name, as containerd merges it into the spec.
	if _, err := e.rt.UpdateContainerResources(ctx, &cri.UpdateContainerResourcesRequest{ContainerId: id, Linux: &cri.LinuxContainerResources{MemoryLimitInBytes: 96 << 20}}); err != nil {
		t.Fatal(err)
	}
	st, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	got := st.GetStatus().GetResources().GetLinux()
	if got.GetMemoryLimitInBytes() != 96<<20 || got.GetCpuShares() != 256 || got.GetCpuQuota() != 50000 || got.GetCpuPeriod() != 100000 || got.GetOomScoreAdj() != 500 {
		t.Errorf("status after a memory-only update: %v, want memory 96 MiB, shares 256, quota 50000/100000, oom_score_adj 500", got)
	}
	var info struct {
		RuntimeSpec struct {
			Linux struct {
				Resources struct {
					Memory struct{ Limit int64 }
					CPU    struct {
						Shares uint64
						Quota  int64
					}
				}
			}
		}
	}
	if err := json.Unmarshal([]byte(st.GetInfo()["info"]), &info); err != nil {
		t.Fatalf("verbose info: %v", err)
	}
	if r := info.RuntimeSpec.Linux.Resources; r.Memory.Limit != 96<<20 || r.CPU.Shares != 256 || r.CPU.Quota != 50000 {
		t.Errorf("verbose spec after updates: memory %d shares %d quota %d, want 96 MiB, 256, 50000", r.Memory.Limit, r.CPU.Shares, r.CPU.Quota)
	}
	if got := limit(); got != fmt.Sprint(96<<20) {
		t.Errorf("memory limit after the second update %s, want 96 MiB", got)
	}
	if data, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu", e.cgroup, "crisp-"+id, "cpu.cfs_quota_us")); err != nil || strings.TrimSpace(string(data)) != "50000" {
		t.Errorf("cpu quota after a memory-only update: %q %v", data, err)
	}
	// Rotate as kubelet does: rename, then ReopenContainerLog.
	logPath := st.Status.LogPath
	waitLogLine(t, logPath, "stdout tick", 10*time.Second)
	if err := os.Rename(logPath, logPath+".1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.ReopenContainerLog(ctx, &cri.ReopenContainerLogRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	waitLogLine(t, logPath, "stdout tick", 10*time.Second)
	e.stopRemove(ctx, t, podID)
	e.assertNodeClean(t)
	if _, err := e.rt.ReopenContainerLog(ctx, &cri.ReopenContainerLogRequest{ContainerId: id}); status.Code(err) != codes.NotFound {
		t.Errorf("reopen of a removed container: %v", err)
	}
}

func TestE2EMountsDevicesAndTargetPid(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	pod := e.podConfig("vols")
	pod.Linux.SecurityContext.NamespaceOptions.Pid = cri.NamespaceMode_CONTAINER
	podID := e.runPod(ctx, pod)
	vol := filepath.Join(e.dir, "vol")
	if err := os.MkdirAll(vol, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vol, "from-host"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := ctrConfig("target", img, "sleep", "1000")
	cfg.Mounts = []*cri.Mount{
		{HostPath: vol, ContainerPath: "/rw"},
		{HostPath: vol, ContainerPath: "/ro", Readonly: true},
	}
	cfg.Devices = []*cri.Device{{HostPath: "/dev/null", ContainerPath: "/dev/mynull", Permissions: "rwm"}}
	target := e.runCtr(ctx, podID, pod, cfg)
	resp, err := e.execSync(ctx, target, 10, "sh", "-c", "cat /ro/from-host; echo written > /rw/from-ctr; echo x > /ro/nope 2>&1; echo data > /dev/mynull && echo devok")
	if err != nil {
		t.Fatal(err)
	}
	out := string(resp.Stdout) + string(resp.Stderr)
	if !strings.Contains(out, "hello") || !strings.Contains(out, "Read-only file system") || !strings.Contains(out, "devok") {
		t.Errorf("mounts and devices: %q", out)
	}
	if data, err := os.ReadFile(filepath.Join(vol, "from-ctr")); err != nil || string(data) != "written\n" {
		t.Errorf("write through the rw mount: %q %v", data, err)
	}
	// A debug container joining the first one's pid namespace sees its processes.
	dbg := ctrConfig("debugger", img, "sleep", "1000")
	dbg.Linux.SecurityContext.NamespaceOptions = &cri.NamespaceOption{Pid: cri.NamespaceMode_TARGET, TargetId: target}
	d := e.runCtr(ctx, podID, pod, dbg)
	resp, err = e.execSync(ctx, d, 10, "ps")
	if err != nil || strings.Count(string(resp.Stdout), "sleep 1000") != 2 {
		t.Errorf("TARGET pid namespace: %v %q", err, resp.GetStdout())
	}
	e.stopRemove(ctx, t, podID)
	e.assertNodeClean(t)
}
