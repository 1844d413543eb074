package sandbox

import (
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"time"

	"github.com/opencontainers/cgroups"
	// Registers the device-rule backend that the v1 devices controller needs.
	_ "github.com/opencontainers/cgroups/devices"
	"github.com/opencontainers/cgroups/manager"
	"golang.org/x/sys/unix"
)

// Cgroup drivers.
const (
	DriverCgroupfs = "cgroupfs"
	DriverSystemd  = "systemd"
)

// CgroupConfig names the pod cgroup; it is persisted in sandbox.json so that a later
// `delete` can find and remove the cgroup of a dead shim.
type CgroupConfig struct {
	Driver string `json:"driver"`
	// Path is the cgroupfs path, e.g. /crisp/crisp-<id>.
	Path string `json:"path,omitempty"`
	// Slice and Name make up the systemd scope <ScopePrefix>-<Name>.scope in Slice.
	Slice string `json:"slice,omitempty"`
	Name  string `json:"name,omitempty"`
}

func cgroupConfig(id, parent string, systemd bool) (CgroupConfig, error) {
	if systemd {
		if parent == "" {
			parent = defaultSystemdSlice
		}
		if !sliceRE.MatchString(parent) {
			return CgroupConfig{}, invalid("cgroup_parent %q: the systemd driver wants a slice name like system.slice", parent)
		}
		return CgroupConfig{Driver: DriverSystemd, Slice: parent, Name: id}, nil
	}
	if parent == "" {
		parent = defaultCgroupParent
	}
	if !strings.HasPrefix(parent, "/") || path.Clean(parent) != parent || strings.Contains(parent, "..") {
		return CgroupConfig{}, invalid("cgroup_parent %q: the cgroupfs driver wants an absolute, clean path", parent)
	}
	return CgroupConfig{Driver: DriverCgroupfs, Path: path.Join(parent, cgroupPrefix+"-"+id)}, nil
}

// String is the cgroup as reported in SandboxStatus info: the cgroupfs path, or the
// slice:prefix:name triple runc uses for systemd.
func (c CgroupConfig) String() string {
	if c.Driver == DriverSystemd {
		return c.Slice + ":" + cgroupPrefix + ":" + c.Name
	}
	return c.Path
}

func (c CgroupConfig) manager() (cgroups.Manager, error) {
	cg := &cgroups.Cgroup{
		// cgroup v1 controllers dereference Resources in Apply.
		Resources: &cgroups.Resources{},
	}
	switch c.Driver {
	case DriverCgroupfs:
		cg.Path = c.Path
	case DriverSystemd:
		cg.Systemd, cg.Parent, cg.ScopePrefix, cg.Name = true, c.Slice, cgroupPrefix, c.Name
	default:
		return nil, fmt.Errorf("unknown cgroup driver %q", c.Driver)
	}
	m, err := manager.New(cg)
	if err != nil {
		return nil, fmt.Errorf("cgroup manager for %s: %w", c, err)
	}
	return m, nil
}

// destroyCgroup kills whatever is left in the pod cgroup and removes it. The cgroup is
// frozen while its pids are read and signalled so none can exit and have its pid reused
// in between. Only the leaf is removed: the parent belongs to whoever made it.
func destroyCgroup(m cgroups.Manager, log *slog.Logger) error {
	var err error
	for attempt := range 10 {
		if attempt > 0 {
			time.Sleep(time.Duration(attempt) * 20 * time.Millisecond)
		}
		killAll(m, log)
		if err = m.Destroy(); err == nil {
			return nil
		}
	}
	return fmt.Errorf("remove pod cgroup: %w", err)
}

func killAll(m cgroups.Manager, log *slog.Logger) {
	if !m.Exists() {
		return
	}
	frozen := m.Freeze(cgroups.Frozen) == nil
	pids, err := m.GetAllPids()
	if err != nil && !errors.Is(err, unix.ENOENT) {
		log.Warn("list pod cgroup processes", "error", err)
	}
	for _, pid := range pids {
		if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			log.Warn("kill leftover process in pod cgroup", "pid", pid, "error", err)
		}
	}
	if frozen {
		if err := m.Freeze(cgroups.Thawed); err != nil {
			log.Warn("thaw pod cgroup", "error", err)
		}
	}
}
