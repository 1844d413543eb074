package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Daemon is a running CRI runtime under test.
type Daemon struct {
	// Name is "crisp" or "containerd".
	Name string
	// Dir holds everything of this runtime: config, root, state, socket, CNI config,
	// IPAM data and log.
	Dir    string
	Socket string
	// CgroupParent is the pods' cgroup parent, one of the runtime's own.
	CgroupParent string
	Bridge       string
	// MetricsURL is where crisp serves its Prometheus metrics; empty when it does not.
	MetricsURL string
	// NRISocket is where crisp's NRI plugins connect; empty with NRI off.
	NRISocket string

	cmd     *exec.Cmd
	done    chan struct{}
	logFile *os.File
	conn    *grpc.ClientConn
	RT      cri.RuntimeServiceClient
	Img     cri.ImageServiceClient
}

// Pid is the daemon's process id.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// Spec says how to start one runtime.
type Spec struct {
	Name string
	// Dir is created and owned by the daemon; keep it short: shim socket paths are
	// built under it and unix socket paths max out at 108 bytes.
	Dir    string
	Bridge string
	Subnet string
	// CgroupParent is the pods' cgroup parent.
	CgroupParent string
	// Registry is the host:port of the plain-HTTP test registry.
	Registry string
	// PauseImage is containerd's sandbox image (crisp needs none).
	PauseImage string
	// Bin is crisp's bin directory (criserver and shim-runc).
	Bin string
	// Metrics has crisp serve its Prometheus metrics (on a free loopback port).
	Metrics bool
	// TaskShim and TaskRunc, when set, add containerd's runc shim (with that runc) to
	// crisp as the task-only runtime handler TaskShimHandler.
	TaskShim, TaskRunc string
	// ExtraConfig is TOML appended to crisp's config (more runtime handlers).
	ExtraConfig string
	// NRI turns crisp's NRI on, its socket and (empty) plugin directories under Dir:
	// never the machine's /var/run/nri or /opt/nri/plugins.
	NRI bool
	// TracingEndpoint, when set, turns crisp's tracing on with every call of a sampled
	// trace exported over OTLP/gRPC, in plain text, to this host:port.
	TracingEndpoint string
	// Containerd2 is the directory of containerd 2.x's binaries (containerd,
	// containerd-shim-runc-v2, runc) for StartContainerd2.
	Containerd2 string
	// Unpacks is containerd 2.x's max_concurrent_unpacks (0: its default, 1).
	Unpacks int
}

// The runtime handlers of Spec.TaskShim: without and with a warm spare shim.
const (
	TaskShimHandler      = "runc-v2"
	TaskShimSpareHandler = "runc-v2-spare"
)

// conflist is the CNI network both runtimes get: crisp's default network (bridge with
// gateway, masquerade and hairpin, host-local IPAM, portmap), with the bridge, subnet
// and IPAM data dir of the runtime.
func conflist(bridge, subnet, ipamDir string) ([]byte, error) {
	type obj = map[string]any
	return json.MarshalIndent(obj{
		"cniVersion": "1.0.0",
		"name":       "bench-" + bridge,
		"plugins": []obj{
			{
				"type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": true, "hairpinMode": true,
				"ipam": obj{
					"type":    "host-local",
					"ranges":  [][]obj{{{"subnet": subnet}}},
					"routes":  []obj{{"dst": "0.0.0.0/0"}},
					"dataDir": ipamDir,
				},
			},
			{"type": "portmap", "capabilities": obj{"portMappings": true}, "snat": true},
		},
	}, "", "  ")
}

