package tasksandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/fifoio"
)

// OpenIO makes the stdio FIFOs of container id in its bundle and starts copying its
// output into the CRI log r names; it returns the FIFO paths a task Create gives the
// shim ("" for none). The copy lasts until DropIO.
func (s *Sandboxer) OpenIO(id string, r IORecord) (stdin, stdout, stderr string, err error) {
	bundle := s.containerBundle(id)
	t, err := newIO(bundle, r, true, s.log.With("container", id))
	if err != nil {
		return "", "", "", fmt.Errorf("stdio of container %s: %w", id, err)
	}
	s.iosMu.Lock()
	s.ios[id] = t
	s.iosMu.Unlock()
	stdin, stdout, stderr = r.fifoPaths(bundle)
	return stdin, stdout, stderr, nil
}

// IO is the output copy of container id; nil for a container of a shim that writes
// its own log.
func (s *Sandboxer) IO(id string) *IO {
	s.iosMu.Lock()
	defer s.iosMu.Unlock()
	return s.ios[id]
}

// DropIO stops the output copy of container id, if any.
func (s *Sandboxer) DropIO(id string) {
	s.iosMu.Lock()
	t := s.ios[id]
	delete(s.ios, id)
	s.iosMu.Unlock()
	if t != nil {
		t.Close()
	}
}

// AwaitOutput waits, up to IODrainTimeout, for the output of container id to reach
// its log after its exit; false if it is still open (a child that inherited it keeps
// the FIFOs open, and its output still reaches the log).
func (s *Sandboxer) AwaitOutput(id string) bool {
	t := s.IO(id)
	return t == nil || t.Wait(IODrainTimeout)
}

// Attach attaches to container id of pod podID: criserver copies a task-only shim's
// container's output, so criserver serves the session.
func (s *Sandboxer) Attach(podID, id, stdin, stdout, stderr string) error {
	t := s.IO(id)
	if t == nil {
		return fmt.Errorf("attach to container %s of pod %s: its output is not copied by criserver (not created through it, or deleted): %w", id, podID, errdefs.ErrFailedPrecondition)
	}
	if err := t.attach(stdin, stdout, stderr); err != nil {
		switch {
		case errors.Is(err, errAttachEnded), errors.Is(err, errAttachNoStdin):
			return fmt.Errorf("attach to container %s: %w: %w", id, err, errdefs.ErrFailedPrecondition)
		case errors.Is(err, os.ErrNotExist):
			return fmt.Errorf("attach to container %s: %w: %w", id, err, errdefs.ErrInvalidArgument)
		}
		return fmt.Errorf("attach to container %s: %w", id, err)
	}
	return nil
}

// PodContainers lists the container bundles whose io.json names pod podID: the
// containers a task-only shim runs for it.
func (s *Sandboxer) PodContainers(podID string) map[string]IORecord {
	entries, err := os.ReadDir(s.cfg.ContainerDir)
	if err != nil {
		return nil
	}
	out := map[string]IORecord{}
	for _, e := range entries {
		if r, ok := readIORecord(filepath.Join(s.cfg.ContainerDir, e.Name())); ok && r.SandboxID == podID {
			out[e.Name()] = r
		}
	}
	return out
}

// RecoverIO resumes the output copy of the containers of pod podID, whose task-only
// shim tc reaches, after a restart. A container that already exited gets what its
// FIFOs still hold.
func (s *Sandboxer) RecoverIO(ctx context.Context, tc taskapi.TTRPCTaskService, podID string) {
	for id, r := range s.PodContainers(podID) {
		t, err := newIO(s.containerBundle(id), r, false, s.log.With("container", id))
		if err != nil {
			s.log.Warn("resume output copy of container", "container", id, "err", err)
			continue
		}
		st, err := tc.State(ctx, &taskapi.StateRequest{ID: id})
		if err == nil && st.GetStatus() == tasktypes.Status_STOPPED {
			// Its writers are gone: the copy would never see them hang up.
			t.drain()
			continue
		}
		s.iosMu.Lock()
		s.ios[id] = t
		s.iosMu.Unlock()
	}
}

// OrphanPod reports the pod of container id when a task-only shim runs it (its
// io.json names it: only that shim can have it), and gives the shim's create, which
// may still be running, a reader of the output FIFOs: the shim opens them after making
// the container and waits for a reader, so without one it never ends. The output is
// dropped; release stops the reader.
func (s *Sandboxer) OrphanPod(id string) (podID string, release func(), ok bool) {
	bundle := s.containerBundle(id)
	r, ok := readIORecord(bundle)
	if !ok {
		return "", nil, false
	}
	r.LogPath = ""
	release = func() {}
	if t, err := newIO(bundle, r, false, s.log.With("container", id)); err == nil {
		release = t.Close
	}
	return r.SandboxID, release, true
}

// DiscardOutputs gives an exec of container id without stdout or stderr (a streaming
// client that asked for neither) a FIFO whose output is dropped, and sets *stdout or
// *stderr to it: containerd's runc shims insist on both paths, as containerd's CRI
// always gives them. The FIFOs live in the container's bundle and go once the exec's
// output ends; abort ends them at once, for an exec that did not start.
func (s *Sandboxer) DiscardOutputs(id, execID string, terminal bool, stdout, stderr *string) (abort func(), err error) {
	var files []*os.File
	abort = func() {
		for _, f := range files {
			_ = f.Close()
		}
	}
	for name, p := range map[string]*string{"stdout": stdout, "stderr": stderr} {
		if *p != "" || (terminal && name == "stderr") {
			continue
		}
		path := filepath.Join(s.containerBundle(id), fmt.Sprintf("exec-%s-%s", execID, name))
		if err := unix.Mkfifo(path, 0o600); err != nil {
			abort()
			return nil, fmt.Errorf("exec %s: FIFO for the unread %s: %w", execID, name, err)
		}
		f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			_ = os.Remove(path)
			abort()
			return nil, fmt.Errorf("exec %s: FIFO for the unread %s: %w", execID, name, err)
		}
		files = append(files, f)
		*p = path
		go func() {
			_ = fifoio.CopyFIFOIn(io.Discard, f)
			_ = f.Close()
			_ = os.Remove(path)
		}()
	}
	return abort, nil
}
