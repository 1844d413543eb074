package shimconformance

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
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
)

// shimAddress is what the suite passes as -address: the containerd gRPC address a shim
// would publish to with a publish binary. Nothing listens there.
const shimAddress = "/run/crisp-shimtest/containerd.sock"

// startAnswer is what `shim start` printed, decoded.
type startAnswer struct {
	address string
	version int    // bootstrap/task API version: 3, else 2
	form    string // "BootstrapResult", "legacy JSON" or "bare address"
}

// shimRun is one shim process the suite started: its id and bundle, its address, and
// a connection.
type shimRun struct {
	s       *suite
	id      string
	bundle  string
	answer  startAnswer
	pid     int
	client  *ttrpc.Client
	tasks   *taskClient
	stopped bool
}

func (s *suite) shimArgs(id, bundle, action string) []string {
	return []string{"-namespace", s.namespace, "-address", shimAddress, "-id", id, "-bundle", bundle, action}
}

// runStart runs `shim start` the bootstrap way (legacy false: BootstrapParams on
// stdin) or the legacy way (flags and environment, the runtime options Any on stdin).
func (s *suite) runStart(ctx context.Context, id, bundle string, legacy bool) (startAnswer, error) {
	var stdin []byte
	var err error
	if legacy {
		if s.cfg.TaskOptions != nil {
			stdin, err = proto.Marshal(s.cfg.TaskOptions)
		}
	} else {
		dir := s.socketDir
		bp := &bootstrap.BootstrapParams{
			InstanceID:             id,
			Namespace:              s.namespace,
			ContainerdTtrpcAddress: s.events.address,
			ContainerdGrpcAddress:  shimAddress,
			SocketDir:              &dir,
			LogLevel:               bootstrap.LogLevel_LOG_LEVEL_INFO,
		}
		if s.cfg.TaskOptions != nil {
			bp.Extensions = []*bootstrap.Extension{{Value: s.cfg.TaskOptions}}
		}
		stdin, err = proto.Marshal(bp)
	}
	if err != nil {
		return startAnswer{}, err
	}
	s.shimLog(bundle)
	cmd := exec.CommandContext(ctx, s.cfg.Shim, s.shimArgs(id, bundle, "start")...)
	cmd.Dir = bundle
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Env = append(os.Environ(), "NAMESPACE="+s.namespace, "GRPC_ADDRESS="+shimAddress, "TTRPC_ADDRESS="+s.events.address)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		return startAnswer{}, startError{err: err, stderr: strings.TrimSpace(stderr.String())}
	}
	return parseStartAnswer(stdout.Bytes())
}

// startError is a `shim start` that exited unsuccessfully.
type startError struct {
	err    error
	stderr string
}

func (e startError) Error() string { return fmt.Sprintf("start: %v: %s", e.err, e.stderr) }

// shimLog makes the `log` FIFO containerd's shims write their log to (they wait for
// a reader of it) in a bundle and keeps a reader on it; the suite reports its tail
// when a shim fails.
func (s *suite) shimLog(bundle string) {
	path := filepath.Join(bundle, "log")
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.logs[path]; ok {
		return
	}
	c, err := newCollector(path)
	if err != nil {
		return
	}
	s.logs[path] = c
	s.cleanups = append(s.cleanups, c.close)
}

// parseStartAnswer accepts the three answers a runtime-v2 shim may print: a protobuf
// BootstrapResult, the legacy JSON, or a bare address.
func parseStartAnswer(out []byte) (startAnswer, error) {
	trimmed := strings.TrimSpace(string(out))
	switch {
	case trimmed == "":
		return startAnswer{}, errors.New("start printed nothing")
	case strings.HasPrefix(trimmed, "unix://") || strings.HasPrefix(trimmed, "/"):
		return startAnswer{address: trimmed, version: 2, form: "bare address"}, nil
	case strings.HasPrefix(trimmed, "{"):
		var res struct {
			Version  int    `json:"version"`
			Address  string `json:"address"`
			Protocol string `json:"protocol"`
		}
		if err := json.Unmarshal([]byte(trimmed), &res); err != nil {
			return startAnswer{}, fmt.Errorf("start printed bad JSON %q: %w", trimmed, err)
		}
		if res.Protocol != "" && res.Protocol != "ttrpc" {
			return startAnswer{}, fmt.Errorf("start answered protocol %q, not ttrpc", res.Protocol)
		}
		return startAnswer{address: res.Address, version: apiVersion(res.Version), form: "legacy JSON"}, nil
	}
	var res bootstrap.BootstrapResult
	if err := proto.Unmarshal(out, &res); err != nil || res.GetAddress() == "" {
		return startAnswer{}, fmt.Errorf("start printed neither a BootstrapResult nor an address: %q", trimmed)
	}
	if p := res.GetProtocol(); p != "" && p != "ttrpc" {
		return startAnswer{}, fmt.Errorf("start answered protocol %q, not ttrpc", p)
	}
	return startAnswer{address: res.GetAddress(), version: apiVersion(int(res.GetVersion())), form: "BootstrapResult"}, nil
}

