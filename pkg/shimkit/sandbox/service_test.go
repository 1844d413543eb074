package sandbox

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/anypb"

	sandboxapi "github.com/crisp-runtime/crisp/api/containerd/sandbox/v1"
)

// fakePod records the Service's calls; proc, when set, is what Start returns.
type fakePod struct {
	mu        sync.Mutex
	calls     []string
	proc      *fakeProc
	createErr error
	exit      *uint32
}

func (p *fakePod) call(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, name)
}

func (p *fakePod) Create(context.Context, *CreateRequest) error { p.call("create"); return p.createErr }
func (p *fakePod) Start(context.Context) (Process, error) {
	p.call("start")
	if p.proc == nil {
		return nil, nil
	}
	return p.proc, nil
}
func (p *fakePod) Stop(context.Context) error   { p.call("stop"); return nil }
func (p *fakePod) Remove(context.Context) error { p.call("remove"); return nil }
func (p *fakePod) Exited(status uint32, _ time.Time) {
	p.call("exited")
	p.mu.Lock()
	p.exit = &status
	p.mu.Unlock()
}
func (p *fakePod) Metrics(context.Context) (*anypb.Any, error) {
	return &anypb.Any{TypeUrl: "m"}, nil
}
func (p *fakePod) Info(verbose bool) map[string]string {
	if verbose {
		return map[string]string{"v": "1"}
	}
	return map[string]string{}
}

// fakeProc is a pod process that exits with 143 when stopped, or with what exitWith
// sends.
type fakeProc struct {
	done   chan struct{}
	once   sync.Once
	status uint32
}

func newFakeProc() *fakeProc { return &fakeProc{done: make(chan struct{})} }

func (f *fakeProc) Pid() int             { return 4242 }
func (f *fakeProc) StartedAt() time.Time { return time.Unix(100, 0) }
func (f *fakeProc) exitWith(status uint32) {
	f.once.Do(func() { f.status = status; close(f.done) })
}
func (f *fakeProc) Stop(context.Context, time.Duration) error { f.exitWith(143); return nil }
func (f *fakeProc) Done() <-chan struct{}                     { return f.done }
func (f *fakeProc) Exited() (uint32, time.Time, bool)         { return f.status, time.Unix(200, 0), true }

