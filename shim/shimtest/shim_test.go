package shimtest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	bootstrap "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/opencontainers/runtime-spec/specs-go/features"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	sandboxapi "github.com/crisp-runtime/crisp/api/containerd/sandbox/v1"
	taskapi "github.com/crisp-runtime/crisp/api/containerd/task/v3"
	"github.com/crisp-runtime/crisp/api/containerd/types"
	optionsv1 "github.com/crisp-runtime/crisp/api/options/v1"
	"github.com/crisp-runtime/crisp/internal/testutil"
	"github.com/crisp-runtime/crisp/internal/version"
	kitpod "github.com/crisp-runtime/crisp/pkg/shimkit/pod"
)

// TestStart covers both start protocols: what is printed, where the socket lives, that it
// answers, and that a second start for the same id finds the running shim.
func TestStart(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	runcOpts, err := anypb.New(&options.Options{BinaryName: "runc", SystemdCgroup: true})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		opts startOpts
		// socketDir is where the socket must appear ("" = the default dir).
		customDir bool
	}{
		{name: "bootstrap params", opts: startOpts{bootstrap: true}, customDir: true},
		{name: "legacy, empty stdin", opts: startOpts{}},
		{name: "legacy, runtime options on stdin", opts: startOpts{stdin: mustMarshal(t, runcOpts)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, ns, addr := "shimtest-"+randSuffix(t), "k8s.io", "/run/containerd/containerd.sock"
			bundle := t.TempDir()
			dir := "/run/crisp/s"
			if tt.customDir {
				dir = shortTempDir(t)
				tt.opts.socketDir = dir
			}
			sum := sha256.Sum256([]byte(addr + "/" + ns + "/" + id))
			wantSocket := filepath.Join(dir, hex.EncodeToString(sum[:]))
			wantAddr := "unix://" + wantSocket

			out := runStart(t, id, ns, addr, bundle, tt.opts)
			s := &shimProc{t: t, id: id, ns: ns, addr: addr, bundle: bundle, socket: wantSocket, pid: readPid(t, bundle)}
			t.Cleanup(s.cleanup)

			gotAddr := string(out)
			if tt.opts.bootstrap {
				var res bootstrap.BootstrapResult
				if err := proto.Unmarshal(out, &res); err != nil {
					t.Fatalf("output %q is not a BootstrapResult: %v", out, err)
				}
				if res.GetVersion() != 3 || res.GetProtocol() != "ttrpc" {
					t.Errorf("result = %v, want version 3, protocol ttrpc", &res)
				}
				gotAddr = res.GetAddress()
			}
			if gotAddr != wantAddr {
				t.Fatalf("address = %q, want %q", gotAddr, wantAddr)
			}
			for path, want := range map[string]os.FileMode{wantSocket: 0o600, dir: 0o700} {
				if tt.customDir || path == wantSocket {
					fi, err := os.Stat(path)
					if err != nil {
						t.Fatal(err)
					}
					if fi.Mode().Perm() != want {
						t.Errorf("%s mode = %v, want %v", path, fi.Mode().Perm(), want)
					}
				}
			}

			s.connect()
			if _, err := s.sb.PingSandbox(ctxT(t), &sandboxapi.PingRequest{SandboxID: id}); err != nil {
				t.Fatalf("ping: %v", err)
			}
			if _, err := s.sb.Platform(ctxT(t), &sandboxapi.PlatformRequest{SandboxID: id}); err != nil {
				t.Fatalf("platform: %v", err)
			}

			again := runStart(t, id, ns, addr, bundle, tt.opts)
			if !bytes.Equal(again, out) {
				t.Errorf("second start printed %q, want %q", again, out)
			}
			if pid := readPid(t, bundle); pid != s.pid {
				t.Errorf("second start spawned shim %d; %d already serves the id", pid, s.pid)
			}
			if !tt.opts.bootstrap {
				// A legacy caller (containerd 1.6-2.2) runs start for each of the
				// pod's containers too: the spec's sandbox id gives them the pod's
				// shim, as containerd's runc shim does.
				ctrBundle := t.TempDir()
				spec := `{"annotations":{"io.kubernetes.cri.sandbox-id":"` + id + `"}}`
				if err := os.WriteFile(filepath.Join(ctrBundle, "config.json"), []byte(spec), 0o600); err != nil {
					t.Fatal(err)
				}
				if got := runStart(t, id+"-ctr", ns, addr, ctrBundle, tt.opts); !bytes.Equal(got, out) {
					t.Errorf("a container's start printed %q, want the pod's %q", got, out)
				}
				if _, err := os.Stat(filepath.Join(ctrBundle, "shim.pid")); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("a container's start spawned a shim of its own (%v)", err)
					own := &shimProc{t: t, id: id + "-ctr", ns: ns, addr: addr, bundle: ctrBundle, pid: readPid(t, ctrBundle)}
					t.Cleanup(own.cleanup)
				}
			}

			if _, err := s.sb.ShutdownSandbox(ctxT(t), &sandboxapi.ShutdownSandboxRequest{SandboxID: id}); err != nil {
				t.Fatalf("shutdown: %v", err)
			}
			waitGone(t, s.pid)
			if _, err := os.Stat(wantSocket); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("socket still there after shutdown: %v", err)
			}
		})
	}
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSandboxLifecycle creates and starts sandboxes with different namespace modes and
// checks the pause process from the outside, then stops and shuts them down.
func TestSandboxLifecycle(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	hostShm := readTrim(t, "/proc/sys/kernel/shm_rmid_forced")
	hostPort := readTrim(t, "/proc/sys/net/ipv4/ip_unprivileged_port_start")
	podShm := map[string]string{"0": "1", "1": "0"}[hostShm]
	podPort := "0"
	if hostPort == "0" {
		podPort = "1000"
	}
	ownOOM, _ := strconv.Atoi(readTrim(t, "/proc/self/oom_score_adj"))

	tests := []struct {
		name       string
		podNetwork bool
		opts       *optionsv1.SandboxOptions
		stopSecs   uint32
		wantExit   uint32
		wantOOM    int
	}{
		{
			name:       "pod namespaces",
			podNetwork: true,
			opts: &optionsv1.SandboxOptions{
				Hostname: "web-0",
				Sysctls: map[string]string{
					"kernel.shm_rmid_forced":              podShm,
					"net.ipv4.ip_unprivileged_port_start": podPort,
				},
				// Below the shim's own score: must be clamped, not fail.
				OomScoreAdj: -998,
			},
			stopSecs: 5,
			wantExit: 0, // SIGTERM: the pause exits cleanly
			wantOOM:  max(-998, ownOOM),
		},
		{
			name: "host namespaces",
			opts: &optionsv1.SandboxOptions{
				Network: optionsv1.NamespaceMode_NODE,
				Pid:     optionsv1.NamespaceMode_NODE,
				Ipc:     optionsv1.NamespaceMode_NODE,
				Uts:     optionsv1.NamespaceMode_NODE,
				// Above the shim's own score: applied as asked.
				OomScoreAdj: 500,
			},
			stopSecs: 0,
			wantExit: 137, // no grace: SIGKILL
			wantOOM:  500,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := ctxT(t)
			s := startShim(t)
			tt.opts.CgroupParent = cgroupParent(t)
			var nsPath string
			if tt.podNetwork {
				nsPath = netns(t)
			}
			if _, err := s.sb.CreateSandbox(ctx, &sandboxapi.CreateSandboxRequest{
				SandboxID: s.id, BundlePath: s.bundle, NetnsPath: nsPath, Options: optionsAny(t, tt.opts),
			}); err != nil {
				t.Fatalf("create: %v", err)
			}
			cgPath := tt.opts.CgroupParent + "/crisp-" + s.id
			cgDir := "/sys/fs/cgroup/memory" + cgPath
			if _, err := os.Stat(cgDir); err != nil {
				t.Fatalf("pod cgroup not created: %v", err)
			}

			started, err := s.sb.StartSandbox(ctx, &sandboxapi.StartSandboxRequest{SandboxID: s.id})
			if err != nil {
				t.Fatalf("start: %v", err)
			}
			pid := int(started.GetPid())
			again, err := s.sb.StartSandbox(ctx, &sandboxapi.StartSandboxRequest{SandboxID: s.id})
			if err != nil || again.GetPid() != started.GetPid() {
				t.Fatalf("second start = %v, %v; want the same pid %d", again, err, pid)
			}

			// Namespaces.
			self := os.Getpid()
			samePod := func(kind string) bool {
				return nsInode(t, fmt.Sprintf("/proc/%d/ns/%s", pid, kind)) == nsInode(t, fmt.Sprintf("/proc/%d/ns/%s", self, kind))
			}
			if tt.podNetwork {
				if nsInode(t, fmt.Sprintf("/proc/%d/ns/net", pid)) != nsInode(t, nsPath) {
					t.Error("pause is not in the given network namespace")
				}
			} else if !samePod("net") {
				t.Error("host network: pause must stay in the host netns")
			}
			for kind, mode := range map[string]optionsv1.NamespaceMode{"pid": tt.opts.Pid, "ipc": tt.opts.Ipc, "uts": tt.opts.Uts} {
				if host := samePod(kind); host != (mode == optionsv1.NamespaceMode_NODE) {
					t.Errorf("%s namespace shared with host = %v, mode %v", kind, host, mode)
				}
			}
			if tt.opts.Pid != optionsv1.NamespaceMode_NODE {
				if nspid := readTrim(t, fmt.Sprintf("/proc/%d/status", pid)); !strings.Contains(nspid, fmt.Sprintf("NSpid:\t%d\t1", pid)) {
					t.Error("pause is not PID 1 of its PID namespace")
				}
			}
			if tt.opts.Hostname != "" {
				if got := inNS(t, pid, "-u", "hostname"); got != tt.opts.Hostname {
					t.Errorf("hostname = %q, want %q", got, tt.opts.Hostname)
				}
			}

			// Sysctls land in the pod's namespaces only.
			if len(tt.opts.Sysctls) > 0 {
				if got := inNS(t, pid, "-i", "cat", "/proc/sys/kernel/shm_rmid_forced"); got != podShm {
					t.Errorf("pod kernel.shm_rmid_forced = %s, want %s", got, podShm)
				}
				if got := inNS(t, pid, "-n", "cat", "/proc/sys/net/ipv4/ip_unprivileged_port_start"); got != podPort {
					t.Errorf("pod net.ipv4.ip_unprivileged_port_start = %s, want %s", got, podPort)
				}
				if got := readTrim(t, "/proc/sys/kernel/shm_rmid_forced"); got != hostShm {
					t.Errorf("host kernel.shm_rmid_forced changed to %s", got)
				}
				if got := readTrim(t, "/proc/sys/net/ipv4/ip_unprivileged_port_start"); got != hostPort {
					t.Errorf("host ip_unprivileged_port_start changed to %s", got)
				}
			}

			// Cgroup and OOM score.
			if got := memoryCgroup(t, pid); got != cgPath {
				t.Errorf("pause memory cgroup = %s, want %s", got, cgPath)
			}
			if procs := readTrim(t, cgDir+"/cgroup.procs"); procs != strconv.Itoa(pid) {
				t.Errorf("pod cgroup.procs = %q, want just %d", procs, pid)
			}
			if got := readTrim(t, fmt.Sprintf("/proc/%d/oom_score_adj", pid)); got != strconv.Itoa(tt.wantOOM) {
				t.Errorf("pause oom_score_adj = %s, want %d", got, tt.wantOOM)
			}
			if clamped := int(tt.opts.OomScoreAdj) < ownOOM; clamped != strings.Contains(readTrim(t, filepath.Join(s.bundle, "shim.log")), "oom_score_adj clamped") {
				t.Errorf("clamp logged = %v, want %v", !clamped, clamped)
			}

			// Status and the record for delete.
			st, err := s.sb.SandboxStatus(ctx, &sandboxapi.SandboxStatusRequest{SandboxID: s.id, Verbose: true})
			if err != nil {
				t.Fatal(err)
			}
			if st.GetState() != kitpod.StateReady || st.GetPid() != uint32(pid) || st.GetCreatedAt() == nil {
				t.Errorf("status = %v", st)
			}
			for k, want := range map[string]string{"shim_pid": strconv.Itoa(s.pid), "pause_pid": strconv.Itoa(pid), "cgroup": cgPath} {
				if got := st.GetInfo()[k]; got != want {
					t.Errorf("info[%s] = %q, want %q", k, got, want)
				}
			}
			rec, err := kitpod.ReadState(s.bundle)
			if err != nil {
				t.Fatal(err)
			}
			if rec.PausePid != pid || rec.PauseStartTime == 0 || rec.Cgroup.Path != cgPath || rec.Cgroup.Driver != "cgroupfs" {
				t.Errorf("sandbox.json = %+v", rec)
			}

			// Stop: pause and cgroup gone; stopping again is fine.
			if _, err := s.sb.StopSandbox(ctx, &sandboxapi.StopSandboxRequest{SandboxID: s.id, TimeoutSecs: tt.stopSecs}); err != nil {
				t.Fatalf("stop: %v", err)
			}
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("pause %d still exists after stop", pid)
			}
			if _, err := os.Stat(cgDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("pod cgroup still exists after stop: %v", err)
			}
			if _, err := s.sb.StopSandbox(ctx, &sandboxapi.StopSandboxRequest{SandboxID: s.id}); err != nil {
				t.Errorf("second stop: %v", err)
			}
			wait, err := s.sb.WaitSandbox(ctx, &sandboxapi.WaitSandboxRequest{SandboxID: s.id})
			if err != nil {
				t.Fatal(err)
			}
			if wait.GetExitStatus() != tt.wantExit || wait.GetExitedAt() == nil {
				t.Errorf("wait = %v, want exit status %d", wait, tt.wantExit)
			}
			st, err = s.sb.SandboxStatus(ctx, &sandboxapi.SandboxStatusRequest{SandboxID: s.id})
			if err != nil || st.GetState() != kitpod.StateNotReady || st.GetExitedAt() == nil {
				t.Errorf("status after stop = %v, %v", st, err)
			}
			if _, err := s.sb.StartSandbox(ctx, &sandboxapi.StartSandboxRequest{SandboxID: s.id}); status.Code(err) != codes.FailedPrecondition {
				t.Errorf("start after stop: %v, want FailedPrecondition", err)
			}

			// Shutdown: the shim exits and takes its socket with it.
			if _, err := s.sb.ShutdownSandbox(ctx, &sandboxapi.ShutdownSandboxRequest{SandboxID: s.id}); err != nil {
				t.Fatalf("shutdown: %v", err)
			}
			waitGone(t, s.pid)
			if _, err := os.Stat(s.socket); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("socket still there after shutdown: %v", err)
			}
		})
	}
}

