// Package cgstats reads the metrics of one cgroup with github.com/containerd/cgroups/v3
// (cgroup1 on legacy and hybrid hosts, cgroup2 on unified ones) and packs them the way
// containerd's runc shim does, so that containerd's CRI can read crisp's shim and crisp's
// controller can read containerd's shims.
//
// It is a leaf package: crisp's shim packs with it, and the controller's tests read what
// it packs, without linking the shim. It must stay lean, since the shim links it: the
// cgroups module's readers and its generated stats types, nothing of containerd's api
// module and no gRPC.
package cgstats

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	cgroups "github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	cg1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
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
	// dir is the v2 cgroup's directory: cgroup2 reads the files of a removed cgroup as
	// zeros without an error, so Read checks that it is still there.
	dir string
}

// Path is the cgroup's path below the hierarchy roots, e.g. /crisp/crisp-<id>.
func (c *Cgroup) Path() string { return c.rel }

// RelPath returns the path below the cgroup hierarchy roots of a cgroup as libcontainer
// names it: the cgroupfs path itself, or for the systemd driver the expanded slice plus
// "<prefix>-<name>.scope" (or name itself when it is a slice), or the slice itself when
// name is empty (a pod's cgroup_parent).
func RelPath(systemdDriver bool, cgPath, slice, prefix, name string) (string, error) {
	if !systemdDriver {
		if cgPath == "" || !path.IsAbs(cgPath) {
			return "", fmt.Errorf("cgroup path %q is not absolute", cgPath)
		}
		return path.Clean(cgPath), nil
	}
	// No slice is libcontainer's default, system.slice (for a non-rootless manager).
	dir := "/system.slice"
	if slice != "" {
		var err error
		if dir, err = systemd.ExpandSlice(slice); err != nil {
			return "", fmt.Errorf("expand systemd slice %q: %w", slice, err)
		}
	}
	if name == "" {
		return dir, nil
	}
	// libcontainer's getUnitName: a scope "<prefix>-<name>.scope" unless name is a
	// slice, even when the prefix is empty ("-<name>.scope") or name already ends in
	// .scope; the unit is where the cgroup is, so it must be named the same way here.
	unit := name
	if !strings.HasSuffix(name, ".slice") {
		unit = prefix + "-" + name + ".scope"
	}
	return path.Join(dir, unit), nil
}

// UnifiedMountpoint is where a unified (cgroup v2 only) host mounts its hierarchy.
const UnifiedMountpoint = "/sys/fs/cgroup"

// Load opens the cgroup at rel (below the hierarchy roots) with the hierarchy this host
// runs: v2 when it is unified, else v1 (on a hybrid host the controllers that matter for
// stats live in v1). ErrGone when the cgroup is not there.
func Load(rel string) (*Cgroup, error) {
	if rel == "" || !path.IsAbs(rel) {
		return nil, fmt.Errorf("cgroup path %q is not absolute", rel)
	}
	if cgroups.Mode() == cgroups.Unified {
		return LoadV2(UnifiedMountpoint, rel)
	}
	cg, err := cgroup1.Load(cgroup1.StaticPath(rel))
	if errors.Is(err, cgroup1.ErrCgroupDeleted) {
		return nil, fmt.Errorf("cgroup %s: %w", rel, ErrGone)
	}
	if err != nil {
		return nil, fmt.Errorf("load cgroup %s: %w", rel, err)
	}
	return &Cgroup{rel: rel, v1: cg}, nil
}

// LoadV2 opens the cgroup v2 cgroup at rel below the unified hierarchy mounted at
// mountpoint. Load uses it on unified hosts; tests point it at a directory laid out
// like one. ErrGone when the cgroup is not there (cgroup2.Load itself does not look).
func LoadV2(mountpoint, rel string) (*Cgroup, error) {
	if rel == "" || !path.IsAbs(rel) {
		return nil, fmt.Errorf("cgroup path %q is not absolute", rel)
	}
	m, err := cgroup2.Load(rel, cgroup2.WithMountpoint(mountpoint))
	if err != nil {
		return nil, fmt.Errorf("load cgroup %s: %w", rel, err)
	}
	c := &Cgroup{rel: rel, v2: m, dir: filepath.Join(mountpoint, rel)}
	if err := c.exists(); err != nil {
		return nil, err
	}
	return c, nil
}

