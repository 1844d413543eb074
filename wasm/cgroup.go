package wasm

import (
	"fmt"
	"path"
	"strings"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"

	"github.com/crisp-runtime/crisp/internal/cgstats"
)

// containerCgroup is the cgroup a container's spec names (linux.cgroupsPath): a
// cgroupfs path, or runc's systemd triple slice:prefix:name.
type containerCgroup struct {
	Path   string `json:"path,omitempty"`
	Slice  string `json:"slice,omitempty"`
	Prefix string `json:"prefix,omitempty"`
	Name   string `json:"name,omitempty"`
}

func (c containerCgroup) systemd() bool { return c.Slice != "" }

func parseCgroupsPath(p string) (containerCgroup, error) {
	if parts := strings.Split(p, ":"); len(parts) == 3 {
		if parts[0] == "" || parts[2] == "" {
			return containerCgroup{}, fmt.Errorf("linux.cgroupsPath %q: want slice:prefix:name", p)
		}
		return containerCgroup{Slice: parts[0], Prefix: parts[1], Name: parts[2]}, nil
	}
	if !path.IsAbs(p) || path.Clean(p) != p {
		return containerCgroup{}, fmt.Errorf("linux.cgroupsPath %q: want an absolute, clean path (or slice:prefix:name)", p)
	}
	return containerCgroup{Path: p}, nil
}

// manager is the cgroup's manager. The container's memory limit is its module's
// (wazero's pages), not the cgroup's: the runtime around the module (the Go runtime,
// wazero's compiler) would count against a cgroup limit of the same size and be
// killed before the module reached it. The cgroup accounts (stats, OOM of the pod)
// and kills; the runtime's overhead belongs in the RuntimeClass's pod overhead.
func (c containerCgroup) manager() (cgroups.Manager, error) {
	// cgroup v1 controllers dereference Resources in Apply.
	cg := &cgroups.Cgroup{Resources: &cgroups.Resources{}}
	if c.systemd() {
		cg.Systemd, cg.Parent, cg.ScopePrefix, cg.Name = true, c.Slice, c.Prefix, c.Name
	} else {
		cg.Path = c.Path
	}
	return manager.New(cg)
}

// statsPath is the cgroup below the hierarchy roots, for the kit's stats reader.
func (c containerCgroup) statsPath() (string, error) {
	return cgstats.RelPath(c.systemd(), c.Path, c.Slice, c.Prefix, c.Name)
}
