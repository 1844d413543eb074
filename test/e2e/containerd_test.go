package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"k8s.io/client-go/tools/remotecommand"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
	"github.com/crisp-runtime/crisp/internal/testutil"
)

// containerdVersion is the containerd hack/containerd.sh builds into its cache.
const containerdVersion = "2.4.2"

// ctrdHandlers are the runtime handlers the containerd test configures: crisp's shim
// (installed as containerd-shim-crisp-v1, runtime_type io.containerd.crisp.v1) once as
// containerd's sandbox (sandboxer "shim": the shim serves the Sandbox API and the
// pod's containers through the task API) and once as a plain task shim under
// containerd's own pause container (sandboxer "podsandbox"), and containerd's runc
// shim as the baseline.
var ctrdHandlers = []string{"crisp-pod", "crisp-shim", "runc"}

// ctrdLegacyHandlers run crisp's shim started with containerd 2.0-2.2's protocol: no
// BootstrapParams on stdin (the runtime options Any, if any), flags and environment
// only, the address read back from stdout. containerd 2.4.2 still starts a shim that
// way when its binary's name holds "shim-runc-v1" (core/runtime/v2/command.go: shims
// built before the bootstrap protocol), so the test installs crisp's shim under that
// name too (ctrdLegacyShim). crisp answers a legacy start with a bare address, which
// containerd reads as version 2 (task API only): containerd then runs `shim start`
// for every container too, as 2.0-2.2 do for such a shim, and `shim delete` after it.
var ctrdLegacyHandlers = []string{"crisp-legacy-pod", "crisp-legacy-shim"}

// ctrdLegacyShim is the name containerd starts with the legacy protocol.
const ctrdLegacyShim = "containerd-shim-runc-v1"

// cachedBinDir is the bin dir of a hack/ script's cache (the env variable overrides
// def), skipping the test, saying which script builds them, when a binary is missing.
func cachedBinDir(t *testing.T, env, def, script string, names ...string) string {
	t.Helper()
	cache := os.Getenv(env)
	if cache == "" {
		cache = def
	}
	bin := filepath.Join(cache, "bin")
	for _, name := range names {
		if _, err := os.Stat(filepath.Join(bin, name)); err != nil {
			t.Skipf("%s is not built (%v): %s builds it (make test and .ci/run do)", name, err, script)
		}
	}
	return bin
}

// containerdBinDir is where hack/containerd.sh caches containerd and its runc shim.
func containerdBinDir(t *testing.T) string {
	t.Helper()
	bin := cachedBinDir(t, "CONTAINERD_CACHE", "/var/cache/crisp/containerd-v"+containerdVersion, "hack/containerd.sh", "containerd", "containerd-shim-runc-v2")
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("containerd's runc shim needs a runc binary: apt-get install runc (hack/containerd.sh does)")
	}
	return bin
}

// ctrd is one containerd 2.x with its own config, root, state, socket, shim socket
// dir, CNI network (bridge, subnet, IPAM dir) and cgroup parent, all removed at the
// end of the test.
type ctrd struct {
	t       *testing.T
	dir     string
	root    string
	state   string
	socket  string
	sockDir string
	logPath string
	bridge  string
	subnet  string
	ipam    string
	cgroup  string
	pathEnv string
	// binary and cfgPath are what start ran, for restart.
	binary, cfgPath string

	cmd  *exec.Cmd
	done chan struct{}
	conn *grpc.ClientConn
	rt   cri.RuntimeServiceClient
	img  cri.ImageServiceClient

	busybox string
	pause   string
}

// ctrdOption changes a containerd's config (and its ctrd, e.g. pathEnv) before it
// starts: how a test adds a runtime handler of its own.
type ctrdOption func(c *ctrd, config *string)