// StartContainerd starts Debian's containerd with a config of its own: own root,
// state, socket, CNI config and plugin state, restrict_oom_score_adj (this VM lacks
// CAP_SYS_RESOURCE), cgroupfs, and the test registry reachable over HTTP.
func StartContainerd(ctx context.Context, s Spec) (*Daemon, error) {
	d := &Daemon{Name: "containerd", Dir: s.Dir, Socket: filepath.Join(s.Dir, "containerd.sock"),
		CgroupParent: s.CgroupParent, Bridge: s.Bridge}
	netd := filepath.Join(s.Dir, "net.d")
	if err := writeCNI(netd, s.Dir, s.Bridge, s.Subnet); err != nil {
		return nil, err
	}
	cfg := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
oom_score = 0

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[debug]
  level = "warn"

[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[7]q
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors.%[8]q]
    endpoint = ["http://%[8]s"]
`, filepath.Join(s.Dir, "root"), filepath.Join(s.Dir, "state"), d.Socket, d.Socket+".ttrpc",
		filepath.Join(s.Dir, "opt"), s.PauseImage, netd, s.Registry)
	path := filepath.Join(s.Dir, "config.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	// containerd 1.6 pins pod network namespaces under the fixed /var/run/netns. In a
	// mount namespace of its own with a tmpfs there, its pins are out of reach of other
	// runs' and tests' cleanups, and go with it. (unshare and sh exec: the pid is
	// containerd's.)
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mkdir -p /var/run/netns && mount -t tmpfs -o mode=0755 bench-netns /var/run/netns && exec containerd --config "$0"`, path)
	return d, d.start(ctx, cmd)
}

