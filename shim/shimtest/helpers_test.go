package shimtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bootstrap "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	sandboxapi "github.com/crisp-runtime/crisp/api/containerd/sandbox/v1"
	optionsv1 "github.com/crisp-runtime/crisp/api/options/v1"
	"github.com/crisp-runtime/crisp/internal/version"
	kitpod "github.com/crisp-runtime/crisp/pkg/shimkit/pod"
)

// rootWhy is what the shim tests need root for (testutil.RequiresRoot).
const rootWhy = "the shim creates namespaces, cgroups and sockets under /run"

// shimBin is the binary under test, built once by TestMain.
var shimBin string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if os.Geteuid() != 0 {
		// Every test skips itself with the reason; nothing to build.
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "shimtest-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	shimBin = filepath.Join(dir, "shim-runc")
	root, err := moduleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// make, so that the tests run the shim as `make build` links it (static).
	build := exec.Command("make", "-s", "shim", "BINDIR="+dir, "VERSION="+version.Version)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build shim-runc: %v\n%s", err, out)
		return 1
	}
	// Shims detach from `start` with setsid; as subreaper the test process inherits
	// them (and their pause processes once a shim is killed), so it can reap them
	// instead of leaving zombies to init.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Built on first use by the container tests (task_test.go).
	defer removeBusyboxLower()
	return m.Run()
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

func randSuffix(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// shortTempDir is for socket dirs: t.TempDir paths can push a socket past 106 bytes.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "cs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// shimProc is one shim started by a test.
type shimProc struct {
	t                    *testing.T
	id, ns, addr, bundle string
	socket               string
	pid                  int
	client               *ttrpc.Client
	sb                   sandboxapi.TTRPCSandboxService
}

type startOpts struct {
	bootstrap bool   // send BootstrapParams on stdin
	socketDir string // BootstrapParams.socket_dir
	stdin     []byte // raw stdin for the legacy path
}

// runStart runs `shim-runc start` and returns its stdout.
func runStart(t *testing.T, id, ns, addr, bundle string, o startOpts) []byte {
	t.Helper()
	cmd := exec.Command(shimBin, "-namespace", ns, "-address", addr, "-publish-binary", "/usr/bin/true", "-id", id, "start")
	cmd.Dir = bundle
	cmd.Env = append(os.Environ(), "TTRPC_ADDRESS="+addr+".ttrpc", "GRPC_ADDRESS="+addr, "NAMESPACE="+ns, "MAX_SHIM_VERSION=2", "GOMAXPROCS=2")
	stdin := o.stdin
	if o.bootstrap {
		p := &bootstrap.BootstrapParams{
			InstanceID:            id,
			Namespace:             ns,
			ContainerdGrpcAddress: addr,
			LogLevel:              bootstrap.LogLevel_LOG_LEVEL_DEBUG,
		}
		if o.socketDir != "" {
			p.SocketDir = &o.socketDir
		}
		var err error
		if stdin, err = proto.Marshal(p); err != nil {
			t.Fatal(err)
		}
	}
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("start: %v\nstderr: %s", err, stderr.String())
	}
	if stderr.Len() > 0 {
		// containerd reads stdout and stderr together: anything here corrupts the result.
		t.Fatalf("start wrote to stderr: %s", stderr.String())
	}
	return stdout.Bytes()
}

// startShim starts a shim through the bootstrap protocol and connects to it. Cleanup
// kills it and runs `delete`, so nothing of it survives the test.
func startShim(t *testing.T) *shimProc {
	t.Helper()
	s := &shimProc{
		t:      t,
		id:     "shimtest-" + randSuffix(t),
		ns:     "shimtest",
		addr:   "/run/crisp-shimtest.sock",
		bundle: t.TempDir(),
	}
	out := runStart(t, s.id, s.ns, s.addr, s.bundle, startOpts{bootstrap: true, socketDir: shortTempDir(t)})
	var res bootstrap.BootstrapResult
	if err := proto.Unmarshal(out, &res); err != nil {
		t.Fatalf("start output %q is not a BootstrapResult: %v", out, err)
	}
	s.socket = strings.TrimPrefix(res.GetAddress(), "unix://")
	s.pid = readPid(t, s.bundle)
	t.Cleanup(s.cleanup)
	s.connect()
	return s
}

