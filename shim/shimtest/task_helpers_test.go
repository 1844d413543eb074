package shimtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/anypb"

	sandboxapi "github.com/crisp-runtime/crisp/api/containerd/sandbox/v1"
	taskapi "github.com/crisp-runtime/crisp/api/containerd/task/v3"
	"github.com/crisp-runtime/crisp/api/containerd/types"
	optionsv1 "github.com/crisp-runtime/crisp/api/options/v1"
	"github.com/crisp-runtime/crisp/api/shimapi"
	"github.com/crisp-runtime/crisp/internal/mount"
	"github.com/crisp-runtime/crisp/internal/testutil"
)

// busyboxLower is a directory with Debian's busybox-static and its applets: the lower
// layer of every test container's overlay rootfs. Built once, removed by TestMain.
var (
	busyboxOnce  sync.Once
	busyboxDir   string
	busyboxError error
)

func busyboxLower(t *testing.T) string {
	t.Helper()
	busyboxOnce.Do(func() { busyboxDir, busyboxError = makeBusyboxLower() })
	if busyboxError != nil {
		t.Skipf("no busybox rootfs (apt-get install busybox-static): %v", busyboxError)
	}
	return busyboxDir
}

func makeBusyboxLower() (_ string, retErr error) {
	out, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		return "", fmt.Errorf("busybox --list: %w", err)
	}
	dir, err := os.MkdirTemp("", "shimtest-busybox-")
	if err != nil {
		return "", err
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(dir)
		}
	}()
	for _, d := range []string{"bin", "etc", "root", "tmp", "proc", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return "", err
		}
	}
	data, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), data, 0o755); err != nil {
		return "", err
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", applet)); err != nil && !errors.Is(err, os.ErrExist) {
			return "", err
		}
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":  "root:x:0:\nnogroup:x:65534:\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

func removeBusyboxLower() {
	if busyboxDir != "" {
		os.RemoveAll(busyboxDir)
	}
}

// pod is a shim with a started sandbox: the pause process holds the namespaces.
type pod struct {
	*shimProc
	pausePid  int
	podCgroup string // cgroupfs path of the pod cgroup
	tasks     taskapi.TTRPCTaskService
	extra     shimapi.Service
}

// startPod starts a shim and a sandbox with a pinned netns, in a cgroup parent of the
// test. Cleanup shuts the sandbox down (which deletes every container) before the shim
// helpers kill and `delete` whatever is left.
func startPod(t *testing.T) *pod {
	t.Helper()
	testutil.RequiresRoot(t, rootWhy)
	busyboxLower(t)
	ctx := ctxT(t)
	s := startShim(t)
	parent := cgroupParent(t)
	opts := &optionsv1.SandboxOptions{CgroupParent: parent, Hostname: "taskpod"}
	if _, err := s.sb.CreateSandbox(ctx, &sandboxapi.CreateSandboxRequest{SandboxID: s.id, NetnsPath: netns(t), Options: optionsAny(t, opts)}); err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	started, err := s.sb.StartSandbox(ctx, &sandboxapi.StartSandboxRequest{SandboxID: s.id})
	if err != nil {
		t.Fatalf("start sandbox: %v", err)
	}
	p := &pod{
		shimProc:  s,
		pausePid:  int(started.GetPid()),
		podCgroup: parent + "/crisp-" + s.id,
		tasks:     taskapi.NewTTRPCTaskClient(s.client),
		extra:     shimapi.NewClient(s.client),
	}
	t.Cleanup(func() {
		if s.client != nil && alive(s.pid) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if _, err := s.sb.ShutdownSandbox(ctx, &sandboxapi.ShutdownSandboxRequest{SandboxID: s.id}); err != nil {
				t.Errorf("cleanup: shutdown sandbox: %v", err)
			}
			waitGone(t, s.pid)
		}
	})
	return p
}

// ctrOpts describes a test container.
type ctrOpts struct {
	args      []string
	sharedPID bool // join the pause's PID namespace instead of a new one
	terminal  bool
	memory    int64 // memory limit in bytes, 0 = none
	noLog     bool
}

