package tasksandbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/fifoio"
)

// bootstrapFile is where criserver records a task-only shim's start answer, as
// containerd records it (containerd's shims keep no address file): recovery reads it
// when criserver died before the pod was recorded.
const bootstrapFile = "bootstrap.json"

type bootstrapRecord struct {
	Version  int    `json:"version"`
	Address  string `json:"address"`
	Protocol string `json:"protocol"`
}

// WriteBootstrap records in bundle the address and task API version a task-only
// shim's start answered.
func WriteBootstrap(bundle, addr string, version int) error {
	data, err := json.Marshal(bootstrapRecord{Version: version, Address: addr, Protocol: "ttrpc"})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(bundle, bootstrapFile), data, 0o600)
}

// ReadBootstrap reads what WriteBootstrap wrote; ok is false without it.
func ReadBootstrap(bundle string) (addr string, version int, ok bool) {
	data, err := os.ReadFile(filepath.Join(bundle, bootstrapFile))
	if err != nil {
		return "", 0, false
	}
	var r bootstrapRecord
	if json.Unmarshal(data, &r) != nil || r.Address == "" {
		return "", 0, false
	}
	return r.Address, r.Version, true
}

// ShimPid asks the task-only shim of pod id for its pid (containerd's shims keep no
// pid file) and records it in bundle as shim.pid, where the controller finds crisp's
// own shim's; 0 if the shim does not answer.
func ShimPid(ctx context.Context, tc taskapi.TTRPCTaskService, id, bundle string) int {
	resp, err := tc.Connect(ctx, &taskapi.ConnectRequest{ID: id})
	if err != nil {
		return 0
	}
	pid := int(resp.GetShimPid())
	_ = os.WriteFile(filepath.Join(bundle, "shim.pid"), []byte(strconv.Itoa(pid)), 0o600)
	return pid
}

// RemoveShimSockets removes the socket of a task-only shim whose address criserver
// never learnt (it died during the shim's start), where runtime-v2 shims put it:
// sha256 of "<address>/<namespace>/<id>" in the socket dir crisp gives, or in
// containerd's /run/containerd/s, where containerd 1.x shims always put theirs. The
// name is the pod's alone and its shim is gone by now (the `start` that made the
// socket may still hold it open for a moment, which is why nothing is dialled).
func (s *Sandboxer) RemoveShimSockets(p Pod) {
	name := fmt.Sprintf("%x", sha256.Sum256([]byte(filepath.Join(s.cfg.Address, p.Namespace, p.ID))))
	for _, dir := range []string{s.cfg.SocketDir, "/run/containerd/s"} {
		path := filepath.Join(dir, name)
		if err := os.Remove(path); err == nil {
			s.log.Info("removed the socket of a shim whose start was cut short", "pod", p.ID, "socket", path)
		}
	}
}

// PrepareStart readies the bundle of a task-only shim's pod before the shim starts:
// the shim reads the pause container's spec at start (containerd's runc shim groups
// by its annotations) and logs to a FIFO someone must read. It returns criserver's
// reader of that FIFO; an adopted spare's is read already (nil).
func (s *Sandboxer) PrepareStart(p Pod, pause PauseBundle, adopted bool) (*ShimLog, error) {
	if err := pause.Write(p.Bundle); err != nil {
		return nil, err
	}
	if adopted {
		return nil, nil
	}
	l, err := s.OpenShimLog(p, true)
	if err != nil {
		return nil, fmt.Errorf("start shim for pod %s: %w", p.ID, err)
	}
	return l, nil
}

// PrepareSpare readies the bundle of a warm spare's task-only shim: containerd's
// shims read the bundle's spec at start (for the pod they group by, which a spare has
// none of) and log to a FIFO someone must read.
func (s *Sandboxer) PrepareSpare(p Pod) (*ShimLog, error) {
	if err := os.WriteFile(filepath.Join(p.Bundle, "config.json"), []byte("{}"), 0o600); err != nil {
		return nil, fmt.Errorf("spec of warm spare %s: %w", p.ID, err)
	}
	l, err := s.OpenShimLog(p, true)
	if err != nil {
		return nil, fmt.Errorf("warm spare %s: %w", p.ID, err)
	}
	return l, nil
}

// shimLogFIFO is the FIFO in the bundle a containerd shim writes its log (and its
// stderr) to; it refuses to start without one, and blocks logging until it is read.
const shimLogFIFO = "log"

// ShimLog is criserver's read end of a task-only shim's log FIFO.
type ShimLog struct{ f *os.File }

// Close stops the copy of the shim's log; a nil ShimLog is closed already.
func (l *ShimLog) Close() {
	if l != nil {
		_ = l.f.Close()
	}
}

// OpenShimLog makes (when create) the shim log FIFO of a task-only shim's pod and
// copies what the shim writes into criserver's log, one record per line. The copy
// ends when the shim exits or the ShimLog is closed.
func (s *Sandboxer) OpenShimLog(p Pod, create bool) (*ShimLog, error) {
	path := filepath.Join(p.Bundle, shimLogFIFO)
	if create {
		if err := unix.Mkfifo(path, 0o600); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("make shim log FIFO: %w", err)
		}
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open shim log FIFO: %w", err)
	}
	w := &lineLogger{log: s.log.With("pod", p.ID, "shim", filepath.Base(p.Shim))}
	go func() {
		_ = fifoio.CopyFIFOIn(w, f)
		w.flush()
	}()
	return &ShimLog{f: f}, nil
}

// ResumeShimLog reads a task-only shim's log FIFO again after a restart, before
// anything is asked of the shim: containerd's shims block in their logger, and with
// it in every call, while nobody reads it. nil when the shim was never started.
func (s *Sandboxer) ResumeShimLog(p Pod) *ShimLog {
	if _, err := os.Stat(filepath.Join(p.Bundle, shimLogFIFO)); err != nil {
		return nil
	}
	l, err := s.OpenShimLog(p, false)
	if err != nil {
		s.log.Warn("shim log of pod not copied", "pod", p.ID, "err", err)
	}
	return l
}

// maxShimLogLine bounds a line of a shim's log kept in memory before it is logged.
const maxShimLogLine = 8 << 10

// lineLogger logs each line written to it.
type lineLogger struct {
	log     *slog.Logger
	pending []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.pending = append(l.pending, p...)
	for {
		i := bytes.IndexByte(l.pending, '\n')
		if i < 0 {
			break
		}
		l.emit(l.pending[:i])
		l.pending = l.pending[i+1:]
	}
	if len(l.pending) > maxShimLogLine {
		l.flush()
	}
	if len(l.pending) == 0 {
		l.pending = nil
	}
	return len(p), nil
}

func (l *lineLogger) flush() {
	if len(l.pending) > 0 {
		l.emit(l.pending)
	}
	l.pending = nil
}

func (l *lineLogger) emit(line []byte) {
	if s := strings.TrimSpace(string(line)); s != "" {
		l.log.Info("shim log", "line", s)
	}
}