// TestWaitSandboxBlocks checks that WaitSandbox returns only once the pause exits, and
// that an unexpected pause death shows in the status.
func TestWaitSandboxBlocks(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	ctx := ctxT(t)
	s := startShim(t)
	opts := &optionsv1.SandboxOptions{CgroupParent: cgroupParent(t)}
	if _, err := s.sb.CreateSandbox(ctx, &sandboxapi.CreateSandboxRequest{SandboxID: s.id, Options: optionsAny(t, opts)}); err != nil {
		t.Fatal(err)
	}
	started, err := s.sb.StartSandbox(ctx, &sandboxapi.StartSandboxRequest{SandboxID: s.id})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		resp *sandboxapi.WaitSandboxResponse
		err  error
	}
	waited := make(chan result, 1)
	go func() {
		r, err := s.sb.WaitSandbox(ctx, &sandboxapi.WaitSandboxRequest{SandboxID: s.id})
		waited <- result{r, err}
	}()
	select {
	case r := <-waited:
		t.Fatalf("WaitSandbox returned while the pause runs: %v, %v", r.resp, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := unix.Kill(int(started.GetPid()), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	r := <-waited
	if r.err != nil || r.resp.GetExitStatus() != 137 {
		t.Fatalf("wait = %v, %v; want exit status 137", r.resp, r.err)
	}
	st, err := s.sb.SandboxStatus(ctx, &sandboxapi.SandboxStatusRequest{SandboxID: s.id})
	if err != nil || st.GetState() != kitpod.StateNotReady {
		t.Fatalf("status = %v, %v; want NOTREADY", st, err)
	}
}

// TestDeleteAfterShimKilled kills the shim with SIGKILL and checks that `delete` kills
// the pause process, removes cgroup and socket, prints a DeleteResponse, and can run twice.
func TestDeleteAfterShimKilled(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	ctx := ctxT(t)
	s := startShim(t)
	parent := cgroupParent(t)
	opts := &optionsv1.SandboxOptions{CgroupParent: parent, Hostname: "doomed"}
	if _, err := s.sb.CreateSandbox(ctx, &sandboxapi.CreateSandboxRequest{SandboxID: s.id, NetnsPath: netns(t), Options: optionsAny(t, opts)}); err != nil {
		t.Fatal(err)
	}
	started, err := s.sb.StartSandbox(ctx, &sandboxapi.StartSandboxRequest{SandboxID: s.id})
	if err != nil {
		t.Fatal(err)
	}
	pause := int(started.GetPid())
	s.client.Close()
	s.client = nil

	if err := unix.Kill(s.pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, s.pid)
	if !alive(pause) {
		t.Fatal("the pause process must survive its shim")
	}

	cgDir := "/sys/fs/cgroup/memory" + parent + "/crisp-" + s.id
	for i := range 2 {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(shimBin, "-namespace", s.ns, "-address", s.addr, "-publish-binary", "/usr/bin/true", "-id", s.id, "-bundle", s.bundle, "delete")
		cmd.Dir = s.bundle
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("delete #%d: %v: %s", i+1, err, stderr.String())
		}
		var resp taskapi.DeleteResponse
		if err := proto.Unmarshal(stdout.Bytes(), &resp); err != nil {
			t.Fatalf("delete #%d output is not a DeleteResponse: %v", i+1, err)
		}
		if resp.GetPid() != uint32(pause) || resp.GetExitStatus() != 137 || resp.GetExitedAt() == nil {
			t.Errorf("delete #%d = %v, want pid %d, exit 137", i+1, &resp, pause)
		}
		waitGone(t, pause)
		if _, err := os.Stat(cgDir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pod cgroup still exists after delete: %v", err)
		}
		if _, err := os.Stat(s.socket); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket still there after delete: %v", err)
		}
	}
}

