package shimconformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	tasktypes "github.com/containerd/containerd/api/types/task"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Annotations containerd's CRI puts on a pod's containers; task-only shims (gVisor's)
// group containers into one sandbox by them.
const (
	annContainerType = "io.kubernetes.cri.container-type"
	annSandboxID     = "io.kubernetes.cri.sandbox-id"
	annSandboxName   = "io.kubernetes.cri.sandbox-name"
	annSandboxNS     = "io.kubernetes.cri.sandbox-namespace"
	annSandboxUID    = "io.kubernetes.cri.sandbox-uid"
	annContainerName = "io.kubernetes.cri.container-name"
)

// ctrOpts describes a container of a check.
type ctrOpts struct {
	args     []string
	terminal bool
	stdin    bool
	stdout   bool
	memory   int64 // memory limit in bytes, 0 = none
	pause    bool  // the pod's sandbox container (task mode): own namespaces
}

// container is one container a check created: its bundle, FIFOs and host pid.
type container struct {
	id      string
	dir     string
	bundle  string
	spec    *specs.Spec
	stdin   string
	stdout  string
	out     *collector
	errOut  *collector
	pid     int
	deleted bool
}

func (s *suite) newID(prefix string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return fmt.Sprintf("%s-%s-%d", prefix, s.rand, s.seq)
}

// spec is a minimal OCI spec of a CRI container: a new mount namespace, the pod's
// others joined (the pod's own for its sandbox container), the default mounts and
// capabilities, a cgroup below the suite's parent and containerd's annotations.
func (s *suite) spec(p *pod, id string, o ctrOpts) *specs.Spec {
	caps := []string{
		"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
		"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
		"CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
	}
	ns := func(kind string) string { return fmt.Sprintf("/proc/%d/ns/%s", p.pid, kind) }
	namespaces := []specs.LinuxNamespace{
		{Type: specs.MountNamespace},
		{Type: specs.IPCNamespace, Path: ns("ipc")},
		{Type: specs.UTSNamespace, Path: ns("uts")},
		{Type: specs.NetworkNamespace, Path: ns("net")},
		{Type: specs.PIDNamespace, Path: ns("pid")},
	}
	ann := map[string]string{
		annContainerType: "container",
		annSandboxID:     p.id,
		annSandboxName:   "shimtest",
		annSandboxNS:     s.namespace,
		annSandboxUID:    s.rand,
		annContainerName: id,
	}
	if o.pause {
		namespaces = []specs.LinuxNamespace{
			{Type: specs.MountNamespace},
			{Type: specs.IPCNamespace},
			{Type: specs.UTSNamespace},
			{Type: specs.NetworkNamespace, Path: s.netns},
			{Type: specs.PIDNamespace},
		}
		ann[annContainerType] = "sandbox"
		delete(ann, annContainerName)
	}
	spec := &specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: "rootfs"},
		Hostname: "",
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
		Annotations: ann,
		Linux: &specs.Linux{
			CgroupsPath: s.cgroupParent + "/" + id,
			Namespaces:  namespaces,
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
	if o.pause {
		spec.Hostname = "shimtest"
	}
	if o.memory > 0 {
		limit := o.memory
		spec.Linux.Resources.Memory = &specs.LinuxMemory{Limit: &limit}
	}
	return spec
}

// prepareBundle writes a container's bundle (config.json, overlay dirs, FIFOs) and
// returns the task Create request: the rootfs is an overlay of the shared lower dir,
// given as the request's rootfs mounts, which the shim mounts at <bundle>/rootfs.
func (s *suite) prepareBundle(p *pod, id string, o ctrOpts) (*container, *taskapi.CreateTaskRequest, error) {
	// The bundle's name is the id, as under containerd: containerd's runc shim finds a
	// dead shim's bundle for `delete` by it.
	dir := filepath.Join(s.dir, "c", id)
	c := &container{id: id, dir: dir, bundle: filepath.Join(s.dir, "b", id)}
	for _, d := range []string{filepath.Join(c.bundle, "rootfs"), filepath.Join(dir, "upper"), filepath.Join(dir, "work")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, nil, err
		}
	}
	c.spec = s.spec(p, id, o)
	data, err := json.Marshal(c.spec)
	if err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(filepath.Join(c.bundle, "config.json"), data, 0o600); err != nil {
		return nil, nil, err
	}
	req := &taskapi.CreateTaskRequest{
		ID:       id,
		Bundle:   c.bundle,
		Terminal: o.terminal,
		Options:  s.cfg.TaskOptions,
		Rootfs:   overlayMount(s.lower, dir),
	}
	if o.stdout {
		c.stdout = filepath.Join(dir, "stdout")
		if c.out, err = newCollector(c.stdout); err != nil {
			return nil, nil, err
		}
		req.Stdout = c.stdout
		if !o.terminal {
			req.Stderr = filepath.Join(dir, "stderr")
			if c.errOut, err = newCollector(req.Stderr); err != nil {
				return nil, nil, err
			}
		}
	}
	if o.stdin {
		c.stdin = filepath.Join(dir, "stdin")
		if err := unix.Mkfifo(c.stdin, 0o600); err != nil {
			return nil, nil, err
		}
		req.Stdin = c.stdin
	}
	return c, req, nil
}

