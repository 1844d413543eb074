package pause

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/testutil"
	"github.com/crisp-runtime/crisp/pkg/shimkit/reaper"
)

// rootWhy is what the pause tests need root for (testutil.RequiresRoot).
const rootWhy = "the pause process creates namespaces"

func nsInode(t *testing.T, pid int, kind string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/%s", pid, kind), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// nsenter reads a file as seen from inside the pause process's namespaces. With a
// running reaper r, nsenter is started and waited for through it: the reaper would
// otherwise reap it before exec.Cmd's wait ("waitid: no child processes").
func nsenter(t *testing.T, r *reaper.Reaper, pid int, flag string, args ...string) string {
	t.Helper()
	cmd := exec.Command("nsenter", append([]string{"-t", fmt.Sprint(pid), flag, "--"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	var err error
	if r == nil {
		err = cmd.Run()
	} else if err = r.Start(cmd); err == nil {
		err = r.Wait(cmd)
	}
	if err != nil {
		t.Fatalf("nsenter %s %v: %v: %s", flag, args, err, out.String())
	}
	return strings.TrimSpace(out.String())
}

func TestStartStop(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	tests := []struct {
		name  string
		cfg   Config
		grace time.Duration
		want  uint32
	}{
		{
			name:  "new namespaces, SIGTERM",
			cfg:   Config{NewIPC: true, NewUTS: true, NewPID: true, Hostname: "pause-test", Sysctls: map[string]string{"kernel.shm_rmid_forced": "1"}},
			grace: 5 * time.Second,
			want:  0,
		},
		{
			name:  "host pid namespace, SIGKILL",
			cfg:   Config{NewUTS: true},
			grace: 0,
			want:  137,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			p, err := Start(ctx, tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Stop(ctx, 0) })

			self := os.Getpid()
			if got := nsInode(t, p.Pid(), "uts") == nsInode(t, self, "uts"); got {
				t.Error("pause shares the host UTS namespace")
			}
			if newPID := nsInode(t, p.Pid(), "pid") != nsInode(t, self, "pid"); newPID != tt.cfg.NewPID {
				t.Errorf("new PID namespace = %v, want %v", newPID, tt.cfg.NewPID)
			}
			if tt.cfg.Hostname != "" {
				if got := nsenter(t, nil, p.Pid(), "-u", "hostname"); got != tt.cfg.Hostname {
					t.Errorf("hostname = %q, want %q", got, tt.cfg.Hostname)
				}
			}
			for k, v := range tt.cfg.Sysctls {
				path := "/proc/sys/" + strings.ReplaceAll(k, ".", "/")
				if got := nsenter(t, nil, p.Pid(), "-i", "cat", path); got != v {
					t.Errorf("%s in pod = %q, want %q", k, got, v)
				}
			}

			if err := p.Stop(ctx, tt.grace); err != nil {
				t.Fatal(err)
			}
			status, _, ok := p.Exited()
			if !ok || status != tt.want {
				t.Errorf("exit = %d (exited %v), want %d", status, ok, tt.want)
			}
		})
	}
}

func TestStartReportsErrors(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"missing netns", Config{NetNSPath: "/nonexistent/netns"}, "open netns /nonexistent/netns"},
		{"unknown sysctl", Config{NewIPC: true, Sysctls: map[string]string{"kernel.shm_no_such_thing": "1"}}, "sysctl kernel.shm_no_such_thing"},
		{"hostname without UTS namespace", Config{Hostname: "x"}, "needs a new UTS namespace"},
		{"newline in sysctl", Config{Sysctls: map[string]string{"a": "1\nb=2"}}, "invalid sysctl"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Start(context.Background(), tt.cfg)
			if err == nil {
				_ = p.Stop(context.Background(), 0)
				t.Fatal("Start succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not mention %q", err, tt.want)
			}
		})
	}
}

