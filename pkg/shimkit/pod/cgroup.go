package pod

import (
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"time"

	"github.com/opencontainers/cgroups"

	"github.com/crisp-runtime/crisp/internal/cgstats"

	// Registers the device-rule backend that the v1 devices controller needs.
	_ "github.com/opencontainers/cgroups/devices"
	"github.com/opencontainers/cgroups/manager"
	cgsystemd "github.com/opencontainers/cgroups/systemd"
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
	// Parent is the cgroup_parent the pod was given ("" when it got the default). Kubelet
	// gives every pod a cgroup of its own there, holding the pause cgroup and every
	// container's, so it is what SandboxMetrics reports.
	Parent string `json:"parent,omitempty"`
}

func cgroupConfig(id, parent string, systemd bool) (CgroupConfig, error) {
	given := parent
	if systemd {
		if parent == "" {
			parent = defaultSystemdSlice
		}
		if !validSliceName(parent) {
			return CgroupConfig{}, invalid("cgroup_parent %q: the systemd driver wants a slice name like system.slice", parent)
		}
		// The characters are right but systemd may still refuse the name
		// (kubepods--x.slice, -x.slice, x-.slice): refuse it here, as InvalidArgument,
		// rather than as an internal error when the scope is made.
		if _, err := cgsystemd.ExpandSlice(parent); err != nil {
			return CgroupConfig{}, invalid("cgroup_parent %q: the systemd driver wants a slice name like kubepods-burstable.slice: %v", parent, err)
		}
		return CgroupConfig{Driver: DriverSystemd, Slice: parent, Name: id, Parent: given}, nil
	}
	if parent == "" {
		parent = defaultCgroupParent
	}
	if !strings.HasPrefix(parent, "/") || path.Clean(parent) != parent || strings.Contains(parent, "..") {
		return CgroupConfig{}, invalid("cgroup_parent %q: the cgroupfs driver wants an absolute, clean path", parent)
	}
	return CgroupConfig{Driver: DriverCgroupfs, Path: path.Join(parent, cgroupPrefix+"-"+id), Parent: given}, nil
}

// String is the cgroup as reported in SandboxStatus info: the cgroupfs path, or the
// slice:prefix:name triple runc uses for systemd.
func (c CgroupConfig) String() string {
	if c.Driver == DriverSystemd {
		return c.Slice + ":" + cgroupPrefix + ":" + c.Name
	}
	return c.Path
}

// metricsPath is the cgroup SandboxMetrics reports, below the hierarchy roots: the
// pod's own cgroup_parent when it was given one (kubelet's pod cgroup: pause and
// containers), else the pause process's cgroup alone (the default parent is shared by
// every pod, so it says nothing about this one).
func (c CgroupConfig) metricsPath() (string, error) {
	systemd := c.Driver == DriverSystemd
	if c.Parent != "" {
		return cgstats.RelPath(systemd, c.Parent, c.Parent, "", "")
	}
	return cgstats.RelPath(systemd, c.Path, c.Slice, cgroupPrefix, c.Name)
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