func newContainerd(t *testing.T, opts ...ctrdOption) *ctrd {
	t.Helper()
	testutil.RequiresRoot(t, rootWhy)
	ctrdBin := containerdBinDir(t)
	crispBin := buildBinaries(t)
	// Short: shim sockets are made below it and unix socket paths max out at 108 bytes.
	dir, err := os.MkdirTemp("/tmp", "crisp-ctrd-")
	if err != nil {
		t.Fatal(err)
	}
	c := &ctrd{
		t:       t,
		dir:     dir,
		root:    filepath.Join(dir, "root"),
		state:   filepath.Join(dir, "state"),
		socket:  filepath.Join(dir, "containerd.sock"),
		sockDir: filepath.Join(dir, "s"),
		logPath: filepath.Join(dir, "containerd.log"),
		bridge:  fmt.Sprintf("crispc%d", rand.IntN(100000)),
		subnet:  fmt.Sprintf("10.%d.%d.0/24", 200+rand.IntN(40), rand.IntN(200)+20),
		ipam:    filepath.Join(dir, "ipam"),
		cgroup:  fmt.Sprintf("/crisp-ctrd-%d", rand.IntN(1000000)),
	}
	t.Cleanup(c.cleanup)

	// containerd finds crisp's shim as containerd-shim-crisp-v1 on its PATH (from
	// runtime_type io.containerd.crisp.v1); the shim re-executes /proc/self/exe, so a
	// symlink is enough.
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"containerd-shim-crisp-v1", ctrdLegacyShim} {
		if err := os.Symlink(filepath.Join(crispBin, "shim-runc"), filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	c.pathEnv = bin + ":" + ctrdBin + ":" + os.Getenv("PATH")

	// Images: busybox for the containers, a static pause for containerd's podsandbox.
	host := imagetest.StartRegistry(t)
	imagetest.Push(t, host, "busybox:ctrd", imagetest.BusyboxImage(t, imagetest.OCI, imagetest.Gzip))
	imagetest.Push(t, host, "pause:ctrd", imagetest.PauseImage(t))
	c.busybox, c.pause = host+"/busybox:ctrd", host+"/pause:ctrd"
	// The test registry speaks plain HTTP: a hosts.toml says so (the transfer service
	// containerd 2.1+ pulls with reads only config_path, not the deprecated mirrors).
	hostsDir := filepath.Join(dir, "certs.d", host)
	if err := os.MkdirAll(hostsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	hosts := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+host, "http://"+host)
	if err := os.WriteFile(filepath.Join(hostsDir, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}

	netd := filepath.Join(dir, "net.d")
	if err := os.MkdirAll(netd, 0o755); err != nil {
		t.Fatal(err)
	}
	type obj = map[string]any
	conf, err := json.MarshalIndent(obj{
		"cniVersion": "1.0.0",
		"name":       "ctrd-" + c.bridge,
		"plugins": []obj{{
			"type": "bridge", "bridge": c.bridge, "isGateway": true,
			"ipam": obj{
				"type":    "host-local",
				"ranges":  [][]obj{{{"subnet": c.subnet}}},
				"routes":  []obj{{"dst": "0.0.0.0/0"}},
				"dataDir": c.ipam,
			},
		}},
	}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(netd, "10-ctrd.conflist"), conf, 0o644); err != nil {
		t.Fatal(err)
	}

	cfg := fmt.Sprintf(ctrdConfig, c.root, c.state, c.socket, c.socket+".ttrpc",
		filepath.Join(dir, "opt"), c.sockDir, c.pause, filepath.Join(dir, "certs.d"),
		filepath.Join(dir, "runc"), netd)
	for _, o := range opts {
		o(c, &cfg)
	}
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	c.start(filepath.Join(ctrdBin, "containerd"), cfgPath)
	return c
}

// ctrdConfig is a version 3 config (containerd 2.x; 2.4 migrates it to its version 4
// on start): own root, state, sockets and shim socket dir, no NRI socket, cgroupfs,
// restrict_oom_score_adj (this VM lacks CAP_SYS_RESOURCE for negative values), network
// namespaces pinned under the state dir, and the three runtime handlers.
const ctrdConfig = `version = 3
root = %[1]q
state = %[2]q
oom_score = 0

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[debug]
  level = "debug"

[plugins.'io.containerd.internal.v1.opt']
  path = %[5]q

[plugins.'io.containerd.nri.v1.nri']
  disable = true

[plugins.'io.containerd.shim.v1.manager']
  socket_dir = %[6]q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[7]q
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = %[8]q

[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      sandboxer = 'podsandbox'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[9]q
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.crisp-shim]
      runtime_type = 'io.containerd.crisp.v1'
      sandboxer = 'shim'
      # crisp's shim has its pause built in.
      disable_pause_image_pull = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.crisp-pod]
      runtime_type = 'io.containerd.crisp.v1'
      sandboxer = 'podsandbox'
    # crisp's shim again, named containerd-shim-runc-v1: containerd 2.3+ starts a
    # shim of that name the legacy way (containerd 2.0-2.2's start, see ctrdLegacy).
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.crisp-legacy-shim]
      runtime_type = 'io.containerd.runc.v1'
      sandboxer = 'shim'
      disable_pause_image_pull = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.crisp-legacy-pod]
      runtime_type = 'io.containerd.runc.v1'
      sandboxer = 'podsandbox'
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['/usr/lib/cni']
    conf_dir = %[10]q

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
`

func (c *ctrd) start(binary, cfgPath string) {
	t := c.t
	t.Helper()
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	c.binary, c.cfgPath = binary, cfgPath
	cmd := exec.Command(binary, "--config", cfgPath)
	cmd.Env = append(os.Environ(), "PATH="+c.pathEnv)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.cmd = cmd
	c.done = make(chan struct{})
	go func() { _ = cmd.Wait(); close(c.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if conn, err := net.Dial("unix", c.socket); err == nil {
			conn.Close()
			break
		}
		select {
		case <-c.done:
			t.Fatalf("containerd exited at start; log:\n%s", c.logTail(8000))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd did not open %s; log:\n%s", c.socket, c.logTail(8000))
		}
		time.Sleep(20 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix://"+c.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	c.conn = conn
	c.rt = cri.NewRuntimeServiceClient(conn)
	c.img = cri.NewImageServiceClient(conn)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := c.rt.Status(ctx, &cri.StatusRequest{})
		cancel()
		if err == nil && ctrdNetworkReady(st) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd's CRI is not ready: %v %v; log:\n%s", st, err, c.logTail(8000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func ctrdNetworkReady(st *cri.StatusResponse) bool {
	ready := 0
	for _, cond := range st.GetStatus().GetConditions() {
		// ContainerdHasNoDeprecationWarnings is false on this cgroup v1 host.
		if (cond.Type == cri.RuntimeReady || cond.Type == cri.NetworkReady) && cond.Status {
			ready++
		}
	}
	return ready == 2
}

func (c *ctrd) logTail(n int) string {
	b, _ := os.ReadFile(c.logPath)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// shimLogs returns the shim logs still in the task bundles (crisp's shim writes
// shim.log into its bundle; containerd's runc shim logs to containerd's log).
func (c *ctrd) shimLogs() string {
	var sb strings.Builder
	_ = filepath.Walk(c.state, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Name() == "shim.log" && info.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			fmt.Fprintf(&sb, "--- %s\n%s\n", p, b)
		}
		return nil
	})
	return sb.String()
}

// processes lists the processes this containerd started that are still there: shims
// (their command line names the containerd socket or a bundle below c.dir) and
// whatever runs in the test's cgroup parent (pause, containers).
func (c *ctrd) processes() []string {
	pids := map[int]bool{}
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == os.Getpid() || (c.cmd != nil && pid == c.cmd.Process.Pid) {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if strings.Contains(string(cmdline), c.dir+"/") {
			pids[pid] = true
		}
	}
	for _, ctrl := range append(cgroupControllers(), "unified") {
		_ = filepath.Walk(filepath.Join("/sys/fs/cgroup", ctrl, c.cgroup), func(p string, info os.FileInfo, err error) error {
			if err == nil && info.Name() == "cgroup.procs" {
				b, _ := os.ReadFile(p)
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil {
						pids[pid] = true
					}
				}
			}
			return nil
		})
	}
	var out []string
	for pid := range pids {
		cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		out = append(out, fmt.Sprintf("%d:%s", pid, strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))))
	}
	sort.Strings(out)
	return out
}

// shims lists the running shims of this containerd as "binary pod-or-task-id".
func (c *ctrd) shims() []string {
	var out []string
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		b, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) < 2 || !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim-") || !strings.Contains(string(b), c.dir+"/") {
			continue
		}
		id := ""
		for i, a := range args[:len(args)-1] {
			if a == "-id" {
				id = args[i+1]
			}
		}
		out = append(out, filepath.Base(args[0])+" "+id)
	}
	sort.Strings(out)
	return out
}

