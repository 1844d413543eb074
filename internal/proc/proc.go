package proc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Stat is the part of /proc/PID/stat the shim needs to identify a process.
type Stat struct {
	// State is the one-letter process state ('R', 'S', 'Z', ...).
	State byte
	// StartTime is the time the process started, in clock ticks since boot; together
	// with the pid it names one process for the lifetime of the machine.
	StartTime uint64
	// Flags are the kernel's per-process flags (PF_*, field 9).
	Flags uint64
	// UTime and STime are the CPU time the process has used in user and kernel mode,
	// in clock ticks (USER_HZ: 100 a second on every Linux ABI).
	UTime, STime uint64
}

// pfExiting is the kernel's PF_EXITING: the process is in exit and never runs user
// code again.
const pfExiting = 0x4

// Exiting reports whether the process has begun to exit (or is a zombie already).
func (s Stat) Exiting() bool {
	return s.Flags&pfExiting != 0 || s.State == 'Z' || s.State == 'X' || s.State == 'x'
}

// ErrNotExist reports that no process with the pid exists.
var ErrNotExist = errors.New("process does not exist")

// ReadStat reads /proc/PID/stat.
func ReadStat(pid int) (Stat, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		// ESRCH: the process exited between open and read.
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return Stat{}, fmt.Errorf("pid %d: %w", pid, ErrNotExist)
		}
		return Stat{}, fmt.Errorf("read stat of pid %d: %w", pid, err)
	}
	st, err := ParseStat(data)
	if err != nil {
		return Stat{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return st, nil
}

// ParseStat parses the content of a /proc/PID/stat file.
func ParseStat(data []byte) (Stat, error) {
	// comm (field 2) may contain spaces and parentheses, so fields are counted from
	// the last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 || i+2 >= len(data) {
		return Stat{}, errors.New("malformed stat: no comm field")
	}
	fields := strings.Fields(string(data[i+2:]))
	// fields[0] is field 3 (state); flags is field 9, utime 14, stime 15, starttime 22.
	const flagsIdx, uTimeIdx, sTimeIdx, startTimeIdx = 9 - 3, 14 - 3, 15 - 3, 22 - 3
	if len(fields) <= startTimeIdx || len(fields[0]) != 1 {
		return Stat{}, fmt.Errorf("malformed stat: %d fields after comm", len(fields))
	}
	st := Stat{State: fields[0][0]}
	for _, f := range []struct {
		name string
		idx  int
		dst  *uint64
	}{{"flags", flagsIdx, &st.Flags}, {"utime", uTimeIdx, &st.UTime}, {"stime", sTimeIdx, &st.STime}, {"starttime", startTimeIdx, &st.StartTime}} {
		v, err := strconv.ParseUint(fields[f.idx], 10, 64)
		if err != nil {
			return Stat{}, fmt.Errorf("malformed stat: %s %q: %w", f.name, fields[f.idx], err)
		}
		*f.dst = v
	}
	return st, nil
}

// Alive reports whether pid still names the process that had startTime and has not
// exited yet. A zombie counts as gone: it cannot run any more and its pid is about to
// be reused.
func Alive(pid int, startTime uint64) (bool, error) {
	if pid <= 0 {
		return false, nil
	}
	st, err := ReadStat(pid)
	if err != nil {
		if errors.Is(err, ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	if st.StartTime != startTime {
		return false, nil
	}
	return st.State != 'Z' && st.State != 'X' && st.State != 'x', nil
}

// OOMScoreAdj reads the oom_score_adj of pid; pid 0 means the calling process.
func OOMScoreAdj(pid int) (int, error) {
	p := "/proc/self/oom_score_adj"
	if pid > 0 {
		p = "/proc/" + strconv.Itoa(pid) + "/oom_score_adj"
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", p, err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", p, err)
	}
	return v, nil
}

// ClampOOMScoreAdj returns the score the shim can really give a child: a process without
// CAP_SYS_RESOURCE may not go below its own oom_score_adj, so lower requests are raised
// to floor. The second result tells whether the value was changed.
func ClampOOMScoreAdj(want, floor int) (int, bool) {
	if want < floor {
		return floor, true
	}
	return want, false
}