// ctr is a created test container.
type ctr struct {
	id, bundle, rootfs, logPath string
	pid                         int
	cgroup                      string // cgroupfs path
}

// containerSpec is a minimal OCI spec of a CRI container: the pod's namespaces, the
// default mounts, a default capability set and a cgroup under the pod cgroup.
func (p *pod) containerSpec(id string, o ctrOpts) *specs.Spec {
	caps := []string{
		"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
		"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
		"CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
	}
	ns := func(kind string) string { return fmt.Sprintf("/proc/%d/ns/%s", p.pausePid, kind) }
	pidNS := specs.LinuxNamespace{Type: specs.PIDNamespace}
	if o.sharedPID {
		pidNS.Path = ns("pid")
	}
	spec := &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: "rootfs"},
		Process: &specs.Process{
			Terminal: o.terminal,
			Args:     o.args,
			Env:      []string{"PATH=/bin", "HOME=/root", "TERM=xterm"},
			Cwd:      "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			NoNewPrivileges: true,
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: p.podCgroup + "/" + id,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.MountNamespace},
				{Type: specs.IPCNamespace, Path: ns("ipc")},
				{Type: specs.UTSNamespace, Path: ns("uts")},
				{Type: specs.NetworkNamespace, Path: ns("net")},
				pidNS,
			},
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
			},
			MaskedPaths: []string{
				"/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
				"/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
			},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
	if o.memory > 0 {
		spec.Linux.Resources.Memory = &specs.LinuxMemory{Limit: &o.memory}
	}
	return spec
}

// create writes the bundle and creates the container through the task v3 API.
func (p *pod) create(t *testing.T, id string, o ctrOpts) *ctr {
	t.Helper()
	c, req := p.prepare(t, id, o)
	resp, err := p.tasks.Create(ctxT(t), req)
	if err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
	c.pid = int(resp.GetPid())
	return c
}

// prepare writes the bundle (config.json, overlay dirs) and returns the create request.
func (p *pod) prepare(t *testing.T, id string, o ctrOpts) (*ctr, *taskapi.CreateTaskRequest) {
	t.Helper()
	base := t.TempDir()
	c := &ctr{
		id:      id,
		bundle:  filepath.Join(base, "bundle"),
		logPath: filepath.Join(base, "logs", id, "0.log"),
		cgroup:  p.podCgroup + "/" + id,
	}
	c.rootfs = filepath.Join(c.bundle, "rootfs")
	for _, d := range []string{c.bundle, filepath.Join(base, "upper"), filepath.Join(base, "work")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Runs before TempDir's removal: never delete through a live mount.
	t.Cleanup(func() { _ = mount.Unmount(c.rootfs) })
	data, err := json.Marshal(p.containerSpec(id, o))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.bundle, "config.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	copts := &optionsv1.ContainerOptions{LogPath: c.logPath, SandboxId: p.id}
	if o.noLog {
		copts.LogPath, c.logPath = "", ""
	}
	a, err := anypb.New(copts)
	if err != nil {
		t.Fatal(err)
	}
	req := &taskapi.CreateTaskRequest{
		ID:       id,
		Bundle:   c.bundle,
		Terminal: o.terminal,
		Options:  a,
		Rootfs: []*types.Mount{{
			Type:   "overlay",
			Source: "overlay",
			Options: []string{
				"lowerdir=" + busyboxLower(t),
				"upperdir=" + filepath.Join(base, "upper"),
				"workdir=" + filepath.Join(base, "work"),
			},
		}},
	}
	return c, req
}

func (p *pod) start(t *testing.T, c *ctr) {
	t.Helper()
	if _, err := p.tasks.Start(ctxT(t), &taskapi.StartRequest{ID: c.id}); err != nil {
		t.Fatalf("start %s: %v", c.id, err)
	}
}

func (p *pod) wait(t *testing.T, id, execID string) *taskapi.WaitResponse {
	t.Helper()
	resp, err := p.tasks.Wait(ctxT(t), &taskapi.WaitRequest{ID: id, ExecID: execID})
	if err != nil {
		t.Fatalf("wait %s/%s: %v", id, execID, err)
	}
	return resp
}

func (p *pod) delete(t *testing.T, id string) *taskapi.DeleteResponse {
	t.Helper()
	resp, err := p.tasks.Delete(ctxT(t), &taskapi.DeleteRequest{ID: id})
	if err != nil {
		t.Fatalf("delete %s: %v", id, err)
	}
	return resp
}

// assertGone checks from the outside that nothing of the container is left: no
// process, no rootfs mount, no cgroup in any hierarchy.
func assertGone(t *testing.T, c *ctr) {
	t.Helper()
	if c.pid > 0 && alive(c.pid) {
		t.Errorf("container %s: pid %d still runs", c.id, c.pid)
	}
	if mounted(t, c.rootfs) {
		t.Errorf("container %s: %s still mounted", c.id, c.rootfs)
	}
	if _, err := os.Stat(c.rootfs); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("container %s: rootfs dir still exists: %v", c.id, err)
	}
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, root := range roots {
		if _, err := os.Stat(filepath.Join(root, c.cgroup)); err == nil {
			t.Errorf("container %s: cgroup %s still exists", c.id, filepath.Join(root, c.cgroup))
		}
	}
}

