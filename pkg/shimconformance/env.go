package shimconformance

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	eventsapi "github.com/containerd/containerd/api/services/ttrpc/events/v1"
	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/emptypb"

	// The task event messages, so that events decode by their type URL.
	_ "github.com/containerd/containerd/api/events"
)

// event is one task event the shim forwarded.
type event struct {
	topic       string
	containerID string
	execID      string
	at          time.Time
}

// eventServer serves containerd.services.events.ttrpc.v1.Events/Forward on a unix
// socket of the suite and records what arrives.
type eventServer struct {
	address string
	srv     *ttrpc.Server
	l       net.Listener
	mu      sync.Mutex
	events  []event
}

func startEventServer(path string) (*eventServer, error) {
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	srv, err := ttrpc.NewServer()
	if err != nil {
		_ = l.Close()
		return nil, err
	}
	e := &eventServer{address: path, srv: srv, l: l}
	eventsapi.RegisterTTRPCEventsService(srv, e)
	go func() { _ = srv.Serve(context.Background(), l) }()
	return e, nil
}

// Forward records an event: its topic and the container and exec ids it names.
func (e *eventServer) Forward(_ context.Context, req *eventsapi.ForwardRequest) (*emptypb.Empty, error) {
	env := req.GetEnvelope()
	ev := event{topic: env.GetTopic(), at: time.Now()}
	if a := env.GetEvent(); a != nil {
		name := a.GetTypeUrl()
		if !strings.Contains(name, "/") {
			name = "type.googleapis.com/" + name
		}
		if mt, err := protoregistry.GlobalTypes.FindMessageByURL(name); err == nil {
			m := mt.New()
			if proto.Unmarshal(a.GetValue(), m.Interface()) == nil {
				fields := m.Descriptor().Fields()
				if f := fields.ByName("container_id"); f != nil {
					ev.containerID = m.Get(f).String()
				}
				if f := fields.ByName("exec_id"); f != nil {
					ev.execID = m.Get(f).String()
				}
			}
		}
	}
	e.mu.Lock()
	e.events = append(e.events, ev)
	e.mu.Unlock()
	return &emptypb.Empty{}, nil
}

// of returns the events that name container id, in the order they arrived.
func (e *eventServer) of(id string) []event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []event
	for _, ev := range e.events {
		if ev.containerID == id {
			out = append(out, ev)
		}
	}
	return out
}

// waitFor waits up to d for an event of topic for container id.
func (e *eventServer) waitFor(id, topic string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		for _, ev := range e.of(id) {
			if ev.topic == topic {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *eventServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = e.srv.Shutdown(ctx)
	_ = e.srv.Close()
	_ = os.Remove(e.address)
}

// makeBusyboxRootfs fills dir with Debian's static busybox and its applet links, the
// smallest rootfs every check can run in.
func makeBusyboxRootfs(dir string) error {
	bb := "/bin/busybox"
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return fmt.Errorf("%s --list (install busybox-static, or give a rootfs): %w", bb, err)
	}
	for _, d := range []string{"bin", "etc", "root", "tmp", "proc", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), data, 0o755); err != nil {
		return err
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", applet)); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	files := map[string]string{ //nolint:gosec // G101: an /etc/passwd without passwords
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":  "root:x:0:\nnogroup:x:65534:\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// makeNetns creates a network namespace pinned by a bind mount at path (as `ip netns
// add` does): a thread unshares its network namespace, the mount keeps it, and the
// thread is never handed back to Go, so it dies with its namespace.
func makeNetns(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_ = f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare netns: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, path, "", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("pin netns: %w", err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		_ = os.Remove(path)
		return err
	}
	return nil
}

func removeNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return os.Remove(path)
}

// cgroupRoots lists the mount points of every cgroup hierarchy (v1 and v2).
func cgroupRoots() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	seen := map[string]bool{}
	var roots []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		if typ := fields[sep+1]; (typ == "cgroup" || typ == "cgroup2") && !seen[fields[4]] {
			seen[fields[4]] = true
			roots = append(roots, fields[4])
		}
	}
	return roots
}

// removeCgroupTree kills every process left in the cgroup parent (in any hierarchy)
// and removes its cgroups bottom up. It returns what it could not remove.
func removeCgroupTree(parent string) error {
	var dirs []string
	for _, root := range cgroupRoots() {
		top := filepath.Join(root, parent)
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	if len(dirs) == 0 {
		return nil
	}
	for _, d := range dirs {
		data, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		for _, line := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(line); err == nil && pid > 0 {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
	}
	// Deepest first.
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	var left []string
	deadline := time.Now().Add(5 * time.Second)
	for _, d := range dirs {
		for {
			err := unix.Rmdir(d)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if time.Now().After(deadline) {
				left = append(left, d)
				break
			}
			// Processes killed above may still be exiting; a frozen cgroup is thawed.
			_ = os.WriteFile(filepath.Join(d, "freezer.state"), []byte("THAWED"), 0o644)
			_ = os.WriteFile(filepath.Join(d, "cgroup.freeze"), []byte("0"), 0o644)
			data, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			for _, line := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(line); err == nil && pid > 0 {
					_ = unix.Kill(pid, unix.SIGKILL)
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("cgroups left: %s", strings.Join(left, ", "))
	}
	return nil
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		p := unescapeMount(fields[4])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		_ = unix.Unmount(p, unix.MNT_DETACH)
	}
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mounted reports whether path is a mount point.
func mounted(path string) bool {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) >= 5 && unescapeMount(fields[4]) == path {
			return true
		}
	}
	return false
}