// TestStartUserNS: with UserNS the pause process is root of a new user namespace that
// maps 0 -> 100000, and its network, IPC, UTS and PID namespaces belong to that user
// namespace, so it can set the hostname and a network sysctl in them.
func TestStartUserNS(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	ctx := context.Background()
	cfg := Config{
		NewIPC: true, NewUTS: true, NewPID: true, NewNet: true,
		UserNS:   &IDMap{UID: Range{HostID: 100000, Size: 65536}, GID: Range{HostID: 100000, Size: 65536}},
		Hostname: "userns-pause",
		Sysctls:  map[string]string{"net.ipv4.ip_unprivileged_port_start": "80", "kernel.shm_rmid_forced": "1"},
	}
	p, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(ctx, 0) })
	uidMap, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", p.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(uidMap)); strings.Join(got, " ") != "0 100000 65536" {
		t.Errorf("uid_map = %q, want 0 100000 65536", uidMap)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(status), "\nUid:\t100000\t100000\t100000\t100000\n") {
		t.Errorf("pause process is not the namespace's root (host uid 100000):\n%s", status)
	}
	userns := nsInode(t, p.Pid(), "user")
	if userns == nsInode(t, os.Getpid(), "user") {
		t.Fatal("pause shares the host user namespace")
	}
	for _, kind := range []string{"net", "ipc", "uts", "pid_for_children"} {
		fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/%s", p.Pid(), kind), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		owner, err := unix.IoctlRetInt(fd, unix.NS_GET_USERNS)
		unix.Close(fd)
		if err != nil {
			t.Fatalf("NS_GET_USERNS %s: %v", kind, err)
		}
		var st unix.Stat_t
		err = unix.Fstat(owner, &st)
		unix.Close(owner)
		if err != nil {
			t.Fatal(err)
		}
		if st.Ino != userns {
			t.Errorf("%s namespace is owned by user namespace %d, want the pod's %d", kind, st.Ino, userns)
		}
	}
	if got := nsenter(t, nil, p.Pid(), "-u", "hostname"); got != cfg.Hostname {
		t.Errorf("hostname = %q, want %q", got, cfg.Hostname)
	}
	if got := nsenter(t, nil, p.Pid(), "-n", "cat", "/proc/sys/net/ipv4/ip_unprivileged_port_start"); got != "80" {
		t.Errorf("net sysctl in pod = %q, want 80", got)
	}
	if got := nsenter(t, nil, p.Pid(), "-i", "cat", "/proc/sys/kernel/shm_rmid_forced"); got != "1" {
		t.Errorf("ipc sysctl in pod = %q, want 1", got)
	}
	// The pod's mqueue filesystem belongs to the namespace's root, so a container's
	// runtime may label its /dev/mqueue (SELinux): made in the clone it belonged to
	// the host's root, unmapped there (65534 inside).
	out, err := exec.Command("nsenter", "-t", fmt.Sprint(p.Pid()), "-U", "-i", "--", "unshare", "-m", "sh", "-c",
		"mount -t mqueue mqueue /mnt && stat -c %u:%g /mnt").CombinedOutput()
	if got := strings.TrimSpace(string(out)); err != nil || got != "0:0" {
		t.Errorf("owner of the pod's mqueue filesystem inside = %q (%v), want 0:0", got, err)
	}

	if _, err := Start(ctx, Config{NewNet: true, NetNSPath: "/proc/self/ns/net"}); err == nil {
		t.Error("Start with NewNet and a netns path succeeded")
	}
}

