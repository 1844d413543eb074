package snapshot

import (
	"archive/tar"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/moby/sys/userns"
	"golang.org/x/sys/unix"
)

// OCI whiteout names (image-spec layer.md), as archive.Apply reads them.
const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// guard is the tar filter of one unpack. archive.Apply already keeps every path inside
// the directory it unpacks to, but it resolves symlinks within this one layer only, so
// a layer could still create files where the mounted image shows something else (a
// path through a lower layer's symlink), and a stricter check costs nothing for layers
// built by real tools. Refusing fails the whole unpack.
//
// A layer is unpacked without its lower layers (they may not be unpacked yet), so what
// needs them is recorded here and done by Commit: the check of parent directories the
// layer does not have (lowerChecks), and the attributes of the directories archive.Apply
// creates for an entry whose parent has no entry of its own (dirNode.made), which
// containerd copies from the lower layers when it creates them.
type guard struct {
	layer string // the directory being unpacked into

	// dirs are the layer's directories as unpacked so far. The filter sees every entry
	// before archive.Apply acts on it and updates dirs the way archive.Apply changes the
	// directory, so that checking an entry's parents costs no system call (a deep layer
	// has one entry per file and one parent per level).
	dirs dirNode

	// lowerChecks are the parent chains that the lower layers decide, in tar order.
	lowerChecks []lowerCheck

	// skipDevices: archive.Apply skips device nodes in a user namespace (it cannot make
	// them); so does the filter, so that dirs stays true.
	skipDevices bool
}

// dirNode is a directory of the layer being unpacked.
type dirNode struct {
	children map[string]*dirNode
	// opaque: the directory hides the lower layers' (an opaque marker of this layer).
	opaque bool
	made   madeBy
}

// madeBy tells where a directory's attributes come from.
type madeBy uint8

const (
	// byEntry: an entry of the layer, or the layer's root.
	byEntry madeBy = iota
	// byParent: archive.Apply created it as the parent of an entry; containerd gives it
	// the attributes of the topmost lower layer's directory there (Commit does).
	byParent
	// byParentThenEntry: created as a parent, then a directory entry of its own came:
	// the entry's owner, mode and times, and the lower directory's extended attributes
	// as well as the entry's (containerd copies them at creation; the entry's add).
	byParentThenEntry
)

// lowerCheck is a parent chain of an entry that the lower layers decide: the layer has
// dir up to (not including) the component at offset from, no opaque directory of the
// layer on the way hides the lowers, and the rest is created by this entry.
type lowerCheck struct {
	entry string // the entry's name in the tar, for the error
	dir   string // the entry's parent directory, clean and relative
	from  int    // offset in dir of the first component the layer does not have
}

func newGuard(layer string) *guard {
	return &guard{layer: layer, skipDevices: userns.RunningInUserNS()}
}

// filter is the archive.WithFilter callback. archive.Apply calls it with the name
// already passed through filepath.Clean, so an inner ".." is resolved lexically by then
// and only a leading one can remain; it runs after every earlier entry is on disk, and
// archive.Apply acts on every entry it accepts (or fails the unpack).
func (g *guard) filter(hdr *tar.Header) (bool, error) {
	name := strings.TrimPrefix(hdr.Name, "./")
	if name == "." || name == "" {
		return true, nil // the layer root; archive.Apply skips it
	}
	if err := checkName(name); err != nil {
		return false, refuse(hdr.Name, err.Error())
	}
	if err := checkWhiteout(name); err != nil {
		return false, refuse(hdr.Name, err.Error())
	}
	if hdr.Typeflag == tar.TypeLink {
		target := strings.TrimPrefix(hdr.Linkname, "./")
		if err := checkName(target); err != nil {
			return false, refuse(hdr.Name, fmt.Sprintf("hard link target %q: %s", hdr.Linkname, err))
		}
		target = filepath.Clean(target)
		// A target whose parent the layer lacks is not in the layer: whatever the
		// lowers hold there, checkLinkTarget refuses it.
		if _, _, _, err := g.parents(target); err != nil {
			return false, refuse(hdr.Name, fmt.Sprintf("hard link target %q: %s", hdr.Linkname, err))
		}
		if err := g.checkLinkTarget(name, target); err != nil {
			return false, refuse(hdr.Name, fmt.Sprintf("hard link target %q: %s", hdr.Linkname, err))
		}
	}
	dir, n, missing, err := g.parents(name)
	if err != nil {
		return false, refuse(hdr.Name, err.Error())
	}
	if g.skipDevices && (hdr.Typeflag == tar.TypeBlock || hdr.Typeflag == tar.TypeChar) {
		return false, nil
	}
	if missing >= 0 {
		if !n.hidesLowers {
			g.lowerChecks = append(g.lowerChecks, lowerCheck{entry: hdr.Name, dir: dir, from: missing})
		}
		n.node = n.node.makeParents(dir[missing:])
	}
	g.record(hdr.Typeflag, name, dir, n.node)
	return true, nil
}

// parentsResult is the directory node parents reached.
type parentsResult struct {
	node *dirNode
	// hidesLowers: an opaque directory of the layer on the way hides the lower layers.
	hidesLowers bool
}