// leftovers lists what is left of pods once containerd says none is there: processes,
// mounts below the test's dirs (rootfs, shm, netns pins), network namespaces, cgroups,
// veths, IP reservations, shim sockets and task bundles.
func (c *ctrd) leftovers() []string {
	var out []string
	for _, p := range c.processes() {
		out = append(out, "process "+p)
	}
	for _, m := range mountsUnder(c.dir) {
		out = append(out, "mount "+m)
	}
	if entries, _ := os.ReadDir(filepath.Join(c.state, "netns")); len(entries) > 0 {
		for _, e := range entries {
			out = append(out, "netns "+e.Name())
		}
	}
	for _, ctrl := range append(cgroupControllers(), "unified") {
		entries, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", ctrl, c.cgroup))
		for _, e := range entries {
			if e.IsDir() {
				out = append(out, "cgroup "+filepath.Join(ctrl, c.cgroup, e.Name()))
			}
		}
	}
	if b, _ := exec.Command("ip", "-o", "link", "show", "master", c.bridge).Output(); len(strings.TrimSpace(string(b))) > 0 {
		out = append(out, "veths "+strings.TrimSpace(string(b)))
	}
	_ = filepath.Walk(c.ipam, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() && net.ParseIP(info.Name()) != nil {
			out = append(out, "ip "+info.Name())
		}
		return nil
	})
	if entries, _ := os.ReadDir(c.sockDir); len(entries) > 0 {
		for _, e := range entries {
			out = append(out, "shim socket "+e.Name())
		}
	}
	for _, d := range []string{"io.containerd.runtime.v2.task/k8s.io", "io.containerd.runtime.v2.shim/k8s.io"} {
		entries, _ := os.ReadDir(filepath.Join(c.state, d))
		for _, e := range entries {
			out = append(out, "bundle "+filepath.Join(d, e.Name()))
		}
	}
	return out
}

// assertClean waits up to `within` for every pod trace to go; what was already left
// before (by an earlier failed subtest) is not counted again.
func (c *ctrd) assertClean(t *testing.T, within time.Duration, before []string) {
	t.Helper()
	old := map[string]bool{}
	for _, l := range before {
		old[l] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if pods, err := c.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{}); err != nil || len(pods.Items) > 0 {
		t.Errorf("containerd still lists pods: %v %v", pods.GetItems(), err)
	}
	deadline := time.Now().Add(within)
	for {
		var left []string
		for _, l := range c.leftovers() {
			if !old[l] {
				left = append(left, l)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("left after RemovePodSandbox:\n  %s%s", strings.Join(left, "\n  "), leftShimLogs(left))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// leftShimLogs returns the end of the logs that left-over shims still hold open (a
// shim's bundle, with its shim.log, is gone once containerd deleted the task).
func leftShimLogs(left []string) string {
	var sb strings.Builder
	shown := 0
	for _, l := range left {
		pid, _, ok := strings.Cut(strings.TrimPrefix(l, "process "), ":")
		if !ok || !strings.HasPrefix(l, "process ") || shown == 3 {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join("/proc", pid, "fd"))
		for _, fd := range fds {
			p := filepath.Join("/proc", pid, "fd", fd.Name())
			if target, _ := os.Readlink(p); strings.Contains(target, "shim.log") {
				b, _ := os.ReadFile(p)
				if len(b) > 3000 {
					b = b[len(b)-3000:]
				}
				fmt.Fprintf(&sb, "\n--- log of shim %s (%s):\n%s", pid, target, b)
				shown++
				break
			}
		}
	}
	return sb.String()
}

// cleanup removes every trace, also after a failed test: pods through the CRI, then
// containerd, then whatever its shims left (killed by pid), mounts, the bridge,
// cgroups and the directory.
func (c *ctrd) cleanup() {
	t := c.t
	if t.Failed() || os.Getenv("CRISP_E2E_LOG") != "" {
		if logs := c.shimLogs(); logs != "" {
			t.Logf("shim logs:\n%s", logs)
		}
	}
	if c.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if resp, err := c.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{}); err == nil {
			for _, p := range resp.Items {
				_, _ = c.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: p.Id})
				_, _ = c.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: p.Id})
			}
		}
		cancel()
		c.conn.Close()
	}
	if t.Failed() || os.Getenv("CRISP_E2E_LOG") != "" {
		t.Logf("containerd log (%s), last 30000 bytes:\n%s", c.logPath, c.logTail(30000))
	}
	// CRISP_CTRD_KEEP_LOG=FILE keeps the whole containerd log.
	if keep := os.Getenv("CRISP_CTRD_KEEP_LOG"); keep != "" {
		if b, err := os.ReadFile(c.logPath); err == nil {
			_ = os.WriteFile(keep, b, 0o600)
		}
	}
	if c.cmd != nil {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(20 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	}
	for _, p := range c.processes() {
		if pid, err := strconv.Atoi(strings.SplitN(p, ":", 2)[0]); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	time.Sleep(100 * time.Millisecond)
	// A legacy start gets no socket_dir: a shim killed above leaves its socket in
	// crisp's default dir, outside c.dir. The task bundles say which.
	_ = filepath.Walk(c.state, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.Name() != "bootstrap.json" {
			return nil
		}
		var boot struct {
			Address string `json:"address"`
		}
		if b, err := os.ReadFile(p); err == nil && json.Unmarshal(b, &boot) == nil {
			if sock, ok := strings.CutPrefix(boot.Address, "unix://"); ok && !strings.HasPrefix(sock, c.dir+"/") {
				_ = os.Remove(sock)
			}
		}
		return nil
	})
	for _, m := range mountsUnder(c.dir) {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
	_ = exec.Command("ip", "link", "del", c.bridge).Run()
	for _, ctrl := range append(cgroupControllers(), "unified") {
		base := filepath.Join("/sys/fs/cgroup", ctrl, c.cgroup)
		var dirs []string
		_ = filepath.Walk(base, func(p string, info os.FileInfo, err error) error {
			if err == nil && info.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = os.Remove(dirs[i])
		}
	}
	os.RemoveAll(c.dir)
}

func (c *ctrd) podConfig(name string) *cri.PodSandboxConfig {
	return &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: name, Namespace: "e2e", Uid: "uid-" + name},
		Hostname:     name,
		LogDirectory: filepath.Join(c.dir, "logs", name),
		Labels:       map[string]string{"app": "e2e-containerd"},
		Linux: &cri.LinuxPodSandboxConfig{
			CgroupParent: c.cgroup,
			SecurityContext: &cri.LinuxSandboxSecurityContext{
				NamespaceOptions: &cri.NamespaceOption{},
			},
		},
	}
}

