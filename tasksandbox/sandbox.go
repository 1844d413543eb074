package tasksandbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"syscall"
	"time"

	sandboxapi "github.com/containerd/containerd/api/runtime/sandbox/v1"
	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Task API service names: v3 is what crisp's clients are generated for, v2 what
// containerd 1.x shims (and CRI-O's VM runtime type) serve, with the same messages.
const (
	taskServiceV3 = "containerd.task.v3.Task"
	taskServiceV2 = "containerd.task.v2.Task"
)

// TaskV2 rewrites calls of the task v3 service to v2, for shims whose start answered
// bootstrap version 2: the messages are the same on the wire. It is a ttrpc client
// interceptor for the connection to such a shim.
func TaskV2(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response, _ *ttrpc.UnaryClientInfo, invoke ttrpc.Invoker) error {
	if req.Service == taskServiceV3 {
		req.Service = taskServiceV2
	}
	return invoke(ctx, req, resp)
}

// pauseStopGrace is how long StopSandbox waits for the pause container to exit after
// SIGKILL before it reports the failure.
const pauseStopGrace = 10 * time.Second

// Sandbox serves containerd's sandbox API on top of a task-only shim, the way
// containerd's podsandbox does: the sandbox is a pause container the shim runs like any
// other, with the sandbox's id. The controller drives it exactly as it drives a shim
// that serves the sandbox API itself; CreateSandbox expects the bundle written
// (PauseBundle.Write).
type Sandbox struct {
	tc taskapi.TTRPCTaskService
	// opts are the handler's runtime options, sent with every task Create.
	opts *anypb.Any
	// created is when StartSandbox started the pause container.
	created time.Time
	// version is the task API the shim serves (2 or 3).
	version int
}

// Sandbox returns the sandbox API of the pod of handler whose task-only shim tc
// reaches: created is when its pause container started (zero before StartSandbox),
// version the task API the shim serves (2 or 3).
func (s *Sandboxer) Sandbox(tc taskapi.TTRPCTaskService, handler string, created time.Time, version int) *Sandbox {
	return &Sandbox{tc: tc, opts: s.Options(handler), created: created, version: version}
}

var _ sandboxapi.TTRPCSandboxService = (*Sandbox)(nil)

// CreateSandbox creates the pause container from the bundle at the request's path.
func (t *Sandbox) CreateSandbox(ctx context.Context, req *sandboxapi.CreateSandboxRequest) (*sandboxapi.CreateSandboxResponse, error) {
	if _, err := t.tc.Create(ctx, &taskapi.CreateTaskRequest{ID: req.GetSandboxID(), Bundle: req.GetBundlePath(), Options: t.opts}); err != nil {
		return nil, err
	}
	return &sandboxapi.CreateSandboxResponse{}, nil
}

// StartSandbox starts the pause container.
func (t *Sandbox) StartSandbox(ctx context.Context, req *sandboxapi.StartSandboxRequest) (*sandboxapi.StartSandboxResponse, error) {
	resp, err := t.tc.Start(ctx, &taskapi.StartRequest{ID: req.GetSandboxID()})
	if err != nil {
		return nil, err
	}
	t.created = time.Now()
	return &sandboxapi.StartSandboxResponse{Pid: resp.GetPid(), CreatedAt: timestamppb.New(t.created)}, nil
}

// Platform is Linux: crisp runs nothing else.
func (t *Sandbox) Platform(context.Context, *sandboxapi.PlatformRequest) (*sandboxapi.PlatformResponse, error) {
	return &sandboxapi.PlatformResponse{Platform: &types.Platform{OS: "linux"}}, nil
}

// StopSandbox kills the pause container (it holds nothing worth a graceful stop) and
// waits for it to exit.
func (t *Sandbox) StopSandbox(ctx context.Context, req *sandboxapi.StopSandboxRequest) (*sandboxapi.StopSandboxResponse, error) {
	id := req.GetSandboxID()
	st, err := t.tc.State(ctx, &taskapi.StateRequest{ID: id})
	if err != nil {
		return nil, err
	}
	if st.GetStatus() == tasktypes.Status_STOPPED {
		return &sandboxapi.StopSandboxResponse{}, nil
	}
	if _, err := t.tc.Kill(ctx, &taskapi.KillRequest{ID: id, Signal: uint32(syscall.SIGKILL), All: true}); err != nil && !isNotFound(err) {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, pauseStopGrace)
	defer cancel()
	if _, err := t.tc.Wait(wctx, &taskapi.WaitRequest{ID: id}); err != nil && !isNotFound(err) {
		return nil, fmt.Errorf("wait for the pause container of pod %s: %w", id, err)
	}
	return &sandboxapi.StopSandboxResponse{}, nil
}