func TestLifecycle(t *testing.T) {
	for _, tc := range []struct {
		name     string
		proc     bool
		wantPid  uint32
		wantExit uint32
	}{
		{"with a process", true, 4242, 143},
		{"without a process", false, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			pod := &fakePod{}
			if tc.proc {
				pod.proc = newFakeProc()
			}
			var order []string
			s := New(Config{ID: "p1", Name: "test", Pod: pod,
				BeforeShutdownReply: func() { order = append(order, "before") }})
			if s.Created() {
				t.Fatal("created before CreateSandbox")
			}
			if _, err := s.SandboxStatus(ctx, &sandboxapi.SandboxStatusRequest{SandboxID: "p1"}); !errdefs.IsNotFound(err) {
				t.Fatalf("status before create = %v, want NotFound", err)
			}
			if _, err := s.CreateSandbox(ctx, &sandboxapi.CreateSandboxRequest{SandboxID: "p2"}); !errdefs.IsInvalidArgument(err) {
				t.Fatalf("create of another id = %v, want InvalidArgument", err)
			}
			if _, err := s.CreateSandbox(ctx, &sandboxapi.CreateSandboxRequest{SandboxID: "p1"}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.CreateSandbox(ctx, &sandboxapi.CreateSandboxRequest{SandboxID: "p1"}); !errdefs.IsAlreadyExists(err) {
				t.Fatalf("second create = %v, want AlreadyExists", err)
			}
			st, err := s.SandboxStatus(ctx, &sandboxapi.SandboxStatusRequest{SandboxID: "p1"})
			if err != nil || st.GetState() != StateNotReady {
				t.Fatalf("status after create = %v, %v; want NOTREADY", st, err)
			}
			resp, err := s.StartSandbox(ctx, &sandboxapi.StartSandboxRequest{SandboxID: "p1"})
			if err != nil || resp.GetPid() != tc.wantPid {
				t.Fatalf("start = %v, %v; want pid %d", resp, err, tc.wantPid)
			}
			again, err := s.StartSandbox(ctx, &sandboxapi.StartSandboxRequest{SandboxID: "p1"})
			if err != nil || again.GetPid() != resp.GetPid() {
				t.Fatalf("second start = %v, %v; want the first answer", again, err)
			}
			st, err = s.SandboxStatus(ctx, &sandboxapi.SandboxStatusRequest{SandboxID: "p1", Verbose: true})
			if err != nil || st.GetState() != StateReady || st.GetPid() != tc.wantPid || st.GetInfo()["v"] != "1" {
				t.Fatalf("status after start = %v, %v", st, err)
			}
			if pid, ok := s.Pid(); ok != tc.proc || uint32(pid) != tc.wantPid {
				t.Fatalf("Pid = %d, %v", pid, ok)
			}
			waited := make(chan *sandboxapi.WaitSandboxResponse, 1)
			go func() {
				w, _ := s.WaitSandbox(ctx, &sandboxapi.WaitSandboxRequest{SandboxID: "p1"})
				waited <- w
			}()
			if _, err := s.StopSandbox(ctx, &sandboxapi.StopSandboxRequest{SandboxID: "p1", TimeoutSecs: 1}); err != nil {
				t.Fatal(err)
			}
			select {
			case w := <-waited:
				if w.GetExitStatus() != tc.wantExit {
					t.Fatalf("wait = %v, want exit %d", w, tc.wantExit)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("WaitSandbox did not return after the stop")
			}
			st, _ = s.SandboxStatus(ctx, &sandboxapi.SandboxStatusRequest{SandboxID: "p1"})
			if st.GetState() != StateNotReady || st.GetExitedAt() == nil {
				t.Fatalf("status after stop = %v", st)
			}
			if _, err := s.StartSandbox(ctx, &sandboxapi.StartSandboxRequest{SandboxID: "p1"}); !errdefs.IsFailedPrecondition(err) {
				t.Fatalf("start after stop = %v, want FailedPrecondition", err)
			}
			if _, err := s.ShutdownSandbox(ctx, &sandboxapi.ShutdownSandboxRequest{SandboxID: "p1"}); err != nil {
				t.Fatal(err)
			}
			pod.mu.Lock()
			defer pod.mu.Unlock()
			// Exited is told once; the Pod's stop runs at StopSandbox and again at shutdown.
			want := []string{"create", "start", "exited", "stop", "stop", "remove"}
			if !slices.Equal(pod.calls, want) || pod.exit == nil || *pod.exit != tc.wantExit {
				t.Errorf("pod calls %v (exit %v), want %v", pod.calls, pod.exit, want)
			}
			if !slices.Equal(order, []string{"before"}) {
				t.Errorf("shutdown hooks %v", order)
			}
		})
	}
}

// The process exiting by itself ends the sandbox: WaitSandbox returns its status.
func TestProcessExit(t *testing.T) {
	ctx := context.Background()
	proc := newFakeProc()
	s := New(Config{ID: "p1", Pod: &fakePod{proc: proc}})
	if _, err := s.CreateSandbox(ctx, &sandboxapi.CreateSandboxRequest{SandboxID: "p1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.StartSandbox(ctx, &sandboxapi.StartSandboxRequest{SandboxID: "p1"}); err != nil {
		t.Fatal(err)
	}
	proc.exitWith(7)
	w, err := s.WaitSandbox(ctx, &sandboxapi.WaitSandboxRequest{SandboxID: "p1"})
	if err != nil || w.GetExitStatus() != 7 {
		t.Fatalf("wait = %v, %v; want 7", w, err)
	}
}

// A Pod's error reaches the caller unchanged, and leaves no sandbox.
func TestCreateError(t *testing.T) {
	ctx := context.Background()
	s := New(Config{ID: "p1", Pod: &fakePod{createErr: Errorf(errdefs.ErrInvalidArgument, "bad cgroup_parent")}})
	_, err := s.CreateSandbox(ctx, &sandboxapi.CreateSandboxRequest{SandboxID: "p1"})
	if !errdefs.IsInvalidArgument(err) || err.Error() != "bad cgroup_parent" {
		t.Fatalf("create = %v", err)
	}
	if s.Created() {
		t.Fatal("a refused sandbox is created")
	}
	if _, err := s.UpdateSandbox(ctx, &sandboxapi.UpdateSandboxRequest{SandboxID: "p1"}); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Fatalf("update = %v, want NotImplemented", err)
	}
	if _, err := s.PingSandbox(ctx, &sandboxapi.PingRequest{SandboxID: "p9"}); !errdefs.IsNotFound(err) {
		t.Fatalf("ping of another id = %v, want NotFound", err)
	}
}