func (c *ctrd) ctrConfig(name string, cmd ...string) *cri.ContainerConfig {
	return &cri.ContainerConfig{
		Metadata: &cri.ContainerMetadata{Name: name},
		Image:    &cri.ImageSpec{Image: c.busybox},
		Command:  cmd,
		LogPath:  name + ".log",
		Linux:    &cri.LinuxContainerConfig{SecurityContext: &cri.LinuxContainerSecurityContext{}},
	}
}

// runPod runs pod on handler and returns its id; the test fails, with the end of
// containerd's log, when the pod does not start.
func (c *ctrd) runPod(ctx context.Context, t *testing.T, pod *cri.PodSandboxConfig, handler string) string {
	t.Helper()
	resp, err := c.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: pod, RuntimeHandler: handler})
	if err != nil {
		t.Fatalf("RunPodSandbox on %s: %v\n%s", handler, err, c.logTail(4000))
	}
	return resp.PodSandboxId
}

// removePod stops and removes pod id (stopRemovePod); an error fails the test without
// ending it, since it runs in deferred cleanups.
func (c *ctrd) removePod(ctx context.Context, t *testing.T, id string) {
	t.Helper()
	if err := stopRemovePod(ctx, c.rt, id); err != nil {
		t.Error(err)
	}
}

func (c *ctrd) createStart(ctx context.Context, podID string, pod *cri.PodSandboxConfig, cfg *cri.ContainerConfig) (string, error) {
	resp, err := c.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: cfg, SandboxConfig: pod})
	if err != nil {
		return "", fmt.Errorf("CreateContainer %s: %w", cfg.Metadata.Name, err)
	}
	if _, err := c.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		return resp.ContainerId, fmt.Errorf("StartContainer %s: %w", cfg.Metadata.Name, err)
	}
	return resp.ContainerId, nil
}

func (c *ctrd) waitExit(ctx context.Context, t *testing.T, id string, within time.Duration) *cri.ContainerStatus {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		resp, err := c.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			t.Fatalf("ContainerStatus %s: %v", id, err)
		}
		if resp.Status.State == cri.ContainerState_CONTAINER_EXITED {
			return resp.Status
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s still %v after %v", id, resp.Status.State, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ctrdWaitLog waits until the CRI log at path has want (containerd copies the output from
// FIFOs, after the exit event).
func ctrdWaitLog(t *testing.T, path, want string, within time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if b, err := os.ReadFile(path); err == nil && strings.Count(string(b), "\n") >= strings.Count(want, "|")+1 {
			lines := logLines(t, path)
			sort.Strings(lines)
			if strings.Join(lines, "|") == want || time.Now().After(deadline) {
				return lines
			}
		} else if time.Now().After(deadline) {
			b, _ := os.ReadFile(path)
			t.Errorf("log %s: %q (%v), want %q", path, b, err, want)
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestE2EContainerd runs containerd 2.4.2 with crisp's shim under two sandboxers (and
// again started the legacy way, see ctrdLegacyHandlers) and containerd's runc shim,
// drives each through containerd's CRI socket with the CRI client (pod ready,
// container running, exec, logs, exit code, OOM reason, stats, stop, remove, nothing
// left behind) and its streaming server (exec, attach, port-forward), restarts
// containerd with pods running, and measures pod start (RunPodSandbox +
// CreateContainer + StartContainer) p50 per handler.
func TestE2EContainerd(t *testing.T) {
	c := newContainerd(t)
	ctx := ctxT(t)
	v, err := c.rt.Version(ctx, &cri.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s %s (CRI %s)", v.RuntimeName, v.RuntimeVersion, v.RuntimeApiVersion)
	if !strings.Contains(v.RuntimeVersion, containerdVersion) {
		t.Errorf("containerd version %q, want %s", v.RuntimeVersion, containerdVersion)
	}
	for _, ref := range []string{c.busybox, c.pause} {
		if _, err := c.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}}); err != nil {
			t.Fatalf("pull %s: %v\n%s", ref, err, c.logTail(4000))
		}
	}
	for _, h := range append(ctrdHandlers, ctrdLegacyHandlers...) {
		t.Run(h, func(t *testing.T) { c.lifecycle(t, h) })
	}
	t.Run("streaming", func(t *testing.T) {
		for _, h := range append(ctrdHandlers, ctrdLegacyHandlers...) {
			t.Run(h, func(t *testing.T) { c.streaming(t, h) })
		}
	})
	t.Run("features", func(t *testing.T) { c.features(t) })
	t.Run("podfiles", func(t *testing.T) { c.podFiles(t) })
	t.Run("restart", func(t *testing.T) { c.restarts(t) })
	t.Run("podstart", func(t *testing.T) {
		before := c.leftovers()
		p50 := map[string]time.Duration{}
		for _, h := range ctrdHandlers {
			d, err := c.podStartP50(h, 2, 10)
			if err != nil {
				t.Errorf("%s: %v", h, err)
				continue
			}
			p50[h] = d
		}
		var parts []string
		for _, h := range ctrdHandlers {
			if d, ok := p50[h]; ok {
				s := fmt.Sprintf("%s %.1f ms", h, float64(d.Microseconds())/1000)
				if r, ok := p50["runc"]; ok && h != "runc" && r > 0 {
					s += fmt.Sprintf(" (%.2fx runc)", float64(d)/float64(r))
				}
				parts = append(parts, s)
			}
		}
		t.Logf("containerd %s pod start p50 (RunPodSandbox+CreateContainer+StartContainer, 10 runs after 2 warm-ups): %s",
			containerdVersion, strings.Join(parts, ", "))
		c.assertClean(t, 20*time.Second, before)
	})
}

// features: containerd reads each handler's features from its shim's -info (the OCI
// features document): crisp's shim offers recursive read-only mounts as containerd's
// runc shim does, and a recursive read-only mount through containerd on crisp's shim
// makes a submount read-only. User namespaces are offered on every handler.
func (c *ctrd) features(t *testing.T) {
	ctx := ctxT(t)
	st, err := c.rt.Status(ctx, &cri.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*cri.RuntimeHandlerFeatures{}
	for _, h := range st.GetRuntimeHandlers() {
		got[h.GetName()] = h.GetFeatures()
	}
	for _, h := range ctrdHandlers {
		if !got[h].GetRecursiveReadOnlyMounts() {
			t.Errorf("containerd: handler %s offers no recursive read-only mounts: %v", h, got[h])
		}
		if !got[h].GetUserNamespaces() {
			t.Errorf("containerd: handler %s offers no user namespaces (containerd_userns_test.go runs them)", h)
		}
	}
	vol, sub := rroVolume(t, c.dir)
	for _, h := range []string{"crisp-pod", "crisp-shim"} {
		pod := c.podConfig("rro-" + h)
		resp, err := c.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: pod, RuntimeHandler: h})
		if err != nil {
			t.Fatalf("%s: RunPodSandbox: %v", h, err)
		}
		cfg := c.ctrConfig("rro", "sh", "-c", "touch /v/sub/x; echo $?")
		cfg.Mounts = []*cri.Mount{{HostPath: vol, ContainerPath: "/v", Readonly: true, RecursiveReadOnly: true}}
		id, err := c.createStart(ctx, resp.PodSandboxId, pod, cfg)
		if err != nil {
			t.Fatalf("%s: %v", h, err)
		}
		if cs := c.waitExit(ctx, t, id, 30*time.Second); cs.GetExitCode() != 0 {
			t.Errorf("%s: container exit %d", h, cs.GetExitCode())
		}
		if _, err := os.Stat(filepath.Join(sub, "x")); err == nil {
			t.Errorf("%s: the container wrote into a submount of a recursive read-only mount", h)
		}
		if _, err := c.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: resp.PodSandboxId}); err != nil {
			t.Errorf("%s: StopPodSandbox: %v", h, err)
		}
		if _, err := c.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: resp.PodSandboxId}); err != nil {
			t.Errorf("%s: RemovePodSandbox: %v", h, err)
		}
	}
}

