package cri

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/controller"
)

// maxExecOutput caps what ExecSync returns per stream: together they stay under
// kubelet's 16 MiB message limit.
const maxExecOutput = 4 << 20

// errOutputCap marks output beyond maxExecOutput.
var errOutputCap = fmt.Errorf("output exceeds the ExecSync cap of %d bytes per stream: %w", maxExecOutput, errdefs.ErrResourceExhausted)

// ExecSync runs a command in a running container and returns its exit code and
// output, killing it when the timeout passes.
func (s *Service) ExecSync(ctx context.Context, req *runtime.ExecSyncRequest) (*runtime.ExecSyncResponse, error) {
	c, err := s.resolveContainer(req.GetContainerId())
	if err != nil {
		return nil, toStatus(err)
	}
	if len(req.GetCmd()) == 0 {
		return nil, toStatus(invalid("exec command is empty"))
	}
	rec := c.snapshot()
	if rec.State != stateRunning {
		return nil, toStatus(fmt.Errorf("container %s is not running: %w", rec.ID, errdefs.ErrFailedPrecondition))
	}
	proc, err := s.execProcess(rec.ID, req.GetCmd(), false)
	if err != nil {
		return nil, toStatus(err)
	}
	execID := newID()[:32]
	dir := filepath.Join(s.cfg.StateDir, "exec", execID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, toStatus(fmt.Errorf("exec dir: %w", err))
	}
	defer os.RemoveAll(dir)
	var stdout, stderr capBuffer
	streams, err := openFIFOs(dir, map[string]*capBuffer{"stdout": &stdout, "stderr": &stderr})
	if err != nil {
		return nil, toStatus(err)
	}
	defer streams.close()

	if timeout := criTimeout(req.GetTimeout()); timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	if err := s.ctrl.Exec(ctx, controller.ExecSpec{
		SandboxID: rec.PodID, ContainerID: rec.ID, ExecID: execID, Process: proc,
		Stdout: streams.path("stdout"), Stderr: streams.path("stderr"),
	}); err != nil {
		return nil, toStatus(err)
	}
	defer s.ctrl.DeleteExec(rec.PodID, rec.ID, execID)
	// The shim holds the write ends now: our own keep-alive writers can go, so the
	// readers see EOF when the process (and whatever inherited its stdio) exits.
	streams.closeWriters()
	st, err := s.ctrl.WaitExec(ctx, rec.PodID, rec.ID, execID)
	if err != nil {
		if ctx.Err() != nil {
			_ = s.ctrl.KillExec(context.Background(), rec.PodID, rec.ID, execID, syscall.SIGKILL)
			return nil, toStatus(fmt.Errorf("exec %v in container %s: timeout %ds exceeded: %w", req.GetCmd(), rec.ID, req.GetTimeout(), context.DeadlineExceeded))
		}
		return nil, toStatus(err)
	}
	streams.wait(2 * time.Second)
	if stdout.over || stderr.over {
		return nil, toStatus(errOutputCap)
	}
	return &runtime.ExecSyncResponse{Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), ExitCode: int32(st.ExitStatus)}, nil
}

// execProcess builds an exec's process from the container's own spec: same user,
// environment, working dir, capabilities and limits, new arguments.
func (s *Service) execProcess(id string, cmd []string, tty bool) (*specs.Process, error) {
	data, err := os.ReadFile(filepath.Join(s.cfg.StateDir, "containers", id, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("read spec of container %s: %w", id, err)
	}
	var sp specs.Spec
	if err := json.Unmarshal(data, &sp); err != nil {
		return nil, fmt.Errorf("decode spec of container %s: %w", id, err)
	}
	if sp.Process == nil {
		return nil, fmt.Errorf("container %s has no process spec: %w", id, errdefs.ErrFailedPrecondition)
	}
	p := *sp.Process
	p.Args = cmd
	p.Terminal = tty
	p.ConsoleSize = nil
	return &p, nil
}

// capBuffer collects output up to maxExecOutput and remembers if there was more.
type capBuffer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	over bool
}

func (b *capBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := maxExecOutput - b.buf.Len(); len(p) > room {
		b.buf.Write(p[:max(room, 0)])
		b.over = true
		return len(p), nil
	}
	return b.buf.Write(p)
}

// Bytes returns what was collected.
func (b *capBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf.Bytes()...)
}

// fifoSet is the FIFOs of one exec: read ends copied into buffers, plus write ends we
// hold until the shim has opened its own, so a reader never sees EOF too early.
type fifoSet struct {
	dir     string
	readers []*os.File
	writers []*os.File
	done    sync.WaitGroup
}

func openFIFOs(dir string, sinks map[string]*capBuffer) (*fifoSet, error) {
	fs := &fifoSet{dir: dir}
	for name, sink := range sinks {
		p := filepath.Join(dir, name)
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			fs.close()
			return nil, fmt.Errorf("create fifo %s: %w", p, err)
		}
		r, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			fs.close()
			return nil, fmt.Errorf("open fifo %s: %w", p, err)
		}
		w, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			_ = r.Close()
			fs.close()
			return nil, fmt.Errorf("open fifo %s: %w", p, err)
		}
		fs.readers = append(fs.readers, r)
		fs.writers = append(fs.writers, w)
		fs.done.Add(1)
		go func() {
			defer fs.done.Done()
			_, err := io.Copy(sink, r)
			if err != nil && !errors.Is(err, os.ErrClosed) {
				_, _ = sink.Write(nil)
			}
		}()
	}
	return fs, nil
}

func (fs *fifoSet) path(name string) string { return filepath.Join(fs.dir, name) }

func (fs *fifoSet) closeWriters() {
	for _, w := range fs.writers {
		_ = w.Close()
	}
	fs.writers = nil
}

// wait gives the copiers up to d to drain after the process exited; a grandchild
// still holding the stdio must not block ExecSync forever.
func (fs *fifoSet) wait(d time.Duration) {
	ch := make(chan struct{})
	go func() { fs.done.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(d):
	}
}

func (fs *fifoSet) close() {
	fs.closeWriters()
	for _, r := range fs.readers {
		_ = r.Close()
	}
	fs.done.Wait()
}
