package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	bootstrap "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/crisp-runtime/crisp/internal/proc"
)

// shimCall carries what every invocation of a shim binary needs.
type shimCall struct {
	binary    string
	namespace string
	address   string // criserver's own address, passed as -address like containerd does
	publish   string // criserver's binary, passed as -publish-binary
	id        string
	bundle    string
	socketDir string
	// events is the ttrpc address the shim publishes task events to (TTRPC_ADDRESS);
	// only task-only shims are given one.
	events string
	// env is added to a task-only shim's environment (Options.TaskShimEnv).
	env []string
	// options are a task-only shim's runtime options, given at start too (the runc
	// shim reads ShimCgroup from them).
	options *anypb.Any
	// legacy starts the shim as containerd up to 2.2 does: stdin is the runtime
	// options alone, not BootstrapParams (containerd 1.x shims read nothing else).
	legacy bool
}

func (s shimCall) args(action string) []string {
	args := []string{"-namespace", s.namespace, "-address", s.address}
	if s.publish != "" {
		args = append(args, "-publish-binary", s.publish)
	}
	return append(args, "-id", s.id, "-bundle", s.bundle, action)
}

// start runs `shim start` and returns the ttrpc address it printed and the task API
// version it serves (2 or 3).
func (s shimCall) start(ctx context.Context) (string, int, error) {
	var params []byte
	var err error
	switch {
	case s.legacy && s.options != nil:
		params, err = proto.Marshal(s.options)
	case !s.legacy:
		bp := &bootstrap.BootstrapParams{
			InstanceID:             s.id,
			Namespace:              s.namespace,
			SocketDir:              &s.socketDir,
			ContainerdTtrpcAddress: s.events,
		}
		if s.options != nil {
			bp.Extensions = []*bootstrap.Extension{{Value: s.options}}
		}
		params, err = proto.Marshal(bp)
	}
	if err != nil {
		return "", 0, fmt.Errorf("encode bootstrap params: %w", err)
	}
	cmd := exec.CommandContext(ctx, s.binary, s.args("start")...)
	cmd.Dir = s.bundle
	cmd.Stdin = bytes.NewReader(params)
	cmd.Env = append(os.Environ(), "NAMESPACE="+s.namespace)
	if s.events != "" {
		cmd.Env = append(cmd.Env, "TTRPC_ADDRESS="+s.events)
	}
	cmd.Env = append(cmd.Env, s.env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", 0, fmt.Errorf("%s start: %w: %s", s.binary, err, strings.TrimSpace(stderr.String()))
	}
	addr, version, err := parseStartResult(stdout.Bytes())
	if err != nil {
		return "", 0, fmt.Errorf("%s start: %w", s.binary, err)
	}
	return addr, version, nil
}

// parseStartResult accepts the three answers a runtime-v2 shim may give: a protobuf
// BootstrapResult, the legacy JSON, or a bare address (task API v2, as containerd
// reads it). It returns the address and the task API version.
func parseStartResult(out []byte) (string, int, error) {
	trimmed := strings.TrimSpace(string(out))
	switch {
	case trimmed == "":
		return "", 0, errors.New("shim printed no address")
	case strings.HasPrefix(trimmed, "unix://") || strings.HasPrefix(trimmed, "/"):
		return trimmed, 2, nil
	case strings.HasPrefix(trimmed, "{"):
		var res struct {
			Version  int    `json:"version"`
			Address  string `json:"address"`
			Protocol string `json:"protocol"`
		}
		if err := json.Unmarshal([]byte(trimmed), &res); err != nil {
			return "", 0, fmt.Errorf("parse shim start JSON %q: %w", trimmed, err)
		}
		if res.Protocol != "" && res.Protocol != "ttrpc" {
			return "", 0, fmt.Errorf("shim speaks %q; crisp needs ttrpc", res.Protocol)
		}
		return res.Address, taskVersion(res.Version), checkVersion(res.Version)
	}
	var res bootstrap.BootstrapResult
	if err := proto.Unmarshal(out, &res); err != nil || res.GetAddress() == "" {
		return "", 0, fmt.Errorf("shim start printed neither a BootstrapResult nor an address: %q", trimmed)
	}
	if p := res.GetProtocol(); p != "" && p != "ttrpc" {
		return "", 0, fmt.Errorf("shim speaks %q; crisp needs ttrpc", p)
	}
	return res.GetAddress(), taskVersion(int(res.GetVersion())), checkVersion(int(res.GetVersion()))
}

// taskVersion is the task API a bootstrap version stands for: 3 serves task v3, all
// before it task v2.
func taskVersion(v int) int {
	if v >= 3 {
		return 3
	}
	return 2
}

func checkVersion(v int) error {
	if v > 3 {
		return fmt.Errorf("shim bootstrap version %d is newer than crisp understands (3)", v)
	}
	return nil
}

// delete runs `shim delete`, the contract's way to clean up after a shim that is gone.
func (s shimCall) delete(ctx context.Context) (*taskapi.DeleteResponse, error) {
	cmd := exec.CommandContext(ctx, s.binary, s.args("delete")...)
	cmd.Dir = s.bundle
	if _, err := os.Stat(s.bundle); err != nil {
		cmd.Dir = ""
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s delete: %w: %s", s.binary, err, strings.TrimSpace(stderr.String()))
	}
	var resp taskapi.DeleteResponse
	if err := proto.Unmarshal(stdout.Bytes(), &resp); err != nil {
		return nil, fmt.Errorf("%s delete printed no DeleteResponse: %w", s.binary, err)
	}
	return &resp, nil
}

// dialShim connects to a shim's ttrpc socket; onClose runs when the connection drops,
// which is how the controller learns that a shim died.
func dialShim(ctx context.Context, address string, opts []ttrpc.ClientOpts, onClose func()) (*ttrpc.Client, error) {
	path := strings.TrimPrefix(address, "unix://")
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("dial shim %s: %w", address, err)
	}
	return ttrpc.NewClient(conn, append(opts, ttrpc.WithOnClose(onClose))...), nil
}

// readShimPid reads the pid the shim wrote into its bundle; 0 when unknown.
func readShimPid(bundle string) int {
	data, err := os.ReadFile(filepath.Join(bundle, "shim.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	st, err := proc.ReadStat(pid)
	return err == nil && st.State != 'Z' && st.State != 'X'
}

// isShimOf reports whether pid is a shim serving pod id, judged by its command line,
// so that a recycled pid is never mistaken for the shim.
func isShimOf(pid int, id string) bool {
	if pid <= 0 {
		return false
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	return hasArg(strings.Split(string(data), "\x00"), "-id", id)
}

// waitGone polls until pid has exited or the timeout passes.
func waitGone(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for processAlive(pid) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// ResolveShim finds a shim binary: an absolute path as is, else next to criserver's
// own binary (so `make run` from a build dir works), else on PATH.
func ResolveShim(name string) (string, error) {
	if filepath.IsAbs(name) {
		if _, err := os.Stat(name); err != nil {
			return "", fmt.Errorf("shim binary %s: %w", name, err)
		}
		return name, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("shim binary %q not found next to criserver or on PATH: %w", name, err)
	}
	return p, nil
}