func (s *shimProc) connect() {
	s.t.Helper()
	conn, err := net.Dial("unix", s.socket)
	if err != nil {
		s.t.Fatalf("dial shim: %v", err)
	}
	s.client = ttrpc.NewClient(conn)
	s.sb = sandboxapi.NewTTRPCSandboxClient(s.client)
}

func (s *shimProc) cleanup() {
	if s.client != nil {
		s.client.Close()
	}
	if alive(s.pid) {
		_ = unix.Kill(s.pid, unix.SIGKILL)
	}
	waitGone(s.t, s.pid)
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(shimBin, "-namespace", s.ns, "-address", s.addr, "-id", s.id, "-bundle", s.bundle, "delete")
	cmd.Dir = s.bundle
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		s.t.Errorf("cleanup delete: %v: %s", err, stderr.String())
	}
	if st, err := kitpod.ReadState(s.bundle); err == nil && st.PausePid > 0 {
		waitGone(s.t, st.PausePid)
	}
}

func readPid(t *testing.T, bundle string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(bundle, "shim.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(string(data))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(data, ')')
	return i > 0 && i+2 < len(data) && data[i+2] != 'Z'
}

// waitGone waits for pid to exit, reaping it if it became the test's child.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		if _, serr := os.Stat(fmt.Sprintf("/proc/%d", pid)); errors.Is(serr, os.ErrNotExist) {
			return
		}
		if errors.Is(err, unix.ECHILD) && !alive(pid) {
			return // a zombie of someone else's; it no longer runs
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still exists", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func optionsAny(t *testing.T, o *optionsv1.SandboxOptions) *anypb.Any {
	t.Helper()
	a, err := anypb.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// netns creates a named network namespace for the test and deletes it afterwards.
func netns(t *testing.T) string {
	t.Helper()
	name := "crisp-shimtest-" + randSuffix(t)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns delete %s: %v: %s", name, err, out)
		}
	})
	return "/run/netns/" + name
}

// cgroupParent returns a fresh cgroupfs parent and removes it from every hierarchy
// afterwards (the shim removes only the pod's leaf, as it should).
func cgroupParent(t *testing.T) string {
	t.Helper()
	parent := "/crisp-shimtest-" + randSuffix(t)
	t.Cleanup(func() {
		roots, _ := filepath.Glob("/sys/fs/cgroup/*")
		for _, root := range roots {
			dir := filepath.Join(root, parent)
			if _, err := os.Stat(dir); err != nil {
				continue
			}
			subs, _ := filepath.Glob(filepath.Join(dir, "*"))
			for _, sub := range subs {
				if fi, err := os.Stat(sub); err == nil && fi.IsDir() {
					_ = os.Remove(sub)
				}
			}
			if err := os.Remove(dir); err != nil {
				t.Errorf("remove test cgroup parent: %v", err)
			}
		}
	})
	return parent
}

func nsInode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// inNS runs a command in some namespaces of pid and returns its trimmed output.
func inNS(t *testing.T, pid int, flag string, args ...string) string {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"-t", strconv.Itoa(pid), flag, "--"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nsenter %s %v: %v: %s", flag, args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func readTrim(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

// memoryCgroup is the pause's cgroup in the memory hierarchy, from /proc/PID/cgroup.
func memoryCgroup(t *testing.T, pid int) string {
	t.Helper()
	for _, line := range strings.Split(readTrim(t, fmt.Sprintf("/proc/%d/cgroup", pid)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && parts[1] == "memory" {
			return parts[2]
		}
	}
	t.Fatalf("pid %d has no memory cgroup", pid)
	return ""
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}