func apiVersion(v int) int {
	if v >= 3 {
		return 3
	}
	return 2
}

func socketPath(address string) string {
	return strings.TrimPrefix(address, "unix://")
}

// startShim starts a shim for id in bundle, connects to it and registers its cleanup.
func (s *suite) startShim(ctx context.Context, id, bundle string, legacy bool) (*shimRun, error) {
	ans, err := s.runStart(ctx, id, bundle, legacy)
	if err != nil {
		return nil, err
	}
	r := &shimRun{s: s, id: id, bundle: bundle, answer: ans}
	s.addShim(r)
	if err := r.connect(ctx); err != nil {
		return r, err
	}
	return r, nil
}

// dial connects to the shim's socket and returns the connection and the peer's pid.
func dial(ctx context.Context, address string) (*ttrpc.Client, int, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socketPath(address))
	if err != nil {
		return nil, 0, err
	}
	pid := 0
	if uc, ok := conn.(*net.UnixConn); ok {
		if raw, err := uc.SyscallConn(); err == nil {
			_ = raw.Control(func(fd uintptr) {
				if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
					pid = int(cred.Pid)
				}
			})
		}
	}
	return ttrpc.NewClient(conn), pid, nil
}

func (r *shimRun) connect(ctx context.Context) error {
	c, pid, err := dial(ctx, r.answer.address)
	if err != nil {
		return fmt.Errorf("dial %s: %w", r.answer.address, err)
	}
	r.client = c
	r.tasks = newTaskClient(c, r.answer.version)
	r.pid = r.s.servingPid(r.id, r.bundle, pid)
	if r.pid <= 0 {
		return fmt.Errorf("no process found serving %s", r.answer.address)
	}
	return nil
}

// servingPid finds the serving shim's pid: the shim.pid containerd's shims write into
// the bundle, else the one process of the binary with -id id, else the socket's peer
// (which is the process that listened: the serving shim only if it made its socket).
func (s *suite) servingPid(id, bundle string, peer int) int {
	if data, err := os.ReadFile(filepath.Join(bundle, "shim.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && pid > 0 && alive(pid) {
			return pid
		}
	}
	if pids := s.shimPids(id); len(pids) == 1 {
		return pids[0]
	}
	if peer > 0 && alive(peer) {
		return peer
	}
	return 0
}