// restart stops containerd with sig and starts it again on the same config.
func (c *ctrd) restart(sig syscall.Signal) { c.restartWith(sig, nil) }

// restartWith is restart running down, if not nil, while containerd is gone.
func (c *ctrd) restartWith(sig syscall.Signal, down func()) {
	c.t.Helper()
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
	_ = c.cmd.Process.Signal(sig)
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		c.t.Fatalf("containerd did not exit within 30 s of %v", sig)
	}
	if down != nil {
		down()
	}
	c.start(c.binary, c.cfgPath)
}

// restarts: pods on every handler keep running across a SIGTERM and then a SIGKILL of
// containerd and are found again: listed READY with their containers RUNNING (same
// pids), exec works (ExecSync and a streaming exec with stdin, through the restarted
// streaming server), a container's log keeps growing, and a container started before
// the restarts is stopped and removed after them. A container that exits while
// containerd is down is reported exited once containerd is back, as on containerd's
// runc shim: containerd 2.4.2 finds its task with no process, cleans it up as a
// leaked shim's (core/runtime/v2/shim_load.go) and reports exit code 255, reason
// Unknown, whatever the shim recorded.
func (c *ctrd) restarts(t *testing.T) {
	ctx := ctxT(t)
	before := c.leftovers()
	type running struct {
		pod, sleeper, ticker, handler, tickLog string
		sleeperPid, tickerPid                  int
		// quitters exit with 3 once /tmp/quit appears in their root, one for
		// each restart.
		quitters   map[syscall.Signal]string
		quitterPid map[syscall.Signal]int
	}
	var pods []*running
	signals := []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}
	defer func() {
		for _, p := range pods {
			if _, err := c.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: p.pod}); err != nil {
				t.Errorf("%s: StopPodSandbox: %v", p.handler, err)
			}
			if _, err := c.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: p.pod}); err != nil {
				t.Errorf("%s: RemovePodSandbox: %v", p.handler, err)
			}
		}
		c.assertClean(t, 20*time.Second, before)
	}()
	for _, h := range append(ctrdHandlers, ctrdLegacyHandlers...) {
		pod := c.podConfig("restart-" + h)
		resp, err := c.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: pod, RuntimeHandler: h})
		if err != nil {
			t.Fatalf("%s: RunPodSandbox: %v", h, err)
		}
		p := &running{pod: resp.PodSandboxId, handler: h, tickLog: filepath.Join(pod.LogDirectory, "ticker.log")}
		pods = append(pods, p)
		if p.sleeper, err = c.createStart(ctx, p.pod, pod, c.ctrConfig("sleeper", "sleep", "3600")); err != nil {
			t.Fatalf("%s: %v", h, err)
		}
		// The ticker also echoes its stdin, for an attach after the restarts.
		tcfg := c.ctrConfig("ticker", "sh", "-c", "while true; do echo tick; sleep 0.1; done & exec cat")
		tcfg.Stdin = true
		if p.ticker, err = c.createStart(ctx, p.pod, pod, tcfg); err != nil {
			t.Fatalf("%s: %v", h, err)
		}
		p.sleeperPid, p.tickerPid = c.ctrPid(ctx, t, p.sleeper), c.ctrPid(ctx, t, p.ticker)
		p.quitters, p.quitterPid = map[syscall.Signal]string{}, map[syscall.Signal]int{}
		for _, sig := range signals {
			q, err := c.createStart(ctx, p.pod, pod, c.ctrConfig(fmt.Sprintf("quitter-%d", sig), "sh", "-c", "until [ -e /tmp/quit ]; do sleep 0.05; done; exit 3"))
			if err != nil {
				t.Fatalf("%s: %v", h, err)
			}
			p.quitters[sig], p.quitterPid[sig] = q, c.ctrPid(ctx, t, q)
		}
	}
	for _, sig := range signals {
		ticks := map[string]int{}
		for _, p := range pods {
			ticks[p.handler] = len(readLogIfAny(t, p.tickLog))
		}
		quits := map[string]string{}
		c.restartWith(sig, func() {
			// Through the quitter's root from the host: nothing of containerd's
			// is there to exec with.
			for _, p := range pods {
				if err := os.WriteFile(fmt.Sprintf("/proc/%d/root/tmp/quit", p.quitterPid[sig]), nil, 0o644); err != nil {
					t.Errorf("%s: tell the quitter to exit: %v", p.handler, err)
				}
			}
			for _, p := range pods {
				deadline := time.Now().Add(10 * time.Second)
				for syscall.Kill(p.quitterPid[sig], 0) == nil && time.Now().Before(deadline) {
					time.Sleep(20 * time.Millisecond)
				}
			}
		})
		list, err := c.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
		if err != nil {
			t.Fatalf("after %v: ListPodSandbox: %v", sig, err)
		}
		ready := map[string]bool{}
		for _, it := range list.Items {
			ready[it.Id] = it.State == cri.PodSandboxState_SANDBOX_READY
		}
		for _, p := range pods {
			if !ready[p.pod] {
				t.Errorf("%s after %v: pod not listed READY: %v", p.handler, sig, list.Items)
			}
			ctrs, err := c.rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{PodSandboxId: p.pod}})
			if err != nil {
				t.Fatalf("%s after %v: ListContainers: %v", p.handler, sig, err)
			}
			states := map[string]cri.ContainerState{}
			for _, ctr := range ctrs.Containers {
				states[ctr.Id] = ctr.State
			}
			for _, id := range []string{p.sleeper, p.ticker} {
				if st, ok := states[id]; !ok || st != cri.ContainerState_CONTAINER_RUNNING {
					t.Errorf("%s after %v: container %s listed %v (%v)", p.handler, sig, id, st, ok)
				}
			}
			st := c.waitExit(ctx, t, p.quitters[sig], 10*time.Second)
			quits[p.handler] = fmt.Sprintf("exit code %d, reason %q", st.ExitCode, st.Reason)
			if got := c.ctrPid(ctx, t, p.sleeper); got != p.sleeperPid {
				t.Errorf("%s after %v: sleeper pid %d, was %d", p.handler, sig, got, p.sleeperPid)
			}
			if got := c.ctrPid(ctx, t, p.ticker); got != p.tickerPid {
				t.Errorf("%s after %v: ticker pid %d, was %d", p.handler, sig, got, p.tickerPid)
			}
			ex, err := c.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: p.sleeper, Cmd: []string{"echo", "alive"}, Timeout: 10})
			if err != nil || string(ex.GetStdout()) != "alive\n" {
				t.Errorf("%s after %v: exec %q %v", p.handler, sig, ex.GetStdout(), err)
			}
			var out bytes.Buffer
			u := c.execURL(ctx, t, &cri.ExecRequest{ContainerId: p.ticker, Cmd: []string{"cat"}, Stdin: true, Stdout: true})
			if err := stream(ctx, t, u, spdyTransport, remotecommand.StreamOptions{Stdin: strings.NewReader("still here\n"), Stdout: &out}); err != nil || out.String() != "still here\n" {
				t.Errorf("%s after %v: streaming exec: %q %v", p.handler, sig, out.String(), err)
			}
			// The container's stdin and stdout, which containerd opens again
			// after its restart, still reach it: attach and type.
			actx, cancel := context.WithTimeout(ctx, 15*time.Second)
			as := attachOn(actx, t, c.rt, p.ticker, spdyTransport, false, nil)
			line := fmt.Sprintf("typed-after-%d", sig)
			for {
				if _, err := as.stdin.Write([]byte(line + "\n")); err != nil {
					t.Errorf("%s after %v: attach session ended: %v", p.handler, sig, err)
					break
				}
				if as.out.wait(line, time.Second) {
					break
				}
				if actx.Err() != nil {
					t.Errorf("%s after %v: attach: no echo: %q", p.handler, sig, as.out.String())
					break
				}
			}
			as.stdin.Close()
			as.ended(t, 10*time.Second)
			cancel()
			// The ticker writes 10 lines a second: more than a second's worth
			// beyond the count before the restart shows the log still grows.
			deadline := time.Now().Add(10 * time.Second)
			for len(readLogIfAny(t, p.tickLog)) < ticks[p.handler]+10 {
				if time.Now().After(deadline) {
					t.Errorf("%s after %v: the ticker's log stays at %d lines (%d before)", p.handler, sig, len(readLogIfAny(t, p.tickLog)), ticks[p.handler])
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		t.Logf("after %v: a container that exited while containerd was down: %v", sig, quits)
		for _, h := range append(ctrdHandlers, ctrdLegacyHandlers...) {
			if quits[h] != quits["runc"] {
				t.Errorf("%s after %v: a container that exited meanwhile has %s; on runc %s", h, sig, quits[h], quits["runc"])
			}
		}
	}
	for _, p := range pods {
		if _, err := c.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: p.sleeper, Timeout: 5}); err != nil {
			t.Errorf("%s: StopContainer after the restarts: %v", p.handler, err)
		}
		c.waitExit(ctx, t, p.sleeper, 10*time.Second)
		if _, err := c.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: p.sleeper}); err != nil {
			t.Errorf("%s: RemoveContainer after the restarts: %v", p.handler, err)
		}
		if err := syscall.Kill(p.sleeperPid, 0); err == nil {
			t.Errorf("%s: the stopped sleeper's process %d is still there", p.handler, p.sleeperPid)
		}
		ctrs, err := c.rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{PodSandboxId: p.pod}})
		if err != nil || len(ctrs.Containers) != 1+len(signals) || slices.ContainsFunc(ctrs.Containers, func(c *cri.Container) bool { return c.Id == p.sleeper }) {
			t.Errorf("%s: containers after removing the sleeper: %v %v", p.handler, ctrs.GetContainers(), err)
		}
	}
}