// StartContainerd2 starts containerd 2.x from s.Containerd2 with a version 3 config
// as the e2e tests write it: own root, state, sockets and shim socket dir, no NRI,
// cgroupfs, restrict_oom_score_adj, network namespaces under its state dir, and the
// test registry reachable over HTTP through a hosts.toml (the transfer service its
// CRI plugin pulls with reads only config_path: a mirrors section would switch the
// CRI plugin back to its local pull). s.Unpacks sets the transfer service's
// max_concurrent_unpacks.
func StartContainerd2(ctx context.Context, s Spec) (*Daemon, error) {
	d := &Daemon{Name: s.Name, Dir: s.Dir, Socket: filepath.Join(s.Dir, "containerd.sock"),
		CgroupParent: s.CgroupParent, Bridge: s.Bridge}
	netd := filepath.Join(s.Dir, "net.d")
	if err := writeCNI(netd, s.Dir, s.Bridge, s.Subnet); err != nil {
		return nil, err
	}
	certs := filepath.Join(s.Dir, "certs.d")
	if err := os.MkdirAll(filepath.Join(certs, s.Registry), 0o755); err != nil {
		return nil, err
	}
	hosts := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+s.Registry, "http://"+s.Registry)
	if err := os.WriteFile(filepath.Join(certs, s.Registry, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		return nil, err
	}
	unpacks := ""
	if s.Unpacks > 0 {
		unpacks = fmt.Sprintf("\n[plugins.'io.containerd.transfer.v1.local']\n  max_concurrent_unpacks = %d\n", s.Unpacks)
	}
	cfg := fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
oom_score = 0

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[debug]
  level = "warn"

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
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[9]q
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['/usr/lib/cni']
    conf_dir = %[10]q

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
%[11]s`, filepath.Join(s.Dir, "root"), filepath.Join(s.Dir, "state"), d.Socket, d.Socket+".ttrpc",
		filepath.Join(s.Dir, "opt"), filepath.Join(s.Dir, "s"), s.PauseImage, certs,
		filepath.Join(s.Dir, "runc"), netd, unpacks)
	path := filepath.Join(s.Dir, "config.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(s.Containerd2, "containerd"), "--config", path)
	// Its shim and runc, not Debian's.
	cmd.Env = append(os.Environ(), "PATH="+s.Containerd2+":"+os.Getenv("PATH"))
	return d, d.start(ctx, cmd)
}

// StartCrisp starts criserver with its own root, state, socket and CNI network.
func StartCrisp(ctx context.Context, s Spec) (*Daemon, error) {
	d := &Daemon{Name: "crisp", Dir: s.Dir, Socket: filepath.Join(s.Dir, "crisp.sock"),
		CgroupParent: s.CgroupParent, Bridge: s.Bridge}
	netd := filepath.Join(s.Dir, "net.d")
	if err := writeCNI(netd, s.Dir, s.Bridge, s.Subnet); err != nil {
		return nil, err
	}
	cfg := fmt.Sprintf(`socket = %q
root_dir = %q
state_dir = %q
log_level = "warn"
[cni]
conf_dir = %q
[runtimes.runc]
shim = %q
namespace = "k8s.io"
`, d.Socket, filepath.Join(s.Dir, "root"), filepath.Join(s.Dir, "state"), netd, filepath.Join(s.Bin, "shim-runc"))
	if s.TaskShim != "" {
		for h, spare := range map[string]bool{TaskShimHandler: false, TaskShimSpareHandler: true} {
			cfg += fmt.Sprintf("[runtimes.%s]\nshim = %q\nsandbox_mode = \"task\"\nwarm_spare = %v\n[runtimes.%s.options]\nBinaryName = %q\n",
				h, s.TaskShim, spare, h, s.TaskRunc)
		}
	}
	if s.Metrics {
		// A free port, found by listening on one: criserver logs the port it got only
		// at info level, and the bench runs it at warn.
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a port for metrics: %w", err)
		}
		addr := lis.Addr().String()
		lis.Close()
		cfg += fmt.Sprintf("[metrics]\naddress = %q\n", addr)
		d.MetricsURL = "http://" + addr + "/metrics"
	}
	if s.NRI {
		d.NRISocket = filepath.Join(s.Dir, "nri.sock")
		cfg += fmt.Sprintf("[nri]\ndisable = false\nsocket_path = %q\nplugin_path = %q\nplugin_config_path = %q\n",
			d.NRISocket, filepath.Join(s.Dir, "nri-plugins"), filepath.Join(s.Dir, "nri-conf"))
	}
	if s.TracingEndpoint != "" {
		cfg += fmt.Sprintf("[tracing]\nenable = true\nendpoint = %q\nprotocol = \"grpc\"\ninsecure = true\nsampling_ratio = 1.0\n", s.TracingEndpoint)
	}
	cfg += s.ExtraConfig
	path := filepath.Join(s.Dir, "config.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	return d, d.start(ctx, exec.Command(filepath.Join(s.Bin, "criserver"), "--config", path))
}

func writeCNI(netd, dir, bridge, subnet string) error {
	if err := os.MkdirAll(netd, 0o700); err != nil {
		return err
	}
	b, err := conflist(bridge, subnet, filepath.Join(dir, "ipam"))
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(netd, "10-bench.conflist"), b, 0o600)
}

func (d *Daemon) start(ctx context.Context, cmd *exec.Cmd) error {
	logf, err := os.OpenFile(filepath.Join(d.Dir, d.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	d.logFile = logf
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: a Ctrl-C on the benchmark reaches the benchmark, which
	// then stops the daemon in order instead of leaving its pods half torn down.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", d.Name, err)
	}
	d.cmd = cmd
	d.done = make(chan struct{})
	go func() { _ = cmd.Wait(); close(d.done) }()

	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.Dial("unix", d.Socket); err == nil {
			c.Close()
			break
		}
		select {
		case <-d.done:
			return fmt.Errorf("%s exited at start; see %s", d.Name, logf.Name())
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s did not open %s; see %s", d.Name, d.Socket, logf.Name())
		}
		time.Sleep(20 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix://"+d.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		return err
	}
	d.conn = conn
	d.RT = cri.NewRuntimeServiceClient(conn)
	d.Img = cri.NewImageServiceClient(conn)
	for {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := d.RT.Status(sctx, &cri.StatusRequest{})
		cancel()
		if err == nil && networkReady(st) {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s not ready: %v %v", d.Name, st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func networkReady(st *cri.StatusResponse) bool {
	// Only these two: containerd 2.x adds a condition that is false while it has
	// deprecation warnings (cgroup v1 here), which does not keep it from working.
	for _, c := range st.GetStatus().GetConditions() {
		if (c.Type == cri.RuntimeReady || c.Type == cri.NetworkReady) && !c.Status {
			return false
		}
	}
	return true
}

// RemoveAllPods stops and removes every pod the runtime knows.
func (d *Daemon) RemoveAllPods(ctx context.Context) error {
	list, err := d.RT.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("list pods of %s: %w", d.Name, err)
	}
	var errs []error
	for _, p := range list.Items {
		if _, err := d.RT.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: p.Id}); err != nil {
			errs = append(errs, err)
		}
		if _, err := d.RT.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: p.Id}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Stop ends the daemon with SIGTERM (SIGKILL after 20 s).
func (d *Daemon) Stop() {
	if d.conn != nil {
		d.conn.Close()
	}
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(20 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
	}
	d.logFile.Close()
}

// LogTail is the end of the daemon's log, for error messages.
func (d *Daemon) LogTail() string {
	b, _ := os.ReadFile(filepath.Join(d.Dir, d.Name+".log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return strings.TrimSpace(string(b))
}
