package runc

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"
)

// criuLogErrors returns the lines of a CRIU log that report errors (at most the last
// five), formatted to end an error message: CRIU's errno alone says nothing actionable.
func criuLogErrors(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		if l := sc.Text(); strings.Contains(l, "Error") || strings.Contains(l, "err:") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	if len(lines) == 0 {
		return fmt.Sprintf(" (see %s)", path)
	}
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return fmt.Sprintf(": %s (log %s)", strings.Join(lines, "; "), path)
}

func criuLogDir(images, work string) string {
	if work != "" {
		return work
	}
	return images
}

// criuLogTail returns the last line of a CRIU log, to end an error message: where a
// hung CRIU stopped.
func criuLogTail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	return fmt.Sprintf(" (last line of %s: %q)", path, lines[len(lines)-1])
}

// watchCRIU kills the helper's CRIU children when ctx ends before the returned stop is
// called, and thaws the container's freezer cgroup CRIU may have left frozen, so the
// container runs on. stop reports whether it had to.
func watchCRIU(ctx context.Context, lc *libcontainer.Container, log *slog.Logger) (stop func() bool) {
	done := make(chan struct{})
	fired := make(chan bool, 1)
	go func() {
		select {
		case <-done:
			fired <- false
		case <-ctx.Done():
			for _, pid := range criuChildren() {
				log.Warn("killing CRIU past the checkpoint deadline", "pid", pid)
				_ = unix.Kill(pid, unix.SIGKILL)
			}
			if st, err := lc.State(); err == nil {
				if dir := st.CgroupPaths["freezer"]; dir != "" {
					_ = os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0)
				}
			}
			fired <- true
		}
	}()
	return func() bool {
		close(done)
		return <-fired
	}
}

// criuChildren lists the helper's child processes that run criu.
func criuChildren() []int {
	var pids []int
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, t := range tasks {
		data, err := os.ReadFile(filepath.Join("/proc/self/task", t.Name(), "children"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(data)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.TrimSpace(string(comm)) == "criu" {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}