// lifecycle runs one pod through every CRI verb crictl uses on it.
func (c *ctrd) lifecycle(t *testing.T, handler string) {
	ctx := ctxT(t)
	before, shimsBefore := c.leftovers(), c.shims()
	name := "life-" + handler
	pod := c.podConfig(name)
	podID := c.runPod(ctx, t, pod, handler)
	removed := false
	defer func() {
		if !removed {
			c.removePod(ctx, t, podID)
		}
	}()
	ps, err := c.rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: podID})
	if err != nil {
		t.Fatalf("PodSandboxStatus: %v", err)
	}
	if ps.Status.State != cri.PodSandboxState_SANDBOX_READY || ps.Status.RuntimeHandler != handler {
		t.Errorf("pod state %v handler %q, want ready %q", ps.Status.State, ps.Status.RuntimeHandler, handler)
	}
	_, subnet, _ := net.ParseCIDR(c.subnet)
	if ip := net.ParseIP(ps.Status.GetNetwork().GetIp()); ip == nil || !subnet.Contains(ip) {
		t.Errorf("pod IP %q, want one in %s", ps.Status.GetNetwork().GetIp(), c.subnet)
	}

	// A long-running container: running, exec, stats, stop.
	cfg := c.ctrConfig("top", "sh", "-c", "trap 'exit 0' TERM; echo started; while true; do sleep 1; done")
	top, err := c.createStart(ctx, podID, pod, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := c.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: top})
	if err != nil {
		t.Fatalf("ContainerStatus: %v", err)
	}
	if cs.Status.State != cri.ContainerState_CONTAINER_RUNNING {
		t.Errorf("container state %v, want running", cs.Status.State)
	}
	ex, err := c.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: top, Cmd: []string{"sh", "-c", "echo out; echo err >&2; hostname"}, Timeout: 10})
	if err != nil {
		t.Errorf("ExecSync: %v", err)
	} else if string(ex.Stdout) != "out\n"+name+"\n" || string(ex.Stderr) != "err\n" || ex.ExitCode != 0 {
		t.Errorf("ExecSync: stdout %q stderr %q code %d", ex.Stdout, ex.Stderr, ex.ExitCode)
	}
	if ex, err := c.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: top, Cmd: []string{"sh", "-c", "exit 5"}, Timeout: 10}); err != nil || ex.ExitCode != 5 {
		t.Errorf("ExecSync exit 5: %v %v", ex, err)
	}
	// The container is in the pod's network namespace (its IP)...
	if ex, err := c.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: top, Cmd: []string{"ip", "-o", "-4", "addr", "show", "eth0"}, Timeout: 10}); err != nil ||
		!strings.Contains(string(ex.Stdout), " "+ps.Status.GetNetwork().GetIp()+"/") {
		t.Errorf("container's eth0 %q (%v), want the pod IP %s", ex.GetStdout(), err, ps.Status.GetNetwork().GetIp())
	}
	// ... and the pod runs one shim, started for the pod, which containerd gives the
	// pod's containers too (through the task API: bootstrap version 3; or, after a
	// legacy start, by running `start` for the container, which answers with the pod's
	// shim).
	// A legacy start (version 2) shares the pod's shim through the spec's sandbox id
	// annotation, as containerd's runc shim does.
	want := map[string]string{"runc": "containerd-shim-runc-v2"}[handler]
	if slices.Contains(ctrdLegacyHandlers, handler) {
		want = ctrdLegacyShim
	} else if want == "" {
		want = "containerd-shim-crisp-v1"
	}
	var shims []string
	for _, sh := range c.shims() {
		if !slices.Contains(shimsBefore, sh) {
			shims = append(shims, sh)
		}
	}
	if len(shims) != 1 || shims[0] != want+" "+podID {
		t.Errorf("new shims %q, want one %s for pod %s", shims, want, podID)
	}
	// How containerd started it: a bootstrap start answers version 3, a legacy start
	// a bare address, which containerd records as version 2.
	var boot struct {
		Version int    `json:"version"`
		Address string `json:"address"`
	}
	if b, err := os.ReadFile(filepath.Join(c.state, "io.containerd.runtime.v2.task", "k8s.io", top, "bootstrap.json")); err != nil {
		t.Errorf("the container's bootstrap.json: %v", err)
	} else if err := json.Unmarshal(b, &boot); err != nil {
		t.Errorf("the container's bootstrap.json %q: %v", b, err)
	}
	wantVersion := map[bool]int{true: 2, false: 3}[slices.Contains(ctrdLegacyHandlers, handler)]
	if handler != "runc" && boot.Version != wantVersion {
		t.Errorf("the container's shim answered version %d, want %d", boot.Version, wantVersion)
	}
	// containerd collects stats in the background (stats_collect_period): poll.
	deadline := time.Now().Add(15 * time.Second)
	for {
		st, err := c.rt.ContainerStats(ctx, &cri.ContainerStatsRequest{ContainerId: top})
		if err == nil && st.Stats.GetMemory().GetWorkingSetBytes().GetValue() > 0 && st.Stats.GetCpu() != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("ContainerStats: %v %v", st, err)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if st, err := c.rt.ListContainerStats(ctx, &cri.ListContainerStatsRequest{Filter: &cri.ContainerStatsFilter{PodSandboxId: podID}}); err != nil || len(st.Stats) != 1 {
		t.Errorf("ListContainerStats: %v %v", st, err)
	}
	if st, err := c.rt.PodSandboxStats(ctx, &cri.PodSandboxStatsRequest{PodSandboxId: podID}); err != nil || st.Stats.GetLinux().GetMemory() == nil {
		t.Errorf("PodSandboxStats: %v %v", st, err)
	}
	// "started" follows the trap: a stop before it would end the shell with 143.
	ctrdWaitLog(t, filepath.Join(pod.LogDirectory, "top.log"), "stdout started", 5*time.Second)
	if _, err := c.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: top, Timeout: 10}); err != nil {
		t.Errorf("StopContainer: %v", err)
	}
	if cs, err := c.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: top}); err != nil ||
		cs.Status.State != cri.ContainerState_CONTAINER_EXITED || cs.Status.ExitCode != 0 {
		t.Errorf("after StopContainer: %v %v", cs.GetStatus(), err)
	}

	// Exit code and logs.
	id, err := c.createStart(ctx, podID, pod, c.ctrConfig("exits", "sh", "-c", "echo hello; echo oops >&2; exit 3"))
	if err != nil {
		t.Fatal(err)
	}
	st := c.waitExit(ctx, t, id, 15*time.Second)
	if st.ExitCode != 3 || st.Reason != "Error" {
		t.Errorf("exits: code %d reason %q, want 3 Error", st.ExitCode, st.Reason)
	}
	if lines := ctrdWaitLog(t, st.LogPath, "stderr oops|stdout hello", 5*time.Second); strings.Join(lines, "|") != "stderr oops|stdout hello" {
		t.Errorf("exits: log %q", lines)
	}

	// OOM kill, also as the shim's /tasks/oom event, from which containerd before 2.4
	// alone learns of it (2.4 also reads the cgroup's counter at the exit).
	ooms := c.oomEvents(ctx, t)
	cfg = c.ctrConfig("hog", "sh", "-c", "x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done")
	cfg.Linux.Resources = &cri.LinuxContainerResources{MemoryLimitInBytes: 32 << 20}
	id, err = c.createStart(ctx, podID, pod, cfg)
	if err != nil {
		t.Fatal(err)
	}
	st = c.waitExit(ctx, t, id, 30*time.Second)
	if st.Reason != "OOMKilled" || st.ExitCode != 137 {
		t.Errorf("hog: reason %q exit %d, want OOMKilled 137", st.Reason, st.ExitCode)
	}
	if !waitChan(ooms, id, 5*time.Second) {
		t.Errorf("hog: no /tasks/oom event for it reached containerd")
	}

	// Remove the containers, then the pod.
	list, err := c.rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{PodSandboxId: podID}})
	if err != nil || len(list.Containers) != 3 {
		t.Errorf("ListContainers: %v %v", list, err)
	}
	for _, ctr := range list.GetContainers() {
		if _, err := c.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: ctr.Id}); err != nil {
			t.Errorf("RemoveContainer %s: %v", ctr.Metadata.Name, err)
		}
	}
	if _, err := c.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Errorf("StopPodSandbox: %v", err)
	}
	if ps, err := c.rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: podID}); err != nil || ps.Status.State != cri.PodSandboxState_SANDBOX_NOTREADY {
		t.Errorf("after StopPodSandbox: %v %v", ps.GetStatus().GetState(), err)
	}
	if _, err := c.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Errorf("RemovePodSandbox: %v", err)
	}
	removed = true
	if list, err := c.rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{PodSandboxId: podID}}); err != nil || len(list.Containers) > 0 {
		t.Errorf("containerd still lists containers of the pod: %v %v", list.GetContainers(), err)
	}
	// A legacy start gets no socket_dir: the shim's socket is in crisp's default
	// dir, outside the test's, and must go with the shim.
	if sock, ok := strings.CutPrefix(boot.Address, "unix://"); ok && handler != "runc" {
		if _, err := os.Stat(sock); err == nil {
			t.Errorf("the pod's shim socket %s is left", sock)
		}
	}
	c.assertClean(t, 20*time.Second, before)
}

