package snapshot

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/store"
	"github.com/crisp-runtime/crisp/internal/testutil"
)

// requireOverlay skips tests that need root and overlayfs.
func requireOverlay(t testing.TB) {
	t.Helper()
	testutil.RequiresRoot(t, "layers carry device nodes, foreign owners and trusted.overlay xattrs, and the test mounts overlays")
	data, err := os.ReadFile("/proc/filesystems")
	if err != nil || !strings.Contains(string(data), "\toverlay\n") {
		t.Skip("needs overlayfs in the kernel")
	}
}

// fixture is a snapshotter on a fresh root with its store.
type fixture struct {
	dir  string // holds root and the database; nothing else may appear in it
	root string
	st   *store.Store
	s    *Snapshotter
}

// newFixture opens a snapshotter under base, or under a new temp dir if base is "".
func newFixture(t testing.TB, base string) *fixture {
	t.Helper()
	requireOverlay(t)
	if base == "" {
		base = t.TempDir()
	}
	st, err := store.Open(filepath.Join(base, "meta.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	root := filepath.Join(base, "s")
	s, err := Open(root, st)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{dir: base, root: root, st: st, s: s}
}

// entry is one tar entry of a test layer.
type entry struct {
	hdr  tar.Header
	body string
}

func dirE(name string, mode int64) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode}}
}

func fileE(name, body string, mode int64) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode}, body: body}
}

func symlinkE(name, target string) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}

func hardlinkE(name, target string) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, Mode: 0o644}}
}

func charE(name string, major, minor, mode int64) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeChar, Name: name, Devmajor: major, Devminor: minor, Mode: mode}}
}

func fifoE(name string, mode int64) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: name, Mode: mode}}
}

// owned sets the owner of e.
func owned(e entry, uid, gid int) entry {
	e.hdr.Uid, e.hdr.Gid = uid, gid
	return e
}

// withMode sets the permissions of e.
func withMode(e entry, mode int64) entry {
	e.hdr.Mode = mode
	return e
}

// xattr adds an extended attribute to e, the way tar tools write them.
func xattr(e entry, key, value string) entry {
	if e.hdr.PAXRecords == nil {
		e.hdr.PAXRecords = map[string]string{}
	}
	e.hdr.PAXRecords["SCHILY.xattr."+key] = value
	return e
}

// layerTar builds an uncompressed layer from entries.
func layerTar(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		h.Size = int64(len(e.body))
		h.ModTime = time.Unix(1700000000, 0)
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("tar header %s: %v", h.Name, err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatalf("tar body %s: %v", h.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// chainID computes the OCI chain ID of a layer with content data on top of parent.
func chainID(parent digest.Digest, data []byte) digest.Digest {
	diffID := digest.FromBytes(data)
	if parent == "" {
		return diffID
	}
	return digest.FromString(parent.String() + " " + diffID.String())
}

// describe is a one-line description of path: type, permissions, owner, content or
// target, device numbers and extended attributes (overlay's own are hidden from the
// mounted view; in a layer dir, trusted.overlay.opaque is shown).
func describe(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return "", err
	}
	perm := fmt.Sprintf("%04o %d:%d", st.Mode&0o7777, st.Uid, st.Gid)
	var d string
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		d = "dir " + perm
	case unix.S_IFREG:
		data, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		d = fmt.Sprintf("file %s %q", perm, data)
	case unix.S_IFLNK:
		target, err := os.Readlink(path)
		if err != nil {
			return "", err
		}
		return "symlink -> " + target, nil
	case unix.S_IFCHR:
		d = fmt.Sprintf("char %s %d:%d", perm, unix.Major(st.Rdev), unix.Minor(st.Rdev))
	case unix.S_IFBLK:
		d = fmt.Sprintf("block %s %d:%d", perm, unix.Major(st.Rdev), unix.Minor(st.Rdev))
	case unix.S_IFIFO:
		d = "fifo " + perm
	default:
		d = fmt.Sprintf("mode %o", st.Mode)
	}
	xs, err := xattrs(path)
	if err != nil {
		return "", err
	}
	for _, x := range xs {
		d += " " + x
	}
	return d, nil
}

// xattrs lists path's extended attributes as sorted key=value strings.
func xattrs(path string) ([]string, error) {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(path, buf)
	if errors.Is(err, unix.ENOTSUP) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listxattr %s: %w", path, err)
	}
	var out []string
	for _, k := range strings.Split(string(buf[:n]), "\x00") {
		// overlay's bookkeeping on copy-up (origin, impure…) is not content.
		if k == "" || k == "security.selinux" || strings.HasPrefix(k, "trusted.overlay.") && k != "trusted.overlay.opaque" {
			continue
		}
		v := make([]byte, 64<<10)
		m, err := unix.Lgetxattr(path, k, v)
		if err != nil {
			return nil, fmt.Errorf("getxattr %s %s: %w", path, k, err)
		}
		out = append(out, k+"="+string(v[:m]))
	}
	sort.Strings(out)
	return out, nil
}

// tree describes every entry under dir (dir itself excluded), by relative path.
func tree(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == dir {
			return nil
		}
		d, err := describe(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		out[rel] = d
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	return out
}

// diffTrees lists the differences between two trees, one per line; "" when equal.
func diffTrees(want, got map[string]string) string {
	var lines []string
	for p, w := range want {
		g, ok := got[p]
		switch {
		case !ok:
			lines = append(lines, fmt.Sprintf("missing %s: want %s", p, w))
		case g != w:
			lines = append(lines, fmt.Sprintf("differs %s:\n\twant %s\n\tgot  %s", p, w, g))
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			lines = append(lines, fmt.Sprintf("unexpected %s: %s", p, g))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// mountAll mounts ms on a new directory and unmounts it when the test ends.
func mountAll(t testing.TB, ms []Mount) string {
	t.Helper()
	if len(ms) != 1 {
		t.Fatalf("want one mount, got %+v", ms)
	}
	m := ms[0]
	target := t.TempDir()
	var flags uintptr
	var data []string
	for _, o := range m.Options {
		switch o {
		case "rbind":
			flags |= unix.MS_BIND | unix.MS_REC
		case "rw":
		case "ro":
			flags |= unix.MS_RDONLY
		default:
			data = append(data, o)
		}
	}
	if err := unix.Mount(m.Source, target, m.Type, flags, strings.Join(data, ",")); err != nil {
		t.Fatalf("mount %+v on %s: %v", m, target, err)
	}
	t.Cleanup(func() { unmount(t, target) })
	return target
}

// unmount unmounts target; not being mounted any more is fine.
func unmount(t testing.TB, target string) {
	t.Helper()
	if err := unix.Unmount(target, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		t.Errorf("unmount %s: %v", target, err)
	}
}

// option returns the value of key=value in ms's options.
func option(ms []Mount, key string) string {
	for _, m := range ms {
		for _, o := range m.Options {
			if v, ok := strings.CutPrefix(o, key+"="); ok {
				return v
			}
		}
	}
	return ""
}

// fileID identifies a file's inode and its state, to prove it was not touched.
type fileID struct {
	Ino, Nlink, Size int64
	Mtime, Ctime     int64
	Sum              digest.Digest
}

func identify(t testing.TB, path string) fileID {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return fileID{
		Ino: int64(st.Ino), Nlink: int64(st.Nlink), Size: st.Size,
		Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano(), Sum: digest.FromBytes(data),
	}
}

// names lists the names in dir, sorted.
func names(t testing.TB, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}
