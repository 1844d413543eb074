package snapshot

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/image/diskspace"
)

// OCI whiteout names (image-spec layer.md), as archive.Apply reads them.
const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// Apply unpacks one uncompressed layer tar stream as snapshot chainID on top of parent
// (empty for a base layer); layerName (e.g. the compressed blob's digest) names the
// layer in errors. It is atomic: the layer is unpacked into a temporary directory under
// root that becomes the snapshot only once complete, so on any error nothing remains.
// When chainID exists already, r is not read and its Info is returned: layers are
// shared between images. Concurrent calls for one chain ID are serialised; the later
// ones return the first one's snapshot, or, if it failed, try with their own stream.
//
// Entries that could escape the layer or disagree with what the mounted image shows are
// refused (errdefs.ErrInvalidArgument, naming the layer and the entry): absolute names,
// ".." components, hard links to absolute or ".." targets, and anything reached through
// a symlink of this layer or of a visible lower layer. So are entries the unpack could
// not create, refused before it tries so that the error names the entry: hard links to
// a target that is not (yet) in this layer or is a directory, whiteouts that name no
// file (".wh.", ".wh.."), and entries (opaque markers too) beneath a file or whiteout of
// this layer. A stream that is not a tar or ends inside one (a truncated layer) is
// errdefs.ErrInvalidArgument too; an error of r itself is returned as it is (its kind is
// r's to give). A full filesystem is an error wrapping errdefs.ErrResourceExhausted.
func (s *Snapshotter) Apply(ctx context.Context, chainID, parent digest.Digest, layerName string, r io.Reader) (_ Info, retErr error) {
	// A full filesystem is ResourceExhausted; the partial layer is removed below.
	defer func() { retErr = diskspace.Classify(retErr, s.root) }()
	if err := chainID.Validate(); err != nil {
		return Info{}, fmt.Errorf("unpack layer %s: chain ID %q: %v: %w", layerName, chainID, err, errdefs.ErrInvalidArgument)
	}
	if parent != "" {
		if err := parent.Validate(); err != nil {
			return Info{}, fmt.Errorf("unpack layer %s: parent %q: %v: %w", layerName, parent, err, errdefs.ErrInvalidArgument)
		}
		if parent == chainID {
			return Info{}, fmt.Errorf("unpack layer %s: %s is its own parent: %w", layerName, chainID, errdefs.ErrInvalidArgument)
		}
	}
	if layerName == "" {
		layerName = chainID.String()
	}
	fl, info, lowers, err := s.beginApply(ctx, chainID, parent)
	if err != nil {
		return Info{}, fmt.Errorf("unpack layer %s: %w", layerName, err)
	}
	if fl == nil {
		return info, nil
	}
	defer s.endApply(chainID, fl)

	tmp, err := os.MkdirTemp(s.root, tmpPrefix)
	if err != nil {
		return Info{}, fmt.Errorf("unpack layer %s: %w", layerName, err)
	}
	defer func() {
		if retErr != nil {
			if err := os.RemoveAll(tmp); err != nil {
				retErr = errors.Join(retErr, fmt.Errorf("clean up %s: %w", tmp, err))
			}
		}
	}()
	// MkdirTemp makes 0700; this directory is the layer's root, shown as / when it is
	// the topmost layer of a rootfs.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Info{}, fmt.Errorf("unpack layer %s: %w", layerName, err)
	}
	g := &guard{layer: tmp, lowers: lowers, lowerCache: map[string]lowerView{}}
	src := &stream{r: r}
	_, err = archive.Apply(ctx, tmp, src,
		archive.WithConvertWhiteout(archive.OverlayConvertWhiteout),
		archive.WithParents(lowers),
		archive.WithFilter(g.filter),
	)
	if err != nil {
		return Info{}, fmt.Errorf("unpack layer %s: %w", layerName, classifyApply(err, src))
	}
	size, inodes, err := diskUsage(tmp)
	if err != nil {
		return Info{}, fmt.Errorf("unpack layer %s: %w", layerName, err)
	}
	// Once recorded, the layer is trusted to be complete: get it to disk first so that
	// a power loss cannot leave a recorded layer with empty files.
	if err := syncfs(tmp); err != nil {
		return Info{}, fmt.Errorf("unpack layer %s: %w", layerName, err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.nextID
	dir := s.dir(id)
	if err := os.Rename(tmp, dir); err != nil {
		return Info{}, fmt.Errorf("unpack layer %s: %w", layerName, err)
	}
	s.nextID++
	tmp = dir // what to delete on failure from here on
	rec := layerRecord{ID: id, Parent: parent, Size: size, Inodes: inodes, Created: time.Now().UTC()}
	if err := s.st.Put(layerBucket, chainID.String(), rec); err != nil {
		return Info{}, fmt.Errorf("unpack layer %s: %w", layerName, err)
	}
	return s.info(chainID, rec), nil
}

// beginApply returns the existing snapshot chainID (fl nil), or registers an unpack of
// it after waiting for any other unpack of the same chain ID; lowers are the parent
// chain's directories, topmost first. Registering pins parent: Remove refuses it until
// endApply.
func (s *Snapshotter) beginApply(ctx context.Context, chainID, parent digest.Digest) (fl *flight, _ Info, lowers []string, _ error) {
	for {
		s.mu.Lock()
		if other, ok := s.applying[chainID]; ok {
			s.mu.Unlock()
			select {
			case <-other.done:
				continue
			case <-ctx.Done():
				return nil, Info{}, nil, fmt.Errorf("wait for another unpack of %s: %w", chainID, ctx.Err())
			}
		}
		var rec layerRecord
		err := s.get(layerBucket, chainID.String(), &rec)
		if err == nil {
			s.mu.Unlock()
			return nil, s.info(chainID, rec), nil, nil
		}
		if !errdefs.IsNotFound(err) {
			s.mu.Unlock()
			return nil, Info{}, nil, err
		}
		if parent != "" {
			if lowers, err = s.chainLocked(parent); err != nil {
				s.mu.Unlock()
				return nil, Info{}, nil, fmt.Errorf("parent: %w", err)
			}
		}
		fl = &flight{parent: parent, done: make(chan struct{})}
		s.applying[chainID] = fl
		s.mu.Unlock()
		return fl, Info{}, lowers, nil
	}
}

// endApply unregisters the unpack fl and wakes whoever waits for it.
func (s *Snapshotter) endApply(chainID digest.Digest, fl *flight) {
	s.mu.Lock()
	delete(s.applying, chainID)
	s.mu.Unlock()
	close(fl.done)
}

// guard is the tar filter of one unpack. archive.Apply already keeps every path inside
// the directory it unpacks to, but it resolves symlinks within this one layer only, so
// a layer could still create files where the mounted image shows something else (a
// path through a lower layer's symlink), and a stricter check costs nothing for layers
// built by real tools. Refusing fails the whole unpack.
type guard struct {
	layer  string   // the directory being unpacked into
	lowers []string // the parent chain, topmost first

	// lowerCache holds the merged view of the lower layers per directory path; they do
	// not change during an unpack, unlike the layer itself.
	lowerCache map[string]lowerView
}

// lowerView is what the lower layers together show at one path.
type lowerView struct {
	kind kind
	// merged are the indexes of the lowers whose directory at this path is part of the
	// merged directory (topmost first; stops at an opaque one).
	merged []int
}

type kind int

const (
	absent  kind = iota
	isDir        // a directory
	isLink       // a symlink
	isOther      // a file, device, whiteout…: nothing beneath it is visible
)

// filter is the archive.WithFilter callback. archive.Apply calls it with the name
// already passed through filepath.Clean, so an inner ".." is resolved lexically by then
// and only a leading one can remain; it runs after every earlier entry is on disk, so
// the layer directory shows what this layer created so far.
func (g *guard) filter(hdr *tar.Header) (bool, error) {
	name := strings.TrimPrefix(hdr.Name, "./")
	if name == "." || name == "" {
		return true, nil // the layer root; archive.Apply skips it
	}
	if err := g.checkName(name); err != nil {
		return false, refuse(hdr.Name, err.Error())
	}
	if err := checkWhiteout(name); err != nil {
		return false, refuse(hdr.Name, err.Error())
	}
	if hdr.Typeflag == tar.TypeLink {
		target := strings.TrimPrefix(hdr.Linkname, "./")
		if err := g.checkName(target); err != nil {
			return false, refuse(hdr.Name, fmt.Sprintf("hard link target %q: %s", hdr.Linkname, err))
		}
		target = filepath.Clean(target)
		if err := g.checkParents(target); err != nil {
			return false, refuse(hdr.Name, fmt.Sprintf("hard link target %q: %s", hdr.Linkname, err))
		}
		if err := g.checkLinkTarget(name, target); err != nil {
			return false, refuse(hdr.Name, fmt.Sprintf("hard link target %q: %s", hdr.Linkname, err))
		}
	}
	if err := g.checkParents(name); err != nil {
		return false, refuse(hdr.Name, err.Error())
	}
	return true, nil
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

// stream is the layer's tar stream as archive.Apply reads it. It remembers whether the
// stream itself failed, so that classifyApply can tell a broken source (a network
// error, a corrupt compressed blob: the source gives the kind) from a well-read stream
// that is not a valid tar.
type stream struct {
	r   io.Reader
	err error // the first error of r other than io.EOF
}

func (s *stream) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF && s.err == nil {
		s.err = err
	}
	return n, err
}

// classifyApply gives an error of archive.Apply its kind. A stream that read without
// error and still broke the tar format is the layer's fault: truncated (it ended inside
// a header or a file's data) or not a tar at all. The caller's source is trusted to
// report its own failures (a cut connection must not look like a clean end), so a clean
// early end means the layer itself is short. Errors of the source, the context and the
// filesystem (EIO, EACCES: the host's fault) are returned as they are.
func classifyApply(err error, src *stream) error {
	switch {
	case src.err != nil, errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errdefs.IsInvalidArgument(err), errdefs.IsResourceExhausted(err):
		return err
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("the tar stream ends inside an entry, the layer is truncated (%w): %w", err, errdefs.ErrInvalidArgument)
	case strings.HasPrefix(err.Error(), "archive/tar: "):
		// archive.Apply returns the tar reader's errors as they are: ErrHeader,
		// ErrFieldTooLong, and unexported ones about sparse files.
		return fmt.Errorf("not a valid tar stream (%w): %w", err, errdefs.ErrInvalidArgument)
	}
	return err
}

// refuse is the error for a refused entry; the caller adds the layer's name.
func refuse(entry, why string) error {
	return fmt.Errorf("refused entry %q: %s: %w", entry, why, errdefs.ErrInvalidArgument)
}

// checkName refuses names that are absolute or have a ".." component.
func (g *guard) checkName(name string) error {
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

// checkParents refuses name if one of its parent directories is, as the mounted image
// will show it, a symlink: in this layer (as unpacked so far) or, where this layer has
// nothing, in the topmost lower layer that has something. name must be clean and
// relative.
func (g *guard) checkParents(name string) error {
	dir := filepath.Dir(name)
	if dir == "." {
		return nil
	}
	inLayer := true     // this layer has every prefix so far as a directory
	lowersShown := true // no opaque directory of this layer hides the lowers
	prefix := ""
	for _, c := range strings.Split(dir, "/") {
		prefix = filepath.Join(prefix, c)
		if inLayer {
			// Every shorter prefix is a real directory here, so this Lstat follows
			// no symlink.
			p := filepath.Join(g.layer, prefix)
			fi, err := os.Lstat(p)
			switch {
			case err == nil:
				switch {
				case fi.Mode()&fs.ModeSymlink != 0:
					return fmt.Errorf("parent %q is a symlink in this layer", prefix)
				case !fi.IsDir():
					// A file or a whiteout of this layer, earlier in the tar:
					// archive.Apply would fail with a bare ENOTDIR.
					return fmt.Errorf("parent %q is not a directory in this layer (a file or a whiteout earlier in the tar)", prefix)
				}
				if lowersShown && len(g.lowers) > 0 && isOpaque(p) {
					lowersShown = false
				}
				continue
			case errors.Is(err, fs.ErrNotExist):
				inLayer = false
			default:
				return fmt.Errorf("check parent %q: %w", prefix, err)
			}
		}
		if !lowersShown {
			return nil // created afresh in this layer
		}
		v, err := g.lower(prefix)
		if err != nil {
			return fmt.Errorf("check parent %q: %w", prefix, err)
		}
		switch v.kind {
		case isLink:
			return fmt.Errorf("parent %q is a symlink in a lower layer", prefix)
		case isDir:
			continue
		default:
			return nil // absent or hidden below: created afresh in this layer
		}
	}
	return nil
}

// lower returns what the lower layers together show at the clean relative path p,
// following overlayfs: the topmost layer having p decides its kind; a directory merges
// with the directories at p of the layers below, down to an opaque one or a non-directory.
func (g *guard) lower(p string) (lowerView, error) {
	if v, ok := g.lowerCache[p]; ok {
		return v, nil
	}
	var candidates []int
	if parent := filepath.Dir(p); parent == "." {
		candidates = make([]int, len(g.lowers))
		for i := range candidates {
			candidates[i] = i
		}
	} else {
		pv, err := g.lower(parent)
		if err != nil {
			return lowerView{}, err
		}
		if pv.kind != isDir {
			return lowerView{}, nil
		}
		candidates = pv.merged
	}
	var v lowerView
	for _, i := range candidates {
		// p's parent is a real directory in lower i, so this follows no symlink.
		full := filepath.Join(g.lowers[i], p)
		fi, err := os.Lstat(full)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return lowerView{}, err
		}
		if !fi.IsDir() {
			if v.kind == absent {
				v.kind = isOther
				if fi.Mode()&fs.ModeSymlink != 0 {
					v.kind = isLink
				}
			}
			break // hides this path in the layers below
		}
		v.kind = isDir
		v.merged = append(v.merged, i)
		if isOpaque(full) {
			break
		}
	}
	g.lowerCache[p] = v
	return v, nil
}

// isOpaque tells whether directory p hides the layers below it (an OCI opaque marker,
// converted for overlay).
func isOpaque(p string) bool {
	buf := make([]byte, 1)
	n, err := unix.Lgetxattr(p, "trusted.overlay.opaque", buf)
	return err == nil && n == 1 && buf[0] == 'y'
}

// syncfs flushes the filesystem holding dir.
func syncfs(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("syncfs: %w", err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	return nil
}