// oomEvents subscribes to containerd's /tasks/oom events (containerd's own gRPC
// events API) and sends the id of each OOM-killed container, until ctx ends.
func (c *ctrd) oomEvents(ctx context.Context, t *testing.T) <-chan string {
	t.Helper()
	const probe = "/crisp-e2e/probe"
	events := eventsapi.NewEventsClient(c.conn)
	stream, err := events.Subscribe(ctx, &eventsapi.SubscribeRequest{Filters: []string{`topic=="/tasks/oom"`, `topic=="` + probe + `"`}})
	if err != nil {
		t.Fatalf("subscribe to containerd's events: %v", err)
	}
	ids, live := make(chan string, 16), make(chan struct{}, 1)
	go func() {
		for {
			env, err := stream.Recv()
			if err != nil {
				return
			}
			if env.GetTopic() == probe {
				select {
				case live <- struct{}{}:
				default:
				}
				continue
			}
			var ev apievents.TaskOOM
			if proto.Unmarshal(env.GetEvent().GetValue(), &ev) == nil {
				select {
				case ids <- ev.ContainerID:
				default:
				}
			}
		}
	}()
	// Subscribe returns before containerd registers the subscriber, and an event
	// before that is missed: publish probes until one comes back.
	probeEv, err := anypb.New(&apievents.TaskOOM{ContainerID: "probe"})
	if err != nil {
		t.Fatal(err)
	}
	pctx := metadata.AppendToOutgoingContext(ctx, "containerd-namespace", "crisp-e2e")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := events.Publish(pctx, &eventsapi.PublishRequest{Topic: probe, Event: probeEv}); err != nil {
			t.Fatalf("publish a probe event: %v", err)
		}
		select {
		case <-live:
			return ids
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("containerd's event subscription never delivered a probe")
		}
	}
}

