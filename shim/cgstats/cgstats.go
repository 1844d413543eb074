// Package cgstats reads the metrics of one cgroup with github.com/containerd/cgroups/v3
// (cgroup1 on legacy and hybrid hosts, cgroup2 on unified ones) and packs them the way
// containerd's runc shim does, so that containerd's CRI can read crisp's shim and crisp's
// controller can read containerd's shims.
//
// It lives in the shim and must stay lean: it links the cgroups module's readers and its
// generated stats types, nothing of containerd's api module and no gRPC.
package cgstats

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"

	cgroups "github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/opencontainers/cgroups/systemd"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// ErrGone means the cgroup does not exist (any more).
var ErrGone = errors.New("cgroup does not exist")

// Cgroup is one loaded cgroup. Loading reads /proc/self/mountinfo and probes every v1
// hierarchy, so callers keep a Cgroup for as long as the cgroup lives and only Read it
// again. It is safe for concurrent use (the cgroups library locks its own state).
type Cgroup struct {
	rel string
	v1  cgroup1.Cgroup
	v2  *cgroup2.Manager
}

// Path is the cgroup's path below the hierarchy roots, e.g. /crisp/crisp-<id>.
func (c *Cgroup) Path() string { return c.rel }

// RelPath returns the path below the cgroup hierarchy roots of a cgroup as libcontainer
// names it: the cgroupfs path itself, or for the systemd driver the expanded slice plus
// "<prefix>-<name>.scope" (or name itself when it is a slice, as for a pod's parent).
func RelPath(systemdDriver bool, cgPath, slice, prefix, name string) (string, error) {
	if !systemdDriver {
		if cgPath == "" || !path.IsAbs(cgPath) {
			return "", fmt.Errorf("cgroup path %q is not absolute", cgPath)
		}
		return path.Clean(cgPath), nil
	}
	dir := "/"
	if slice != "" && slice != "-.slice" {
		var err error
		if dir, err = systemd.ExpandSlice(slice); err != nil {
			return "", fmt.Errorf("expand systemd slice %q: %w", slice, err)
		}
	}
	if name == "" {
		return dir, nil
	}
	unit := name
	if !strings.HasSuffix(name, ".slice") && !strings.HasSuffix(name, ".scope") {
		if prefix != "" {
			unit = prefix + "-" + name
		}
		unit += ".scope"
	}
	return path.Join(dir, unit), nil
}

// Load opens the cgroup at rel (below the hierarchy roots) with the hierarchy this host
// runs: v2 when it is unified, else v1 (on a hybrid host the controllers that matter for
// stats live in v1). ErrGone when the cgroup is not there.
func Load(rel string) (*Cgroup, error) {
	if rel == "" || !path.IsAbs(rel) {
		return nil, fmt.Errorf("cgroup path %q is not absolute", rel)
	}
	c := &Cgroup{rel: rel}
	if cgroups.Mode() == cgroups.Unified {
		m, err := cgroup2.Load(rel)
		if err != nil {
			return nil, fmt.Errorf("load cgroup %s: %w", rel, err)
		}
		c.v2 = m
		return c, nil
	}
	cg, err := cgroup1.Load(cgroup1.StaticPath(rel))
	if errors.Is(err, cgroup1.ErrCgroupDeleted) {
		return nil, fmt.Errorf("cgroup %s: %w", rel, ErrGone)
	}
	if err != nil {
		return nil, fmt.Errorf("load cgroup %s: %w", rel, err)
	}
	c.v1 = cg
	return c, nil
}

// v2Mask is what a CRI runtime reports: rdma and hugetlb are left out, they cost a
// read per page size and nobody asks for them.
const v2Mask = cgroup2.StatPids | cgroup2.StatCPU | cgroup2.StatMemory | cgroup2.StatMemoryEvents | cgroup2.StatIO

// Read reads the cgroup's metrics now and returns them as an Any whose type URL is the
// message's full proto name (io.containerd.cgroups.v1.Metrics or
// io.containerd.cgroups.v2.Metrics), as containerd's typeurl names proto messages.
func (c *Cgroup) Read() (*anypb.Any, error) {
	var m proto.Message
	if c.v2 != nil {
		st, err := c.v2.StatFiltered(v2Mask)
		if err != nil {
			return nil, fmt.Errorf("read cgroup %s: %w", c.rel, gone(err))
		}
		m = st
	} else {
		// IgnoreNotExist: a controller file the kernel does not have (swap accounting
		// off, no rdma) leaves its field empty instead of failing the whole read.
		st, err := c.v1.Stat(cgroup1.IgnoreNotExist)
		if err != nil {
			return nil, fmt.Errorf("read cgroup %s: %w", c.rel, gone(err))
		}
		m = st
	}
	return Pack(m)
}

// gone marks the errors of a cgroup removed under the reader (the container was deleted
// meanwhile) as ErrGone, so callers can answer NotFound rather than Internal.
func gone(err error) error {
	if errors.Is(err, cgroup1.ErrCgroupDeleted) || errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %w", ErrGone, err)
	}
	return err
}

// Pack marshals m into an Any typed by its full proto name, without the
// type.googleapis.com/ prefix anypb.New would add: containerd's typeurl registry looks
// proto messages up by that bare name.
func Pack(m proto.Message) (*anypb.Any, error) {
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("marshal %s: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	return &anypb.Any{TypeUrl: string(m.ProtoReflect().Descriptor().FullName()), Value: b}, nil
}
