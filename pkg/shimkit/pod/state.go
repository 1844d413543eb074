package pod

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/crisp-runtime/crisp/internal/atomicfile"
)

// StateFile is the name of the sandbox record in the bundle.
const StateFile = "sandbox.json"

// State is what sandbox.json records: enough to find and clean up the pod after the
// shim is gone (pause pid + start time, cgroup), and to answer for it after a restart.
type State struct {
	SandboxID string `json:"sandbox_id"`
	// BundlePath is the bundle named in CreateSandbox (the file itself lives in the
	// shim's -bundle directory).
	BundlePath string       `json:"bundle_path,omitempty"`
	NetNSPath  string       `json:"netns_path,omitempty"`
	Cgroup     CgroupConfig `json:"cgroup"`
	CreatedAt  time.Time    `json:"created_at"`
	PausePid   int          `json:"pause_pid,omitempty"`
	// PauseStartTime is field 22 of /proc/PID/stat (clock ticks since boot): together
	// with PausePid it tells the pause process from a later process with the same pid.
	PauseStartTime uint64     `json:"pause_start_time,omitempty"`
	StartedAt      *time.Time `json:"started_at,omitempty"`
	ExitStatus     *uint32    `json:"exit_status,omitempty"`
	ExitedAt       *time.Time `json:"exited_at,omitempty"`
}

// ReadState reads sandbox.json from dir.
func ReadState(dir string) (*State, error) {
	data, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("parse %s: %w", filepath.Join(dir, StateFile), err)
	}
	return &st, nil
}

// writeState replaces sandbox.json atomically, so a crash never leaves half a record.
func writeState(dir string, st *State) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode sandbox state: %w", err)
	}
	return atomicfile.Write(filepath.Join(dir, StateFile), data, 0o600)
}
