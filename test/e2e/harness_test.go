package e2e

import (
	"github.com/crisp-runtime/crisp/internal/testutil"

	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	ggcrremote "github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/opencontainers/cgroups"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/version"
)

// rootWhy is what end-to-end tests need root for (testutil.RequiresRoot).
const rootWhy = "the end-to-end tests create namespaces, cgroups, bridges and veths"

// binDir holds the binaries built once for all tests.
var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func buildBinaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "crisp-e2e-bin-")
		if buildErr != nil {
			return
		}
		root := testutil.RepoRoot()
		// make, so that the tests run the binaries as `make build` links them.
		cmd := exec.Command("make", "-s", "build", "BINDIR="+binDir, "VERSION="+version.Version)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("make build: %v\n%s", err, out)
			return
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// env is one criserver with its own directories and CNI network.
type env struct {
	t       *testing.T
	dir     string
	cfgPath string
	socket  string
	root    string
	state   string
	bridge  string
	subnet  string
	cgroup  string
	logPath string

	cmd  *exec.Cmd
	conn *grpc.ClientConn
	// kubeletCgroups are the pod cgroups a node test made as kubelet does; removed
	// after its pods (nodeCleanup).
	kubeletCgroups []cgroups.Manager
	// podLogs, in a node test, is where its pods' log directories go: under kubelet's
	// /var/log/pods, which the SELinux policy labels container_log_t for the engine.
	podLogs string
	rt      cri.RuntimeServiceClient
	img     cri.ImageServiceClient
}

// podLogDir is where pod name's log directory goes: below the node test's podLogs
// (kubelet's /var/log/pods, labelled for the shims under SELinux), else in the
// test's directory.
func (e *env) podLogDir(name string) string {
	if e.podLogs != "" {
		return filepath.Join(e.podLogs, name)
	}
	return filepath.Join(e.dir, "logs", name)
}