// waitChan reports whether want arrives on ch within d.
func waitChan(ch <-chan string, want string, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case got := <-ch:
			if got == want {
				return true
			}
		case <-timer.C:
			return false
		}
	}
}

// podStartP50 times RunPodSandbox + CreateContainer + StartContainer of one sleeping
// container, `runs` times after `warm` untimed runs; each pod is removed untimed.
func (c *ctrd) podStartP50(handler string, warm, runs int) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var times []time.Duration
	for i := range warm + runs {
		pod := c.podConfig(fmt.Sprintf("start-%s-%d", handler, i))
		t0 := time.Now()
		resp, err := c.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: pod, RuntimeHandler: handler})
		if err != nil {
			return 0, fmt.Errorf("RunPodSandbox: %w", err)
		}
		_, err = c.createStart(ctx, resp.PodSandboxId, pod, c.ctrConfig("sleep", "sleep", "3600"))
		d := time.Since(t0)
		if _, serr := c.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: resp.PodSandboxId}); serr != nil && err == nil {
			err = fmt.Errorf("StopPodSandbox: %w", serr)
		}
		if _, rerr := c.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: resp.PodSandboxId}); rerr != nil && err == nil {
			err = fmt.Errorf("RemovePodSandbox: %w", rerr)
		}
		if err != nil {
			return 0, err
		}
		if i >= warm {
			times = append(times, d)
		}
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	return times[(len(times)-1)/2], nil
}