// parents walks the parent directories of name (clean and relative) in the layer. It
// returns name's directory ("." for the root), the deepest one the layer has, and the
// offset in dir of the first component the layer does not have (-1 when it has them
// all). It refuses a parent that is a symlink or not a directory in the layer.
func (g *guard) parents(name string) (dir string, _ parentsResult, missing int, _ error) {
	dir = filepath.Dir(name)
	res := parentsResult{node: &g.dirs}
	if dir == "." {
		return dir, res, -1, nil
	}
	for i := 0; i < len(dir); {
		end := strings.IndexByte(dir[i:], '/')
		if end < 0 {
			end = len(dir)
		} else {
			end += i
		}
		child := res.node.children[dir[i:end]]
		if child == nil {
			var err error
			if child, err = g.stat(dir[:end]); err != nil {
				return "", parentsResult{}, 0, err
			}
			if child == nil {
				return dir, res, i, nil
			}
			res.node.add(dir[i:end], child)
		}
		res.hidesLowers = res.hidesLowers || child.opaque
		res.node = child
		i = end + 1
	}
	return dir, res, -1, nil
}

// stat looks at the layer's prefix (clean and relative, every shorter prefix a directory
// of the layer, so this follows no symlink) when dirs does not know it: normally it
// does not exist, or is a file or whiteout or symlink of the layer. It returns nil when
// prefix does not exist.
func (g *guard) stat(prefix string) (*dirNode, error) {
	p := filepath.Join(g.layer, prefix)
	fi, err := os.Lstat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("check parent %q: %w", prefix, err)
	case fi.Mode()&fs.ModeSymlink != 0:
		return nil, fmt.Errorf("parent %q is a symlink in this layer", prefix)
	case !fi.IsDir():
		// A file or a whiteout of this layer, earlier in the tar: archive.Apply would
		// fail with a bare ENOTDIR.
		return nil, fmt.Errorf("parent %q is not a directory in this layer (a file or a whiteout earlier in the tar)", prefix)
	}
	// Only a directory the filter did not see made (none: it sees them all) lands here;
	// the disk is the truth.
	return &dirNode{opaque: isOpaque(p)}, nil
}

// record updates dirs with what archive.Apply does with the accepted entry name of type
// typ in dir (node), the parents it needed made already.
func (g *guard) record(typ byte, name, dir string, node *dirNode) {
	base := name
	if dir != "." {
		base = name[len(dir)+1:]
	}
	switch {
	case base == whiteoutOpaque:
		// OverlayConvertWhiteout marks the directory opaque, whatever the entry's type;
		// the root's marker hides nothing the filter checks.
		if dir != "." {
			node.opaque = true
		}
	case strings.HasPrefix(base, whiteoutPrefix):
		// A whiteout is a new character device; archive.Apply fails if the name exists.
	case typ == tar.TypeDir:
		// An existing directory takes the entry's metadata; anything else is replaced.
		if child := node.children[base]; child != nil {
			if child.made == byParent {
				child.made = byParentThenEntry
			}
			return
		}
		node.add(base, &dirNode{})
	default:
		// archive.Apply removes whatever is at the name, directory tree included,
		// before it creates the entry.
		delete(node.children, base)
	}
}

// add makes child n's entry name.
func (n *dirNode) add(name string, child *dirNode) {
	if n.children == nil {
		n.children = map[string]*dirNode{}
	}
	n.children[name] = child
}

// makeParents records the directories rel (relative to n, none existing) that
// archive.Apply makes as an entry's parents, and returns the deepest.
func (n *dirNode) makeParents(rel string) *dirNode {
	for _, c := range strings.Split(rel, "/") {
		child := &dirNode{made: byParent}
		n.add(c, child)
		n = child
	}
	return n
}

// walk calls fn for every directory under n, with its path relative to n, parents
// first; fn's error stops the walk.
func (n *dirNode) walk(rel string, fn func(rel string, d *dirNode) error) error {
	for name, child := range n.children {
		p := name
		if rel != "" {
			p = rel + "/" + name
		}
		if err := fn(p, child); err != nil {
			return err
		}
		if err := child.walk(p, fn); err != nil {
			return err
		}
	}
	return nil
}

// checkWhiteout refuses a whiteout that names no file (".wh.", ".wh..", ".wh..."):
// archive.Apply would refuse it only as an "invalid archive", or whiteout the directory
// holding it. The opaque marker ".wh..wh..opq" is fine, and so are other ".wh..wh."
// names, which old Docker (AUFS) layers carry and which unpack as containerd unpacks them.
func checkWhiteout(name string) error {
	base := filepath.Base(name)
	if !strings.HasPrefix(base, whiteoutPrefix) || base == whiteoutOpaque {
		return nil
	}
	switch strings.TrimPrefix(base, whiteoutPrefix) {
	case "", ".", "..":
		return fmt.Errorf("whiteout %q names no file to remove", base)
	}
	return nil
}

// checkLinkTarget refuses a hard link that archive.Apply could not make: link(2) needs
// the target to exist, in this layer (archive.Apply does not look into lower layers),
// earlier in the tar, and not be a directory. Its parents are checked already, so the
// Lstat follows no symlink.
func (g *guard) checkLinkTarget(name, target string) error {
	if target == name {
		return errors.New("the entry links to itself")
	}
	fi, err := os.Lstat(filepath.Join(g.layer, target))
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, unix.ENOTDIR):
		return errors.New("no such file earlier in this layer (hard links cannot reach into lower layers)")
	case err != nil:
		return fmt.Errorf("check the target: %w", err)
	case fi.IsDir():
		return errors.New("is a directory")
	}
	return nil
}

// checkName refuses names that are absolute or have a ".." component.
func checkName(name string) error {
	if name == "" {
		return errors.New("empty name")
	}
	if filepath.IsAbs(name) {
		return errors.New("absolute path")
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return errors.New(`".." path component`)
		}
	}
	return nil
}

// isOpaque tells whether directory p hides the layers below it (an OCI opaque marker,
// converted for overlay).
func isOpaque(p string) bool {
	buf := make([]byte, 1)
	n, err := unix.Lgetxattr(p, "trusted.overlay.opaque", buf)
	return err == nil && n == 1 && buf[0] == 'y'
}