// newEnv prepares (but does not start) a criserver environment whose every trace
// is removed when the test ends.
func newEnv(t *testing.T) *env {
	t.Helper()
	testutil.RequiresRoot(t, rootWhy)
	bins := buildBinaries(t)
	// Short paths: shim sockets live under the state dir and unix paths max out at 108.
	dir, err := os.MkdirTemp("/tmp", "crisp-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	n := rand.IntN(200) + 20
	e := &env{
		t:      t,
		dir:    dir,
		socket: filepath.Join(dir, "crisp.sock"),
		root:   filepath.Join(dir, "root"),
		state:  filepath.Join(dir, "state"),
		bridge: fmt.Sprintf("crispe%d", rand.IntN(100000)),
		subnet: fmt.Sprintf("10.%d.%d.0/24", 200+rand.IntN(40), n),
		cgroup: fmt.Sprintf("/crisp-e2e-%d", rand.IntN(1000000)),
	}
	e.logPath = filepath.Join(dir, "criserver.log")
	cfg := fmt.Sprintf(`socket = %q
root_dir = %q
state_dir = %q
log_level = "debug"
[cni]
conf_dir = %q
default_bridge = %q
default_subnet = %q
[runtimes.runc]
shim = %q
namespace = "k8s.io"
`, e.socket, e.root, e.state, filepath.Join(dir, "net.d"), e.bridge, e.subnet, filepath.Join(bins, "shim-runc"))
	e.cfgPath = filepath.Join(dir, "config.toml")
	if err := os.WriteFile(e.cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.cleanup)
	return e
}

// appendConfig appends body (TOML) to the env's config file, before start.
func (e *env) appendConfig(body string) {
	e.t.Helper()
	f, err := os.OpenFile(e.cfgPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	_, err = f.WriteString(body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		e.t.Fatal(err)
	}
}

// start runs criserver and connects a CRI client to it.
func (e *env) start() {
	e.t.Helper()
	e.launch()
	e.waitServing()
}

// launch starts criserver, its output appended to the env's log.
func (e *env) launch() {
	e.t.Helper()
	logf, err := os.OpenFile(e.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		e.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(binDir, "criserver"), "--config", e.cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.cmd = cmd
}

// waitServing waits for the launched criserver's socket and connects a CRI client.
func (e *env) waitServing() {
	e.t.Helper()
	cmd := e.cmd
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(e.socket); err == nil {
			break
		}
		if !alive(cmd.Process.Pid) {
			e.t.Fatalf("criserver exited before it served; log:\n%s", e.log())
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("criserver did not create its socket; log:\n%s", e.log())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := e.connect(10 * time.Second); err != nil {
		// SIGQUIT has the Go runtime write every goroutine's stack to the log: where
		// a start hangs.
		_ = cmd.Process.Signal(syscall.SIGQUIT)
		time.Sleep(time.Second)
		e.t.Fatalf("criserver does not answer: %v\n%s", err, e.log())
	}
}

// connect dials the CRI socket and waits up to within for criserver to answer.
func (e *env) connect(within time.Duration) error {
	conn, err := grpc.NewClient("unix://"+e.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	e.conn = conn
	e.rt = cri.NewRuntimeServiceClient(conn)
	e.img = cri.NewImageServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	_, err = e.rt.Version(ctx, &cri.VersionRequest{}, grpc.WaitForReady(true))
	return err
}

// kill9 kills criserver the hard way; its pods and shims must keep running.
func (e *env) kill9() {
	e.t.Helper()
	if e.conn != nil {
		e.conn.Close()
		e.conn = nil
	}
	if e.cmd != nil {
		_ = e.cmd.Process.Kill()
		_ = e.cmd.Wait()
		e.cmd = nil
	}
}

// stop sends SIGTERM and waits: the clean shutdown path.
func (e *env) stop() {
	e.t.Helper()
	if e.conn != nil {
		e.conn.Close()
		e.conn = nil
	}
	if e.cmd == nil {
		return
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- e.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			e.t.Errorf("criserver exited with %v after SIGTERM; log:\n%s", err, e.log())
		}
	case <-time.After(20 * time.Second):
		_ = e.cmd.Process.Kill()
		<-done
		e.t.Errorf("criserver did not exit within 20s of SIGTERM")
	}
	e.cmd = nil
}

func (e *env) log() string {
	data, _ := os.ReadFile(e.logPath)
	// CRISP_E2E_LOG=full prints all of it.
	if len(data) > 20000 && os.Getenv("CRISP_E2E_LOG") != "full" {
		data = data[len(data)-20000:]
	}
	return string(data)
}

// cleanup removes whatever a failed test may have left: pods, the server, mounts,
// the bridge and the directories.
func (e *env) cleanup() {
	if e.cmd != nil && e.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if resp, err := e.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{}); err == nil {
			for _, p := range resp.Items {
				_, _ = e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: p.Id})
			}
		}
		cancel()
	}
	// CRISP_E2E_LOG=1 prints it for passing tests too (e.g. to read timings).
	if e.t.Failed() || os.Getenv("CRISP_E2E_LOG") != "" {
		e.t.Logf("criserver log:\n%s", e.log())
	}
	e.stop()
	// Shims the test could not remove through the CRI: kill them by their pid files.
	_ = filepath.Walk(filepath.Join(e.state, "sandboxes"), func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Name() == "shim.pid" {
			if pid := readPid(p); pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		return nil
	})
	for _, m := range mountsUnder(e.dir) {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
	_ = exec.Command("ip", "link", "del", e.bridge).Run()
	for _, ctrl := range cgroupControllers() {
		_ = os.Remove(filepath.Join("/sys/fs/cgroup", ctrl, e.cgroup))
	}
	_ = os.Remove(filepath.Join("/sys/fs/cgroup/unified", e.cgroup))
	os.RemoveAll(e.dir)
}

// mountsUnder lists mount points below dir, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			out = append(out, fields[4])
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

func cgroupControllers() []string {
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	var out []string
	for _, e := range entries {
		if e.IsDir() && e.Name() != "unified" {
			out = append(out, e.Name())
		}
	}
	return out
}

func readPid(path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	var pid int
	if _, err := fmt.Sscanf(strings.TrimSpace(string(data)), "%d", &pid); err != nil {
		return 0
	}
	return pid
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// podConfig returns a minimal pod config kubelet could send.
func (e *env) podConfig(name string) *cri.PodSandboxConfig {
	return &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: name, Namespace: "e2e", Uid: "uid-" + name},
		Hostname:     name,
		LogDirectory: e.podLogDir(name),
		Labels:       map[string]string{"app": "e2e", "pod": name},
		Annotations:  map[string]string{"e2e/annotation": name},
		Linux: &cri.LinuxPodSandboxConfig{
			CgroupParent: e.cgroup,
			SecurityContext: &cri.LinuxSandboxSecurityContext{
				NamespaceOptions: &cri.NamespaceOption{},
			},
		},
	}
}

func (e *env) runPod(ctx context.Context, cfg *cri.PodSandboxConfig) string {
	e.t.Helper()
	resp, err := e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		e.t.Fatalf("RunPodSandbox %s: %v", cfg.GetMetadata().GetName(), err)
	}
	return resp.PodSandboxId
}

// podInfo is the verbose info criserver returns for a pod.
type podInfo struct {
	Pid         int               `json:"pid"`
	ShimPid     int               `json:"shimPid"`
	NetNS       string            `json:"netNamespacePath"`
	PodDir      string            `json:"podDir"`
	ShimAddress string            `json:"shimAddress"`
	Shim        map[string]string `json:"shim"`
}

func (e *env) status(ctx context.Context, id string) (*cri.PodSandboxStatus, podInfo) {
	e.t.Helper()
	resp, err := e.rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		e.t.Fatalf("PodSandboxStatus %s: %v", id, err)
	}
	var info podInfo
	if err := json.Unmarshal([]byte(resp.Info["info"]), &info); err != nil {
		e.t.Fatalf("verbose info of %s: %v: %q", id, err, resp.Info["info"])
	}
	return resp.Status, info
}

func pushAuth(user, password string) ggcrremote.Option {
	return ggcrremote.WithAuth(&authn.Basic{Username: user, Password: password})
}