func mounted(t *testing.T, path string) bool {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

// logRecord is one line of a CRI log file.
type logRecord struct{ stream, tag, text string }

// readLog parses a CRI log file; every line must be well formed.
func readLog(t *testing.T, path string) []logRecord {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Only whole lines: a poll while the shim appends can read the part of a write
	// that has reached the file so far (the kernel grows a file a page at a time).
	data = data[:bytes.LastIndexByte(data, '\n')+1]
	var recs []logRecord
	s := bufio.NewScanner(bytes.NewReader(data))
	for s.Scan() {
		parts := strings.SplitN(s.Text(), " ", 4)
		if len(parts) != 4 {
			t.Fatalf("malformed log line %q", s.Text())
		}
		if _, err := time.Parse(time.RFC3339Nano, parts[0]); err != nil || !strings.HasSuffix(parts[0], "Z") {
			t.Fatalf("log line %q: bad UTC timestamp: %v", s.Text(), err)
		}
		recs = append(recs, logRecord{parts[1], parts[2], parts[3]})
	}
	return recs
}

// fifo creates a FIFO in a fresh directory.
func fifo(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// openReader opens a FIFO for reading without waiting for a writer.
func openReader(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// readAll reads r until EOF or the deadline.
func readAll(t *testing.T, f *os.File, d time.Duration) string {
	t.Helper()
	if err := f.SetReadDeadline(time.Now().Add(d)); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if _, err := b.ReadFrom(f); err != nil {
		t.Fatalf("read fifo: %v (got %q)", err, b.String())
	}
	return b.String()
}

func processAny(t *testing.T, p *specs.Process) *anypb.Any {
	t.Helper()
	data, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return &anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/Process", Value: data}
}

func countDir(t *testing.T, dir string) int {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// memUse is RSS, PSS and anonymous memory (heap, stacks: what a shim costs beyond the
// binary's pages, which all shims share) of a process in KiB, from smaps_rollup.
func memUse(t *testing.T, pid int) (rss, pss, anon int) {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "Rss:":
			rss = v
		case "Pss:":
			pss = v
		case "Anonymous:":
			anon = v
		}
	}
	return rss, pss, anon
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func writeSpec(t *testing.T, bundle string, spec *specs.Spec) {
	t.Helper()
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// readUntil reads f until what it read ends with suffix, or fails at the deadline.
func readUntil(t *testing.T, f *os.File, suffix string, d time.Duration) string {
	t.Helper()
	if err := f.SetReadDeadline(time.Now().Add(d)); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	buf := make([]byte, 256)
	for !strings.HasSuffix(strings.ReplaceAll(b.String(), "\r", ""), suffix) {
		n, err := f.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			t.Fatalf("read fifo: %v (got %q)", err, b.String())
		}
	}
	return b.String()
}
