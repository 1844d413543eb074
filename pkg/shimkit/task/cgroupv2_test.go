package task

import (
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crisp-runtime/crisp/internal/cgstats/v2test"
)

// memoryEvents is memory.events as a v2 kernel writes it.
func memoryEvents(max, oom, oomKill int) string {
	return fmt.Sprintf("low 0\nhigh 0\nmax %d\noom %d\noom_kill %d\noom_group_kill 0\n", max, oom, oomKill)
}

// TestOOMWatchV2 drives the v2 OOM watch over a memory.events file in a v2 node's
// layout: the kernel's notification of a change to memory.events is an inotify
// IN_MODIFY, which a write to a plain file also produces. A kill is an oom_kill count
// above the one at the container's start; other memory events (max, oom without a
// kill) are not.
func TestOOMWatchV2(t *testing.T) {
	for _, tc := range []struct {
		name   string
		start  string   // memory.events when the watch starts
		writes []string // what the kernel writes next, in order
		kill   bool     // onKill must have run (once) after the last write
	}{
		{"kill", memoryEvents(0, 0, 0), []string{memoryEvents(3, 1, 1)}, true},
		{"limit hit, reclaimed, no kill", memoryEvents(0, 0, 0), []string{memoryEvents(5, 0, 0), memoryEvents(9, 1, 0)}, false},
		// The counter is hierarchical and cumulative: kills before the start (an earlier
		// container in the cgroup) are not this container's.
		{"kills before the start", memoryEvents(4, 2, 2), []string{memoryEvents(6, 2, 2)}, false},
		{"kill after earlier kills", memoryEvents(4, 2, 2), []string{memoryEvents(6, 2, 2), memoryEvents(7, 3, 3)}, true},
		{"two kills report once", memoryEvents(0, 0, 0), []string{memoryEvents(1, 1, 1), memoryEvents(2, 2, 2)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := v2test.New(t)
			dir := node.Mkdir("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice/crisp-c1.scope")
			node.Write(dir, map[string]string{"memory.events": tc.start})
			var kills atomic.Int32
			w, err := watchOOMIn(dir, true, discard(), func() { kills.Add(1) })
			if err != nil {
				t.Fatal(err)
			}
			defer w.stop()
			if w.file != filepath.Join(dir, "memory.events") {
				t.Errorf("watching %s", w.file)
			}
			for _, content := range tc.writes {
				node.Write(dir, map[string]string{"memory.events": content})
			}
			want := int32(0)
			if tc.kill {
				want = 1
			}
			// The event is read by a goroutine: wait for the kill, or long enough that
			// a wrong one would have shown.
			deadline := time.Now().Add(500 * time.Millisecond)
			if tc.kill {
				deadline = time.Now().Add(5 * time.Second)
			}
			for time.Now().Before(deadline) && kills.Load() < want {
				time.Sleep(5 * time.Millisecond)
			}
			if tc.kill {
				time.Sleep(50 * time.Millisecond) // a second call would come now
			}
			if got := kills.Load(); got != want {
				t.Errorf("onKill ran %d times, want %d", got, want)
			}
			// check (what Wait/State/ContainerInfo use at exit) agrees.
			if got := w.check(); got != tc.kill {
				t.Errorf("check = %v, want %v", got, tc.kill)
			}
			// The cgroup removed after the exit: what was seen stays.
			if err := os.Remove(filepath.Join(dir, "memory.events")); err != nil {
				t.Fatal(err)
			}
			if got := w.check(); got != tc.kill {
				t.Errorf("check after the cgroup is gone = %v, want %v", got, tc.kill)
			}
		})
	}
}

// TestOOMWatchV2CheckWithoutEvent: a kill is seen at exit even when the inotify event
// has not been read yet (check reads the counter itself).
func TestOOMWatchV2CheckWithoutEvent(t *testing.T) {
	node := v2test.New(t)
	dir := node.Mkdir("/crisp/crisp-c1")
	node.Write(dir, map[string]string{"memory.events": memoryEvents(0, 0, 0)})
	w, err := watchOOMIn(dir, true, discard(), func() {})
	if err != nil {
		t.Fatal(err)
	}
	w.stop() // no event will be read
	node.Write(dir, map[string]string{"memory.events": memoryEvents(1, 1, 1)})
	if !w.check() {
		t.Error("check missed the kill")
	}
}

