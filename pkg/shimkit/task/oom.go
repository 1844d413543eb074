package task

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"github.com/opencontainers/cgroups"
	"golang.org/x/sys/unix"
)

// oomWatch tells whether a process of a container was killed by the OOM killer. The
// oom_kill counter of the container's memory cgroup is the truth: cgroup v1 counts it in
// memory.oom_control of the victim's cgroup, v2 in memory.events (hierarchically), so a
// kill counts whether the container's own limit or the pod's was hit. The counter is
// checked when the kernel signals a memory event and again when the container exits, so a
// kill is seen even if the event came first.
//
// Under the systemd driver a container's cgroup is a scope, which systemd stops and
// removes as soon as it is empty: when the OOM killer took the container's last
// process, memory.events may be gone before the shim reads it (seen in the node VM,
// where a loaded host loses that race). The parent's (the pod's) memory.events counts
// the kill too, hierarchically, and outlives the scope: an init that died of SIGKILL
// while the parent's counter rose, with the container's own counter gone, was killed
// by the OOM killer (checkExit).
type oomWatch struct {
	file string // memory.oom_control (v1) or memory.events (v2)
	base uint64 // the counter when the container started
	// parent is the parent cgroup's memory.events (v2; "" when unreadable) and
	// parentBase its counter when the container started.
	parent     string
	parentBase uint64
	killed     atomic.Bool
	// reported is taken by whichever of the event reader and checkExit sees the
	// kill first, which then runs onKill: containerd before 2.4 learns of the kill
	// only from that (a TaskOOM event), and an exit often reaches checkExit first.
	reported atomic.Bool
	onKill   func()
	// ev is the eventfd (v1) or inotify fd (v2), read through the runtime poller so that
	// watching costs a parked goroutine and no thread.
	ev  *os.File
	log *slog.Logger
}

// watchOOM starts watching the memory cgroup dir; onKill runs (once) when a kill is seen.
func watchOOM(dir string, log *slog.Logger, onKill func()) (*oomWatch, error) {
	return watchOOMIn(dir, cgroups.IsCgroup2UnifiedMode(), log, onKill)
}

// watchOOMIn is watchOOM with the hierarchy given: v2 watches dir/memory.events,
// else dir/memory.oom_control through an eventfd. Tests point it at a directory in a
// v2 node's layout.
func watchOOMIn(dir string, v2 bool, log *slog.Logger, onKill func()) (*oomWatch, error) {
	w := &oomWatch{log: log, onKill: onKill}
	if v2 {
		w.file = filepath.Join(dir, "memory.events")
	} else {
		w.file = filepath.Join(dir, "memory.oom_control")
	}
	base, err := readOOMKills(w.file)
	if err != nil {
		return nil, err
	}
	w.base = base
	if v2 {
		parent := filepath.Join(filepath.Dir(dir), "memory.events")
		if n, err := readOOMKills(parent); err == nil {
			w.parent, w.parentBase = parent, n
		}
		err = w.openInotify()
	} else {
		err = w.openEventfd(dir)
	}
	if err != nil {
		return nil, err
	}
	go w.run(v2)
	return w, nil
}

// openEventfd registers an eventfd for memory.oom_control through cgroup.event_control
// (cgroup v1). The kernel signals it when this cgroup or an ancestor runs out of memory.
func (w *oomWatch) openEventfd(dir string) error {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("eventfd: %w", err)
	}
	cfd, err := unix.Open(w.file, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = unix.Close(efd)
		return fmt.Errorf("open %s: %w", w.file, err)
	}
	// The registration holds its own references: the control file can be closed at once.
	defer unix.Close(cfd)
	ctl := filepath.Join(dir, "cgroup.event_control")
	if err := os.WriteFile(ctl, []byte(strconv.Itoa(efd)+" "+strconv.Itoa(cfd)), 0); err != nil {
		_ = unix.Close(efd)
		return fmt.Errorf("register oom event: %w", err)
	}
	w.ev = os.NewFile(uintptr(efd), "oom-eventfd")
	return nil
}

// openInotify watches memory.events for changes (cgroup v2 has no eventfd interface).
func (w *oomWatch) openInotify() error {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, w.file, unix.IN_MODIFY); err != nil {
		_ = unix.Close(fd)
		return fmt.Errorf("watch %s: %w", w.file, err)
	}
	w.ev = os.NewFile(uintptr(fd), "oom-inotify")
	return nil
}

func (w *oomWatch) run(v2 bool) {
	// Big enough for an eventfd counter and for several inotify events of a watch on
	// a file (they carry no name).
	var buf [8 * unix.SizeofInotifyEvent]byte
	for {
		if _, err := w.ev.Read(buf[:]); err != nil {
			// Closed by stop, or the cgroup is gone.
			return
		}
		if w.check() {
			w.report()
		}
	}
}

// report runs onKill, once for the watch.
func (w *oomWatch) report() {
	if w.reported.CompareAndSwap(false, true) {
		w.onKill()
	}
}

// check reads the counter and reports whether it shows a kill since the start.
func (w *oomWatch) check() bool {
	n, err := readOOMKills(w.file)
	if err != nil {
		// The cgroup is gone: whatever was seen before stays.
		return w.killed.Load()
	}
	if n > w.base {
		w.killed.Store(true)
	}
	return w.killed.Load()
}

// checkExit is check at the container's exit: sigkill says its init died of SIGKILL.
// When the container's own counter is gone (its scope removed), a rise of the parent's
// counter since the start stands for it, but only for a SIGKILLed init: a container
// that exited by itself was not the victim of a sibling's OOM kill.
// A kill seen here first is reported (onKill) here.
func (w *oomWatch) checkExit(sigkill bool) bool {
	if n, err := readOOMKills(w.file); err == nil {
		if n > w.base {
			w.killed.Store(true)
		}
	} else if !w.killed.Load() && sigkill && w.parent != "" {
		if n, err := readOOMKills(w.parent); err == nil && n > w.parentBase {
			w.log.Debug("container cgroup gone at exit; OOM kill counted by its parent", "parent", w.parent)
			w.killed.Store(true)
		}
	}
	killed := w.killed.Load()
	if killed {
		w.report()
	}
	return killed
}

func (w *oomWatch) stop() {
	_ = w.ev.Close()
}

// readOOMKills reads the oom_kill line of memory.oom_control or memory.events.
func readOOMKills(file string) (uint64, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	s := bufio.NewScanner(bytes.NewReader(data))
	for s.Scan() {
		k, v, ok := bytes.Cut(s.Bytes(), []byte{' '})
		if ok && string(k) == "oom_kill" {
			return strconv.ParseUint(string(v), 10, 64)
		}
	}
	// Kernels before 4.13 have no oom_kill counter in v1.
	return 0, errors.New(file + " has no oom_kill counter")
}
