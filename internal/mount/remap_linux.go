package mount

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/spawn"
)

// The options containerd's overlay snapshotter adds to a snapshot's mounts when it
// was prepared for a user namespace (labels containerd.io/snapshot/uidmapping and
// gidmapping) on a kernel with idmapped mounts; they are not filesystem data.
const (
	uidmapOption = "uidmap="
	gidmapOption = "gidmap="
)

// remapOptions splits containerd's uidmap=/gidmap= options ("ctr:host:size[,...]")
// from options; ok is false unless both are there (containerd remaps only both).
func remapOptions(options []string) (rest []string, uidmap, gidmap string, ok bool) {
	rest = make([]string, 0, len(options))
	for _, o := range options {
		switch {
		case strings.HasPrefix(o, uidmapOption):
			uidmap = strings.TrimPrefix(o, uidmapOption)
		case strings.HasPrefix(o, gidmapOption):
			gidmap = strings.TrimPrefix(o, gidmapOption)
		default:
			rest = append(rest, o)
		}
	}
	return rest, uidmap, gidmap, uidmap != "" && gidmap != ""
}

// Remapped reports whether any of ms carries containerd's uidmap=/gidmap= options:
// All then idmaps it the way containerd's own mount code does.
func Remapped(ms []Mount) bool {
	for _, m := range ms {
		if _, _, _, ok := remapOptions(m.Options); ok {
			return true
		}
	}
	return false
}

// mountRemapped mounts m, which carries uidmap= and gidmap=, as containerd's
// core/mount does (mount_linux.go): a user namespace with those mappings is made for
// the purpose, an overlay gets its lower layers idmapped with it (read-only) while its
// upper dir is used as it is (the snapshotter chowned it to the mapped root, so what
// the container writes is stored with host ids), and any other mount is idmapped as a
// whole. The clones of the lower layers are attached below a staging dir while the
// overlay is mounted (see AllIDMapped).
func mountRemapped(m Mount, target string) error {
	opts, uidmap, gidmap, _ := remapOptions(m.Options)
	m.Options = opts
	userns, err := userNSFile(uidmap, gidmap)
	if err != nil {
		return fmt.Errorf("mount %s on %s: %w", m.Source, target, err)
	}
	defer userns.Close()
	fd := int(userns.Fd())
	switch {
	case m.Type == "overlay":
		return mountIDMappedOverlay(m, target, fd, nil)
	case isBind(m.Options):
		return mountIDMappedBind(m, target, fd)
	default:
		return fmt.Errorf("mount %s %s with uidmap/gidmap: only overlay and bind mounts can be idmapped", m.Type, m.Source)
	}
}

func parseIDMaps(s string) ([]syscall.SysProcIDMap, error) {
	var out []syscall.SysProcIDMap
	for _, part := range strings.Split(s, ",") {
		f := strings.Split(part, ":")
		if len(f) != 3 {
			return nil, fmt.Errorf("id mapping %q: want container-id:host-id:size", part)
		}
		var n [3]int
		for i, v := range f {
			x, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("id mapping %q: %w", part, err)
			}
			n[i] = int(x)
		}
		if n[2] == 0 {
			return nil, fmt.Errorf("id mapping %q: size 0", part)
		}
		out = append(out, syscall.SysProcIDMap{ContainerID: n[0], HostID: n[1], Size: n[2]})
	}
	return out, nil
}

// userNSFile returns a user namespace with the given mappings, made as containerd's
// getUsernsFD makes it: a re-execution of this binary in a new user namespace, stopped
// by ptrace before it runs anything, whose namespace file is opened before it is
// killed. The open file keeps the namespace alive.
func userNSFile(uidmap, gidmap string) (*os.File, error) {
	uids, err := parseIDMaps(uidmap)
	if err != nil {
		return nil, fmt.Errorf("uidmap: %w", err)
	}
	gids, err := parseIDMaps(gidmap)
	if err != nil {
		return nil, fmt.Errorf("gidmap: %w", err)
	}
	// From the spawn thread: the child's parent-death signal, and its tracer, is the
	// thread that forks it, and a thread of the caller's could end before the namespace
	// is opened below.
	var proc *os.Process
	err = spawn.Do(func() (err error) {
		// No UidMappings: Go writes them through a file it opens without O_CLOEXEC
		// while other forks may proceed, which then inherit it (a shim started at
		// that moment kept /proc/<pid>/uid_map open). The child needs no mapping to
		// reach its exec, where it stops; the maps are written below.
		proc, err = os.StartProcess("/proc/self/exe", []string{"crisp-userns"}, &os.ProcAttr{
			Sys: &syscall.SysProcAttr{
				Cloneflags: unix.CLONE_NEWUSER,
				// The child stops at its execve (PTRACE_TRACEME): nothing of the binary runs.
				Ptrace:    true,
				Pdeathsig: syscall.SIGKILL,
			},
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("start a process for a user namespace: %w", err)
	}
	// Until it is waited for, the child's pid cannot name another process.
	defer func() {
		_ = proc.Kill()
		_, _ = proc.Wait()
	}()
	if err := WriteIDMaps(proc.Pid, uids, gids); err != nil {
		return nil, err
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", proc.Pid))
	if err != nil {
		return nil, fmt.Errorf("open user namespace: %w", err)
	}
	return f, nil
}

// WriteIDMaps writes the uid and gid maps of process pid's user namespace, once, through
// files opened close-on-exec (os.OpenFile), unlike syscall.SysProcAttr's UidMappings.
// The caller needs CAP_SETUID and CAP_SETGID where the namespace was made.
func WriteIDMaps(pid int, uids, gids []syscall.SysProcIDMap) error {
	for _, m := range []struct {
		file string
		ids  []syscall.SysProcIDMap
	}{{"uid_map", uids}, {"gid_map", gids}} {
		if len(m.ids) == 0 {
			continue
		}
		var b strings.Builder
		for _, r := range m.ids {
			fmt.Fprintf(&b, "%d %d %d\n", r.ContainerID, r.HostID, r.Size)
		}
		path := fmt.Sprintf("/proc/%d/%s", pid, m.file)
		if err := os.WriteFile(path, []byte(b.String()), 0); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return nil
}