// TestOOMWatchReportsKillSeenAtExit: when the exit reads the counter before the event
// reader does (a container killed at once, as a memory hog is), the kill is still
// reported, once: containerd before 2.4 learns of it only from the TaskOOM event
// that onKill publishes (containerd 2.2.9 reported such a container as Error).
func TestOOMWatchReportsKillSeenAtExit(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ownGone  bool // the container's memory.events is gone at exit (systemd scope)
		wantKill bool
	}{
		{"own counter", false, true},
		{"own counter gone, the pod's counted it", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := v2test.New(t)
			pod := node.Mkdir("/pod")
			node.Write(pod, map[string]string{"memory.events": memoryEvents(0, 0, 0)})
			dir := node.Mkdir("/pod/crisp-c1")
			node.Write(dir, map[string]string{"memory.events": memoryEvents(0, 0, 0)})
			var kills atomic.Int32
			w, err := watchOOMIn(dir, true, discard(), func() { kills.Add(1) })
			if err != nil {
				t.Fatal(err)
			}
			w.stop() // the event is never read: the exit sees the kill first
			node.Write(pod, map[string]string{"memory.events": memoryEvents(1, 1, 1)})
			if tc.ownGone {
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
			} else {
				node.Write(dir, map[string]string{"memory.events": memoryEvents(1, 1, 1)})
			}
			if got := w.checkExit(true); got != tc.wantKill {
				t.Fatalf("checkExit = %v, want %v", got, tc.wantKill)
			}
			w.checkExit(true)
			if got := kills.Load(); got != 1 {
				t.Errorf("onKill ran %d times, want once", got)
			}
		})
	}
}

// TestOOMWatchV2ScopeGoneAtExit: under the systemd driver the container's scope (and
// its memory.events) may be gone before the exit is checked, the event unread. The
// pod's memory.events, which counts its children's kills, then decides, but only for
// an init that died of SIGKILL.
func TestOOMWatchV2ScopeGoneAtExit(t *testing.T) {
	for _, tc := range []struct {
		name          string
		parentBefore  int // the pod's oom_kill at the container's start
		parentAtExit  int
		sigkill, want bool
	}{
		{"killed by the OOM killer", 1, 2, true, true},
		{"SIGKILL, no kill in the pod", 1, 1, true, false},
		{"exited by itself while a sibling was OOM-killed", 1, 2, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := v2test.New(t)
			pod := node.Mkdir("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice")
			node.Write(pod, map[string]string{"memory.events": memoryEvents(0, tc.parentBefore, tc.parentBefore)})
			dir := node.Mkdir("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice/crisp-c1.scope")
			node.Write(dir, map[string]string{"memory.events": memoryEvents(0, 0, 0)})
			w, err := watchOOMIn(dir, true, discard(), func() {})
			if err != nil {
				t.Fatal(err)
			}
			w.stop() // the event is never read
			node.Write(pod, map[string]string{"memory.events": memoryEvents(0, tc.parentAtExit, tc.parentAtExit)})
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if got := w.checkExit(tc.sigkill); got != tc.want {
				t.Errorf("checkExit = %v, want %v", got, tc.want)
			}
		})
	}
	// With its own counter readable, the container's decides, not the pod's.
	node := v2test.New(t)
	pod := node.Mkdir("/pod")
	node.Write(pod, map[string]string{"memory.events": memoryEvents(0, 0, 0)})
	dir := node.Mkdir("/pod/crisp-c1")
	node.Write(dir, map[string]string{"memory.events": memoryEvents(0, 0, 0)})
	w, err := watchOOMIn(dir, true, discard(), func() {})
	if err != nil {
		t.Fatal(err)
	}
	w.stop()
	node.Write(pod, map[string]string{"memory.events": memoryEvents(0, 1, 1)})
	if w.checkExit(true) {
		t.Error("a sibling's kill counted although the container's own counter shows none")
	}
}

// TestOOMWatchV2NoMemoryController: without the memory controller enabled for the
// cgroup there is no memory.events; the watch fails (the caller logs it and goes on
// without one) instead of watching nothing.
func TestOOMWatchV2NoMemoryController(t *testing.T) {
	node := v2test.New(t)
	dir := node.Mkdir("/crisp/crisp-c1")
	if w, err := watchOOMIn(dir, true, discard(), func() {}); err == nil {
		w.stop()
		t.Fatal("watch of a cgroup without memory.events started")
	}
}