// runDelete runs `shim delete` for id and bundle and decodes its DeleteResponse.
func (s *suite) runDelete(ctx context.Context, id, bundle string) (*taskapi.DeleteResponse, error) {
	cmd := exec.CommandContext(ctx, s.cfg.Shim, s.shimArgs(id, bundle, "delete")...)
	cmd.Dir = bundle
	if _, err := os.Stat(bundle); err != nil {
		cmd.Dir = s.dir
	}
	cmd.Env = append(os.Environ(), "NAMESPACE="+s.namespace, "GRPC_ADDRESS="+shimAddress, "TTRPC_ADDRESS="+s.events.address)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second
	if s.cfg.TaskOptions != nil {
		if data, err := proto.Marshal(s.cfg.TaskOptions); err == nil {
			cmd.Stdin = bytes.NewReader(data)
		}
	}
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("delete: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var resp taskapi.DeleteResponse
	if err := proto.Unmarshal(stdout.Bytes(), &resp); err != nil {
		return nil, fmt.Errorf("delete printed no DeleteResponse (%q): %w", stdout.String(), err)
	}
	return &resp, nil
}

// kill ends the shim process for good: SIGKILL, wait for it to go, then `shim delete`
// for its own id, as containerd does after a shim died.
func (r *shimRun) kill() {
	if r.client != nil {
		_ = r.client.Close()
	}
	if r.pid > 0 && alive(r.pid) {
		_ = unix.Kill(r.pid, unix.SIGKILL)
		waitGone(r.pid, 5*time.Second)
	}
	if !r.stopped {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = r.s.runDelete(ctx, r.id, r.bundle)
		r.stopped = true
	}
	_ = os.Remove(socketPath(r.answer.address))
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	return s[i+2] != 'Z' && s[i+2] != 'X'
}

// waitGone waits up to d for pid to exit; it reports whether it did.
func waitGone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for alive(pid) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// shimPids lists the processes running the shim binary with -id id.
func (s *suite) shimPids(id string) []int {
	target, _ := filepath.EvalSymlinks(s.cfg.Shim)
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink("/proc/" + e.Name() + "/exe")
		if err != nil || (exe != target && exe != s.cfg.Shim) {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		for i := 0; i+1 < len(args); i++ {
			if (args[i] == "-id" || args[i] == "--id") && args[i+1] == id && alive(pid) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// taskClient calls containerd.task.v3.Task or, for a shim that answered an older
// bootstrap version, containerd.task.v2.Task: the messages are the same.
type taskClient struct {
	c       *ttrpc.Client
	service string
}

func newTaskClient(c *ttrpc.Client, version int) *taskClient {
	svc := "containerd.task.v3.Task"
	if version < 3 {
		svc = "containerd.task.v2.Task"
	}
	return &taskClient{c: c, service: svc}
}

func (t *taskClient) call(ctx context.Context, method string, req, resp any) error {
	return t.c.Call(ctx, t.service, method, req, resp)
}

func (t *taskClient) Create(ctx context.Context, req *taskapi.CreateTaskRequest) (*taskapi.CreateTaskResponse, error) {
	var resp taskapi.CreateTaskResponse
	return &resp, t.call(ctx, "Create", req, &resp)
}

func (t *taskClient) Start(ctx context.Context, id, execID string) (*taskapi.StartResponse, error) {
	var resp taskapi.StartResponse
	return &resp, t.call(ctx, "Start", &taskapi.StartRequest{ID: id, ExecID: execID}, &resp)
}

func (t *taskClient) State(ctx context.Context, id, execID string) (*taskapi.StateResponse, error) {
	var resp taskapi.StateResponse
	return &resp, t.call(ctx, "State", &taskapi.StateRequest{ID: id, ExecID: execID}, &resp)
}

func (t *taskClient) Delete(ctx context.Context, id, execID string) (*taskapi.DeleteResponse, error) {
	var resp taskapi.DeleteResponse
	return &resp, t.call(ctx, "Delete", &taskapi.DeleteRequest{ID: id, ExecID: execID}, &resp)
}

func (t *taskClient) Wait(ctx context.Context, id, execID string) (*taskapi.WaitResponse, error) {
	var resp taskapi.WaitResponse
	return &resp, t.call(ctx, "Wait", &taskapi.WaitRequest{ID: id, ExecID: execID}, &resp)
}

func (t *taskClient) Kill(ctx context.Context, id string, signal uint32, all bool) error {
	return t.call(ctx, "Kill", &taskapi.KillRequest{ID: id, Signal: signal, All: all}, &emptypb.Empty{})
}

func (t *taskClient) Pids(ctx context.Context, id string) (*taskapi.PidsResponse, error) {
	var resp taskapi.PidsResponse
	return &resp, t.call(ctx, "Pids", &taskapi.PidsRequest{ID: id}, &resp)
}

func (t *taskClient) Exec(ctx context.Context, req *taskapi.ExecProcessRequest) error {
	return t.call(ctx, "Exec", req, &emptypb.Empty{})
}

func (t *taskClient) ResizePty(ctx context.Context, id, execID string, w, h uint32) error {
	return t.call(ctx, "ResizePty", &taskapi.ResizePtyRequest{ID: id, ExecID: execID, Width: w, Height: h}, &emptypb.Empty{})
}

func (t *taskClient) CloseIO(ctx context.Context, id, execID string) error {
	return t.call(ctx, "CloseIO", &taskapi.CloseIORequest{ID: id, ExecID: execID, Stdin: true}, &emptypb.Empty{})
}

func (t *taskClient) Update(ctx context.Context, req *taskapi.UpdateTaskRequest) error {
	return t.call(ctx, "Update", req, &emptypb.Empty{})
}

func (t *taskClient) Stats(ctx context.Context, id string) (*taskapi.StatsResponse, error) {
	var resp taskapi.StatsResponse
	return &resp, t.call(ctx, "Stats", &taskapi.StatsRequest{ID: id}, &resp)
}

func (t *taskClient) Pause(ctx context.Context, id string) error {
	return t.call(ctx, "Pause", &taskapi.PauseRequest{ID: id}, &emptypb.Empty{})
}

func (t *taskClient) Resume(ctx context.Context, id string) error {
	return t.call(ctx, "Resume", &taskapi.ResumeRequest{ID: id}, &emptypb.Empty{})
}

func (t *taskClient) Connect(ctx context.Context, id string) (*taskapi.ConnectResponse, error) {
	var resp taskapi.ConnectResponse
	return &resp, t.call(ctx, "Connect", &taskapi.ConnectRequest{ID: id}, &resp)
}

func (t *taskClient) Shutdown(ctx context.Context, id string) error {
	return t.call(ctx, "Shutdown", &taskapi.ShutdownRequest{ID: id}, &emptypb.Empty{})
}
