package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/crisp-runtime/crisp/internal/proc"
)

// Mem is one process's memory in KiB, from /proc/PID/smaps_rollup.
type Mem struct {
	RSS, PSS, USS float64
}

// Add sums m and o.
func (m Mem) Add(o Mem) Mem { return Mem{m.RSS + o.RSS, m.PSS + o.PSS, m.USS + o.USS} }

// Div divides every figure by n.
func (m Mem) Div(n float64) Mem { return Mem{m.RSS / n, m.PSS / n, m.USS / n} }

// ReadMem reads a process's RSS, PSS and USS (private clean + private dirty pages).
func ReadMem(pid int) (Mem, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return Mem{}, err
	}
	return parseSmapsRollup(b)
}

func parseSmapsRollup(b []byte) (Mem, error) {
	var m Mem
	found := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "Rss:":
			m.RSS = v
			found++
		case "Pss:":
			m.PSS = v
			found++
		case "Private_Clean:", "Private_Dirty:":
			m.USS += v
			found++
		}
	}
	if found != 4 {
		return Mem{}, fmt.Errorf("smaps_rollup lacks Rss, Pss or Private_* lines")
	}
	return m, nil
}

// PPid is a process's parent pid.
func PPid(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parsePPid(b)
}

func parsePPid(stat []byte) (int, error) {
	f, err := statFields(stat, 2)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(f[1])
}

// statFields returns the fields of a /proc/PID/stat after the command name, which may
// hold spaces and parentheses (so they start after the last ')'): f[0] is the state.
// Fewer than want fields is an error.
func statFields(stat []byte, want int) ([]string, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return nil, fmt.Errorf("malformed stat %q", stat)
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < want {
		return nil, fmt.Errorf("malformed stat %q", stat)
	}
	return f, nil
}

// Comm is a process's command name.
func Comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// sandboxPid reads "pid" from the verbose info JSON of PodSandboxStatus; containerd
// and crisp both put the sandbox process there.
func sandboxPid(info string) (int, error) {
	var v struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(info), &v); err != nil {
		return 0, fmt.Errorf("verbose info: %w", err)
	}
	if v.Pid <= 0 {
		return 0, errNoPid
	}
	return v.Pid, nil
}

// RssAnon is a process's anonymous resident memory in KiB (heap, stacks), from
// /proc/PID/status; the rest of its RSS is file pages (binary and libraries).
func RssAnon(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "RssAnon:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				return strconv.ParseFloat(f[0], 64)
			}
		}
	}
	return 0, fmt.Errorf("no RssAnon in /proc/%d/status", pid)
}

// userHZ is the unit of the times in /proc/PID/stat: USER_HZ, 100 on every Linux
// architecture's ABI whatever the kernel's own HZ.
const userHZ = 100

// CPUTime is the CPU time a process (all its threads) used so far, user plus system.
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseCPUTime(b)
}

func parseCPUTime(stat []byte) (time.Duration, error) {
	st, err := proc.ParseStat(stat)
	if err != nil {
		return 0, err
	}
	return time.Duration(st.UTime+st.STime) * time.Second / userHZ, nil
}