// WaitSandbox waits for the pause container to exit.
func (t *Sandbox) WaitSandbox(ctx context.Context, req *sandboxapi.WaitSandboxRequest) (*sandboxapi.WaitSandboxResponse, error) {
	resp, err := t.tc.Wait(ctx, &taskapi.WaitRequest{ID: req.GetSandboxID()})
	if err != nil {
		return nil, err
	}
	return &sandboxapi.WaitSandboxResponse{ExitStatus: resp.GetExitStatus(), ExitedAt: resp.GetExitedAt()}, nil
}

// SandboxStatus is the pause container's state; verbose adds what the shim says of
// itself.
func (t *Sandbox) SandboxStatus(ctx context.Context, req *sandboxapi.SandboxStatusRequest) (*sandboxapi.SandboxStatusResponse, error) {
	id := req.GetSandboxID()
	st, err := t.tc.State(ctx, &taskapi.StateRequest{ID: id})
	if err != nil {
		return nil, err
	}
	state := "SANDBOX_NOTREADY"
	if st.GetStatus() == tasktypes.Status_RUNNING {
		state = "SANDBOX_READY"
	}
	resp := &sandboxapi.SandboxStatusResponse{SandboxID: id, Pid: st.GetPid(), State: state, ExitedAt: st.GetExitedAt()}
	if !t.created.IsZero() {
		resp.CreatedAt = timestamppb.New(t.created)
	}
	if req.GetVerbose() {
		resp.Info = map[string]string{
			"sandbox_mode": "task",
			"pause_status": st.GetStatus().String(),
			"pause_pid":    strconv.FormatUint(uint64(st.GetPid()), 10),
			"bundle":       st.GetBundle(),
		}
		resp.Info["task_api"] = strconv.Itoa(t.version)
		if c, err := t.tc.Connect(ctx, &taskapi.ConnectRequest{ID: id}); err == nil {
			resp.Info["shim_pid"] = strconv.FormatUint(uint64(c.GetShimPid()), 10)
			resp.Info["shim_version"] = c.GetVersion()
		}
	}
	return resp, nil
}

// PingSandbox asks the shim whether it still answers.
func (t *Sandbox) PingSandbox(ctx context.Context, req *sandboxapi.PingRequest) (*sandboxapi.PingResponse, error) {
	if _, err := t.tc.Connect(ctx, &taskapi.ConnectRequest{ID: req.GetSandboxID()}); err != nil {
		return nil, err
	}
	return &sandboxapi.PingResponse{}, nil
}

// ShutdownSandbox deletes the pause container and asks the shim to exit; the shim
// exits once it runs no container, and the controller kills it if it does not.
func (t *Sandbox) ShutdownSandbox(ctx context.Context, req *sandboxapi.ShutdownSandboxRequest) (*sandboxapi.ShutdownSandboxResponse, error) {
	id := req.GetSandboxID()
	if _, err := t.tc.Delete(ctx, &taskapi.DeleteRequest{ID: id}); err != nil && !isNotFound(err) {
		return nil, fmt.Errorf("delete the pause container of pod %s: %w", id, err)
	}
	if _, err := t.tc.Shutdown(ctx, &taskapi.ShutdownRequest{ID: id, Now: true}); err != nil && !errors.Is(err, ttrpc.ErrClosed) {
		return nil, err
	}
	return &sandboxapi.ShutdownSandboxResponse{}, nil
}

// SandboxMetrics reports the pause container's cgroup. The controller adds the pod's
// containers (Sandboxer.PodContainers): a task-only shim knows no pod cgroup.
func (t *Sandbox) SandboxMetrics(ctx context.Context, req *sandboxapi.SandboxMetricsRequest) (*sandboxapi.SandboxMetricsResponse, error) {
	resp, err := t.tc.Stats(ctx, &taskapi.StatsRequest{ID: req.GetSandboxID()})
	if err != nil {
		return nil, err
	}
	return &sandboxapi.SandboxMetricsResponse{Metrics: &types.Metric{Timestamp: timestamppb.Now(), ID: req.GetSandboxID(), Data: resp.GetStats()}}, nil
}

// UpdateSandbox is not implemented: a pause container has nothing to update.
func (t *Sandbox) UpdateSandbox(context.Context, *sandboxapi.UpdateSandboxRequest) (*sandboxapi.UpdateSandboxResponse, error) {
	return nil, fmt.Errorf("update of a task-only shim's sandbox: %w", errdefs.ErrNotImplemented)
}