// TestSIGTERMShutsDown checks that SIGTERM to the shim cleans up like ShutdownSandbox.
func TestSIGTERMShutsDown(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	ctx := ctxT(t)
	s := startShim(t)
	parent := cgroupParent(t)
	if _, err := s.sb.CreateSandbox(ctx, &sandboxapi.CreateSandboxRequest{SandboxID: s.id, Options: optionsAny(t, &optionsv1.SandboxOptions{CgroupParent: parent})}); err != nil {
		t.Fatal(err)
	}
	started, err := s.sb.StartSandbox(ctx, &sandboxapi.StartSandboxRequest{SandboxID: s.id})
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(s.pid, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitGone(t, s.pid)
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", started.GetPid())); !errors.Is(err, os.ErrNotExist) {
		t.Error("pause survived SIGTERM to the shim")
	}
	for _, p := range []string{"/sys/fs/cgroup/memory" + parent + "/crisp-" + s.id, s.socket} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists: %v", p, err)
		}
	}
}

// TestCreateSandboxRejectsBadOptions checks that invalid requests fail as
// InvalidArgument and leave nothing behind.
func TestCreateSandboxRejectsBadOptions(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	ctx := ctxT(t)
	s := startShim(t)
	parent := cgroupParent(t)
	nsPath := netns(t)
	wrongType, err := anypb.New(&types.Platform{OS: "linux"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		id    string
		netns string
		opts  *optionsv1.SandboxOptions
		any   *anypb.Any
	}{
		{name: "sysctl with ..", netns: nsPath, opts: &optionsv1.SandboxOptions{Sysctls: map[string]string{"net..ipv4.ip_forward": "1"}}},
		{name: "sysctl with /", netns: nsPath, opts: &optionsv1.SandboxOptions{Sysctls: map[string]string{"net/ipv4/ip_forward": "1"}}},
		{name: "sysctl escaping /proc/sys", netns: nsPath, opts: &optionsv1.SandboxOptions{Sysctls: map[string]string{"../../etc/passwd": "x"}}},
		{name: "global sysctl", opts: &optionsv1.SandboxOptions{Sysctls: map[string]string{"vm.swappiness": "1"}}},
		{name: "net sysctl on host network", opts: &optionsv1.SandboxOptions{Sysctls: map[string]string{"net.ipv4.ip_forward": "1"}}},
		{name: "ipc sysctl with host ipc", opts: &optionsv1.SandboxOptions{Ipc: optionsv1.NamespaceMode_NODE, Sysctls: map[string]string{"kernel.shmmax": "1"}}},
		{name: "hostname with host uts", opts: &optionsv1.SandboxOptions{Uts: optionsv1.NamespaceMode_NODE, Hostname: "x"}},
		{name: "bad hostname", opts: &optionsv1.SandboxOptions{Hostname: "a b"}},
		{name: "netns with network NODE", netns: nsPath, opts: &optionsv1.SandboxOptions{Network: optionsv1.NamespaceMode_NODE}},
		{name: "netns not a namespace", netns: "/etc/hostname", opts: &optionsv1.SandboxOptions{}},
		{name: "netns of another kind", netns: "/proc/self/ns/ipc", opts: &optionsv1.SandboxOptions{}},
		{name: "unknown namespace mode", opts: &optionsv1.SandboxOptions{Pid: 7}},
		{name: "relative cgroup parent", opts: &optionsv1.SandboxOptions{CgroupParent: "crisp/x"}},
		{name: "cgroup parent escaping", opts: &optionsv1.SandboxOptions{CgroupParent: "/a/../../b"}},
		{name: "systemd parent not a slice", opts: &optionsv1.SandboxOptions{SystemdCgroup: true, CgroupParent: "/kubepods"}},
		{name: "oom score out of range", opts: &optionsv1.SandboxOptions{OomScoreAdj: 1001}},
		{name: "options of another type", any: wrongType},
		{name: "another sandbox id", id: "someone-else", opts: &optionsv1.SandboxOptions{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := tt.any
			if a == nil {
				tt.opts.CgroupParent = firstNonEmpty(tt.opts.CgroupParent, parent)
				a = optionsAny(t, tt.opts)
			}
			id := firstNonEmpty(tt.id, s.id)
			_, err := s.sb.CreateSandbox(ctx, &sandboxapi.CreateSandboxRequest{SandboxID: id, NetnsPath: tt.netns, Options: a})
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("create = %v, want InvalidArgument", err)
			}
		})
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory" + parent + "/crisp-" + s.id); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a rejected create left a cgroup: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.bundle, kitpod.StateFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a rejected create left %s", kitpod.StateFile)
	}
	// The shim is still usable after all that.
	if _, err := s.sb.CreateSandbox(ctx, &sandboxapi.CreateSandboxRequest{SandboxID: s.id, Options: optionsAny(t, &optionsv1.SandboxOptions{CgroupParent: parent})}); err != nil {
		t.Fatalf("valid create after rejections: %v", err)
	}
	if _, err := s.sb.CreateSandbox(ctx, &sandboxapi.CreateSandboxRequest{SandboxID: s.id}); status.Code(err) != codes.AlreadyExists {
		t.Errorf("second create = %v, want AlreadyExists", err)
	}
	for name, call := range map[string]func() error{
		"UpdateSandbox": func() error {
			_, err := s.sb.UpdateSandbox(ctx, &sandboxapi.UpdateSandboxRequest{SandboxID: s.id})
			return err
		},
	} {
		if err := call(); status.Code(err) != codes.Unimplemented {
			t.Errorf("%s = %v, want Unimplemented", name, err)
		}
	}
	if _, err := s.sb.ShutdownSandbox(ctx, &sandboxapi.ShutdownSandboxRequest{SandboxID: s.id}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, s.pid)
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestInfoAndVersion checks -info (protobuf RuntimeInfo) and the version flags.
func TestInfoAndVersion(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	out, err := exec.Command(shimBin, "-info").Output()
	if err != nil {
		t.Fatal(err)
	}
	var info types.RuntimeInfo
	if err := proto.Unmarshal(out, &info); err != nil {
		t.Fatal(err)
	}
	if info.GetName() != "crisp-shim-runc" || info.GetVersion().GetVersion() != version.Version {
		t.Errorf("info = %v", &info)
	}
	// The OCI features document, under the type URL containerd registers for it.
	if got, want := info.GetFeatures().GetTypeUrl(), "types.containerd.io/opencontainers/runtime-spec/1/features/Features"; got != want {
		t.Errorf("features type %q, want %q", got, want)
	}
	var feat features.Features
	if err := json.Unmarshal(info.GetFeatures().GetValue(), &feat); err != nil {
		t.Fatalf("features: %v", err)
	}
	if !slices.Contains(feat.MountOptions, "rro") || !slices.Contains(feat.Linux.Namespaces, "user") || feat.Linux.Seccomp == nil || !*feat.Linux.Seccomp.Enabled {
		t.Errorf("features lack rro, the user namespace or seccomp: %+v", feat)
	}
	// containerd offers CRI user namespaces only with idmap mounts claimed too.
	if idmap := feat.Linux.MountExtensions.IDMap; idmap == nil || idmap.Enabled == nil || !*idmap.Enabled {
		t.Errorf("features do not claim idmap mounts: %+v", idmap)
	}
	for _, flag := range []string{"-v", "-version", "--version"} {
		out, err := exec.Command(shimBin, flag).Output()
		if err != nil || !strings.Contains(string(out), version.Version) {
			t.Errorf("%s = %q, %v", flag, out, err)
		}
	}
	// Serve mode without the socket from `start` must refuse, not hang.
	if out, err := exec.Command(shimBin, "-id", "x").CombinedOutput(); err == nil || !strings.Contains(string(out), "fd 3") {
		t.Errorf("serve without fd 3 = %q, %v", out, err)
	}
}

// TestStartFailureLeavesNothing checks a failing start: exit 1, message on stderr, no socket.
func TestStartFailureLeavesNothing(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	bundle := t.TempDir()
	cmd := exec.Command(shimBin, "-namespace", "x", "-address", "a", "start")
	cmd.Dir = bundle
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(stderr.String(), "id") {
		t.Fatalf("start without id = %v, stderr %q; want exit 1 naming the id", err, stderr.String())
	}
	entries, _ := os.ReadDir(bundle)
	if len(entries) != 0 {
		t.Errorf("failed start left files in the bundle: %v", entries)
	}
}