// ownerUserNS returns the inode of the user namespace owning /proc/pid/ns/kind.
func ownerUserNS(t *testing.T, pid int, kind string) uint64 {
	t.Helper()
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/%s", pid, kind), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	owner, err := unix.IoctlRetInt(fd, unix.NS_GET_USERNS)
	if err != nil {
		t.Fatalf("NS_GET_USERNS %s: %v", kind, err)
	}
	defer unix.Close(owner)
	var st unix.Stat_t
	if err := unix.Fstat(owner, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestStartJoinUserNS: with JoinUserNS the pause process joins the user namespace that
// owns the network namespace it is given (as containerd makes a user-namespaced pod's
// netns: inside the pod's user namespace), becomes its root, and its new IPC, UTS and
// PID namespaces belong to that user namespace; it is PID 1 of its PID namespace, a
// child of the caller (adopted through the reaper), and stops like any pause process.
func TestStartJoinUserNS(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := reaper.New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	go r.Run(ctx)

	// The user namespace with its network namespace, as containerd leaves them.
	holder := exec.Command("sleep", "60")
	holder.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNET,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}},
	}
	if err := r.Start(holder); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = r.Wait(holder) })
	netns := fmt.Sprintf("/proc/%d/ns/net", holder.Process.Pid)

	cfg := Config{
		NetNSPath: netns, JoinUserNS: true,
		NewIPC: true, NewUTS: true, NewPID: true,
		Hostname: "joined-pause",
		Sysctls:  map[string]string{"net.ipv4.ip_unprivileged_port_start": "80"},
		Runner:   r,
	}
	p, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(ctx, 0) })
	userns := nsInode(t, holder.Process.Pid, "user")
	if got := nsInode(t, p.Pid(), "user"); got != userns {
		t.Errorf("pause user namespace %d, want the netns owner's %d", got, userns)
	}
	if got := nsInode(t, p.Pid(), "net"); got != nsInode(t, holder.Process.Pid, "net") {
		t.Errorf("pause network namespace %d is not the given one", got)
	}
	for _, kind := range []string{"ipc", "uts", "pid"} {
		if nsInode(t, p.Pid(), kind) == nsInode(t, os.Getpid(), kind) {
			t.Errorf("pause shares the host's %s namespace", kind)
		}
		if got := ownerUserNS(t, p.Pid(), kind); got != userns {
			t.Errorf("%s namespace owned by user namespace %d, want %d", kind, got, userns)
		}
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nUid:\t100000\t100000\t100000\t100000\n", "\nGid:\t100000\t100000\t100000\t100000\n",
		fmt.Sprintf("\nNSpid:\t%d\t1\n", p.Pid()), fmt.Sprintf("\nPPid:\t%d\n", os.Getpid())} {
		if !strings.Contains(string(status), want) {
			t.Errorf("pause /proc/pid/status lacks %q:\n%s", want, status)
		}
	}
	if got := nsenter(t, r, p.Pid(), "-u", "hostname"); got != cfg.Hostname {
		t.Errorf("hostname = %q, want %q", got, cfg.Hostname)
	}
	if got := nsenter(t, r, p.Pid(), "-n", "cat", "/proc/sys/net/ipv4/ip_unprivileged_port_start"); got != "80" {
		t.Errorf("net sysctl in pod = %q, want 80", got)
	}
	if err := p.Stop(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if st, _, ok := p.Exited(); !ok || st != 0 {
		t.Errorf("pause exit after SIGTERM: %d %v, want 0", st, ok)
	}

	// Without a new PID namespace nothing is forked: the started process is the pause.
	// Start leaves no end of a ready pipe open in the shim.
	pipes := openPipes(t)
	flat, err := Start(ctx, Config{NetNSPath: netns, JoinUserNS: true, NewIPC: true, Runner: r})
	if err != nil {
		t.Fatal(err)
	}
	if got := nsInode(t, flat.Pid(), "user"); got != userns {
		t.Errorf("pause without a PID namespace: user namespace %d, want %d", got, userns)
	}
	if nsInode(t, flat.Pid(), "pid") != nsInode(t, os.Getpid(), "pid") || ownerUserNS(t, flat.Pid(), "ipc") != userns {
		t.Error("pause without a PID namespace: want the host's PID namespace and an IPC namespace of the pod's user namespace")
	}
	if err := flat.Stop(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if got := openPipes(t); got != pipes {
		t.Errorf("open pipe fds: %d after a joined pause's Start and Stop, %d before", got, pipes)
	}

	// The forked pause process failing after its pid was reported (an unknown sysctl)
	// fails Start with its message, and is reaped: no pause process is left.
	bad := cfg
	bad.Sysctls = map[string]string{"net.ipv4.no_such_sysctl": "1"}
	if _, err := Start(ctx, bad); err == nil || !strings.Contains(err.Error(), "net.ipv4.no_such_sysctl") {
		t.Errorf("Start with an unknown sysctl: %v, want an error naming it", err)
	}
	if left := pauseChildren(t); len(left) > 0 {
		t.Errorf("pause processes left: %v", left)
	}

	// A network namespace of the host's user namespace has no pod user namespace to
	// join: the pause process refuses to become root of the host's.
	if _, err := Start(ctx, Config{NetNSPath: "/proc/self/ns/net", JoinUserNS: true, NewPID: true, Runner: r}); err == nil ||
		!strings.Contains(err.Error(), "setns to the user namespace owning /proc/self/ns/net") {
		t.Errorf("Start joining the user namespace of a host-owned netns: %v, want the starter's setns error", err)
	}
}

// openPipes counts this process's open pipe fds.
func openPipes(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && strings.HasPrefix(l, "pipe:") {
			n++
		}
	}
	return n
}