// create makes a container in the pod's shim; its cleanup (kill, delete, unmount) is
// registered before the create is sent, so a create cut short is undone too.
func (s *suite) create(ctx context.Context, p *pod, id string, o ctrOpts) (*container, error) {
	sh := p.shim
	c, req, err := s.prepareBundle(p, id, o)
	if err != nil {
		return nil, err
	}
	s.addCleanup(func() { s.removeContainer(sh, c) })
	s.mu.Lock()
	p.containers = append(p.containers, c)
	s.mu.Unlock()
	resp, err := sh.tasks.Create(ctx, req)
	if err != nil {
		return c, fmt.Errorf("create %s: %w", id, err)
	}
	c.pid = int(resp.GetPid())
	return c, nil
}

// createStarted creates and starts a container.
func (s *suite) createStarted(ctx context.Context, p *pod, id string, o ctrOpts) (*container, error) {
	sh := p.shim
	c, err := s.create(ctx, p, id, o)
	if err != nil {
		return c, err
	}
	resp, err := sh.tasks.Start(ctx, id, "")
	if err != nil {
		return c, fmt.Errorf("start %s: %w", id, err)
	}
	if p := int(resp.GetPid()); p > 0 {
		c.pid = p
	}
	return c, nil
}

// removeContainer kills and deletes a container if the shim still has it, and makes
// sure nothing of it is mounted any more.
func (s *suite) removeContainer(sh *shimRun, c *container) {
	if !c.deleted && sh.tasks != nil && (sh.pid == 0 || alive(sh.pid)) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		// A running task's exited_at may be a zero time rather than absent.
		if st, err := sh.tasks.State(ctx, c.id, ""); err == nil && st.GetStatus() != tasktypes.Status_STOPPED {
			if st.GetStatus() == tasktypes.Status_PAUSED {
				_ = sh.tasks.Resume(ctx, c.id)
			}
			_ = sh.tasks.Kill(ctx, c.id, uint32(unix.SIGKILL), true)
			wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
			_, _ = sh.tasks.Wait(wctx, c.id, "")
			wcancel()
		}
		if _, err := sh.tasks.Delete(ctx, c.id, ""); err != nil && !isNotFound(err) {
			s.logf("cleanup: delete %s: %v", c.id, err)
		}
		cancel()
		c.deleted = true
	}
	if c.out != nil {
		c.out.close()
	}
	if c.errOut != nil {
		c.errOut.close()
	}
	unmountUnder(c.bundle)
}

// collector reads a FIFO without ever blocking the suite: the read end is opened
// non-blocking (so the shim's open of the write end does not wait) and read until it
// is closed; an end of file before the shim opened its end is read again.
type collector struct {
	f    *os.File
	mu   sync.Mutex
	buf  strings.Builder
	done chan struct{}
	stop chan struct{}
}

func newCollector(path string) (*collector, error) {
	if err := unix.Mkfifo(path, 0o600); err != nil {
		return nil, err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	c := &collector{f: os.NewFile(uintptr(fd), path), done: make(chan struct{}), stop: make(chan struct{})}
	go c.loop(fd)
	return c, nil
}

func (c *collector) loop(fd int) {
	defer close(c.done)
	b := make([]byte, 4096)
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		n, err := unix.Read(fd, b)
		if n > 0 {
			c.mu.Lock()
			c.buf.Write(b[:n])
			c.mu.Unlock()
			continue
		}
		if err != nil && !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (c *collector) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// waitFor waits until the output contains want, or ctx ends.
func (c *collector) waitFor(ctx context.Context, want string) (string, error) {
	for {
		out := c.String()
		if strings.Contains(out, want) {
			return out, nil
		}
		select {
		case <-ctx.Done():
			return out, fmt.Errorf("output %q has no %q: %w", out, want, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (c *collector) close() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
	_ = c.f.Close()
}

// openWriter opens a FIFO's write end once the shim has opened its read end (a
// non-blocking open fails with ENXIO until then), as containerd's CRI opens stdin.
func openWriter(ctx context.Context, path string) (*os.File, error) {
	for {
		fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err == nil {
			return os.NewFile(uintptr(fd), path), nil
		}
		if !errors.Is(err, unix.ENXIO) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the shim never opened %s for reading: %w", path, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