// exists reports ErrGone when the v2 cgroup is not there (every v2 cgroup directory
// has cgroup.procs; a plain directory where a cgroup was expected is no cgroup either).
func (c *Cgroup) exists() error {
	if _, err := os.Stat(filepath.Join(c.dir, "cgroup.procs")); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("cgroup %s: %w", c.rel, ErrGone)
		}
		return fmt.Errorf("cgroup %s: %w", c.rel, err)
	}
	return nil
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
		// A cgroup removed before or during the read has read as (partly) zero: that
		// is no figure to report.
		if err := c.exists(); err != nil {
			return nil, err
		}
		m = st
	} else {
		// IgnoreNotExist: a controller file the kernel does not have (swap accounting
		// off, no rdma) leaves its field empty instead of failing the whole read.
		st, err := c.v1.Stat(cgroup1.IgnoreNotExist)
		if err != nil {
			return nil, fmt.Errorf("read cgroup %s: %w", c.rel, gone(err))
		}
		if err := c.v1BlkioRecursive(st); err != nil {
			return nil, fmt.Errorf("read cgroup %s: %w", c.rel, gone(err))
		}
		m = st
	}
	return Pack(m)
}

// v1BlkioRecursive replaces the blkio figures the cgroups library read from the
// throttle files of the cgroup itself (its fallback when the kernel keeps no CFQ
// statistics, which is every kernel since CFQ was removed in 5.0) with their
// _recursive variants, which count the cgroup's descendants too: a pod's cgroup
// holds no task itself, so without them its IO would read as zero. The CFQ
// figures, where a kernel has them, are recursive already and are kept.
func (c *Cgroup) v1BlkioRecursive(st *cg1stats.Metrics) error {
	var dir string
	for _, s := range c.v1.Subsystems() {
		if p, ok := s.(interface{ Path(string) string }); ok && s.Name() == cgroup1.Blkio {
			dir = p.Path(c.rel)
		}
	}
	if dir == "" || st.GetBlkio() == nil {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, "blkio.io_serviced_recursive")); err == nil {
		return nil
	}
	bytes, err := readBlkio(filepath.Join(dir, "blkio.throttle.io_service_bytes_recursive"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // a kernel before 4.13
	}
	if err != nil {
		return err
	}
	ops, err := readBlkio(filepath.Join(dir, "blkio.throttle.io_serviced_recursive"))
	if err != nil {
		return err
	}
	// Device names are the reader's to find (cgroup v2 names none either).
	st.Blkio.IoServiceBytesRecursive, st.Blkio.IoServicedRecursive = bytes, ops
	return nil
}

// readBlkio parses a blkio statistics file: "MAJ:MIN Op value" lines and a "Total
// value" line, which is left out.
func readBlkio(path string) ([]*cg1stats.BlkIOEntry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []*cg1stats.BlkIOEntry
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue // "Total n", the empty last line
		}
		maj, minor, ok := strings.Cut(f[0], ":")
		if !ok {
			return nil, fmt.Errorf("%s: bad line %q", path, line)
		}
		var e cg1stats.BlkIOEntry
		var err1, err2, err3 error
		e.Major, err1 = strconv.ParseUint(maj, 10, 64)
		e.Minor, err2 = strconv.ParseUint(minor, 10, 64)
		e.Value, err3 = strconv.ParseUint(f[2], 10, 64)
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("%s: bad line %q: %w", path, line, err)
		}
		e.Op = f[1]
		out = append(out, &e)
	}
	return out, nil
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