// pauseChildren lists the pids of this process's children named crisp-pause.
func pauseChildren(t *testing.T) []string {
	t.Helper()
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range dirs {
		status, err := os.ReadFile("/proc/" + d.Name() + "/status")
		if err != nil {
			continue
		}
		if strings.Contains(string(status), "Name:\tcrisp-pause\n") && strings.Contains(string(status), fmt.Sprintf("\nPPid:\t%d\n", os.Getpid())) {
			out = append(out, d.Name())
		}
	}
	return out
}

// TestStartSELinuxLabel: the pause is asked to take a label once its namespaces are
// set up. Without SELinux (this host) the kernel refuses it and the pause runs on
// unlabelled, as under a policy that refuses the transition; a label that would
// smuggle another environment entry is refused before anything starts. The label
// taken under enforcing is proven in the SELinux node VM (TestNodeSELinuxLabels).
func TestStartSELinuxLabel(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	ctx := context.Background()
	const label = "system_u:system_r:container_t:s0:c1,c2"
	p, err := Start(ctx, Config{NewUTS: true, Hostname: "labelled", SELinuxLabel: label})
	if err != nil {
		t.Fatalf("a label the kernel refuses stops the pause: %v", err)
	}
	t.Cleanup(func() { _ = p.Stop(ctx, 0) })
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(env, []byte(envSELinuxLabel+"="+label+"\x00")) {
		t.Errorf("the pause was not given the label: %q", env)
	}
	if got := nsenter(t, nil, p.Pid(), "-u", "hostname"); got != "labelled" {
		t.Errorf("hostname = %q", got)
	}
	if got := p.Label(); got != "" {
		t.Errorf("Label() without SELinux = %q, want empty", got)
	}

	if _, err := Start(ctx, Config{SELinuxLabel: label + "\n_CRISP_NETNS=/proc/1/ns/net"}); err == nil || !strings.Contains(err.Error(), "invalid SELinux label") {
		t.Errorf("a label with a newline: %v", err)
	}
}

// TestStartOOMScoreAdj: the pause writes its own oom_score_adj (before it could take
// a label that keeps the shim from writing it).
func TestStartOOMScoreAdj(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	ctx := context.Background()
	data, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		t.Fatal(err)
	}
	own, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	want := min(own+7, 1000)
	p, err := Start(ctx, Config{NewUTS: true, OOMScoreAdj: &want})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(ctx, 0) })
	got, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", p.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(got)) != strconv.Itoa(want) {
		t.Errorf("pause oom_score_adj = %s, want %d", got, want)
	}
}
