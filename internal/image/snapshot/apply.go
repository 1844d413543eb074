package snapshot

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/image/diskspace"
)

// Apply unpacks one uncompressed layer tar stream as snapshot chainID on top of parent
// (empty for a base layer); layerName (e.g. the compressed blob's digest) names the
// layer in errors. It is Claim, Unpack and Commit: atomic (on any error nothing
// remains), r not read when chainID exists already (its Info is returned: layers are
// shared between images), concurrent calls for one chain ID serialised (the later ones
// return the first one's snapshot, or, if it failed, try with their own stream). The
// parent must exist (errdefs.ErrNotFound otherwise) and cannot be removed meanwhile.
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
func (s *Snapshotter) Apply(ctx context.Context, chainID, parent digest.Digest, layerName string, r io.Reader) (Info, error) {
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
	c, info, err := s.claim(ctx, chainID, parent)
	if err != nil {
		return Info{}, fmt.Errorf("unpack layer %s: %w", layerName, err)
	}
	if c == nil {
		return info, nil
	}
	defer c.Release()
	p, err := s.Unpack(ctx, layerName, r)
	if err != nil {
		return Info{}, err
	}
	return s.Commit(ctx, c, p, parent)
}

// Pending is a layer unpacked into a temporary directory under the snapshotter's root,
// not yet a snapshot: Commit makes it one, Discard deletes it. Open deletes those a
// crash left.
type Pending struct {
	s         *Snapshotter
	layerName string
	g         *guard
	size      int64
	inodes    int64

	// mu serialises Commit and Discard; dir is "" once committed or discarded.
	mu  sync.Mutex
	dir string
}

// Unpack unpacks the uncompressed layer tar stream r into a temporary directory,
// without its parent chain, so that the layers of an image can be unpacked at once, in
// any order: the checks that need the lower layers, and the attributes of parent
// directories the tar does not carry (containerd copies them from the lower layers),
// are recorded and done by Commit. layerName names the layer in errors. It refuses what
// Apply refuses, with the same errors, except entries reached through a symlink of a
// lower layer, which Commit refuses; r's own errors are returned as they are, and a
// full filesystem is an error wrapping errdefs.ErrResourceExhausted, and an option's
// error is returned as it is. On error nothing remains. Unpack reads r up to the end
// of the tar archive, not beyond.
func (s *Snapshotter) Unpack(ctx context.Context, layerName string, r io.Reader, opts ...UnpackOption) (_ *Pending, retErr error) {
	var o unpackOptions
	for _, opt := range opts {
		opt(&o)
	}
	// A full filesystem is ResourceExhausted; the partial layer is removed below.
	defer func() { retErr = diskspace.Classify(retErr, s.root) }()
	if layerName == "" {
		layerName = "(unnamed)"
	}
	tmp, err := os.MkdirTemp(s.root, tmpPrefix)
	if err != nil {
		return nil, fmt.Errorf("unpack layer %s: %w", layerName, err)
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
		return nil, fmt.Errorf("unpack layer %s: %w", layerName, err)
	}
	g := newGuard(tmp)
	src := &stream{r: r}
	_, err = archive.Apply(ctx, tmp, src,
		archive.WithConvertWhiteout(archive.OverlayConvertWhiteout),
		archive.WithFilter(o.filter(g)),
	)
	if err != nil {
		return nil, fmt.Errorf("unpack layer %s: %w", layerName, classifyApply(err, src))
	}
	size, inodes, err := diskUsage(tmp)
	if err != nil {
		return nil, fmt.Errorf("unpack layer %s: %w", layerName, err)
	}
	return &Pending{s: s, layerName: layerName, g: g, size: size, inodes: inodes, dir: tmp}, nil
}

// UnpackOption changes what Unpack does.
type UnpackOption func(*unpackOptions)

type unpackOptions struct {
	check func(name string, size int64) error
}

// WithEntryCheck has Unpack call check with every entry it is about to write: its name
// in the tar and the bytes of data it writes (a regular file's size, the holes of a
// sparse file included, which the tar stream does not hold; 0 for other entries).
// check's error fails the unpack as it is. It lets the caller bound what a layer
// writes by more than the bytes of its tar stream.
func WithEntryCheck(check func(name string, size int64) error) UnpackOption {
	return func(o *unpackOptions) { o.check = check }
}

// filter returns g's filter followed by the entry check.
func (o *unpackOptions) filter(g *guard) func(*tar.Header) (bool, error) {
	if o.check == nil {
		return g.filter
	}
	return func(hdr *tar.Header) (bool, error) {
		ok, err := g.filter(hdr)
		if !ok || err != nil {
			return ok, err
		}
		var size int64
		if hdr.Typeflag == tar.TypeReg {
			size = hdr.Size
		}
		if err := o.check(hdr.Name, size); err != nil {
			return false, err
		}
		return true, nil
	}
}

// Discard deletes a pending unpack; a no-op after Commit or a second Discard.
func (p *Pending) Discard() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.discardLocked()
}

func (p *Pending) discardLocked() error {
	if p.dir == "" {
		return nil
	}
	err := os.RemoveAll(p.dir)
	p.dir = ""
	if err != nil {
		// Open deletes what is left.
		return fmt.Errorf("discard unpacked layer %s: %w", p.layerName, err)
	}
	return nil
}

// Commit makes p the snapshot c claims, on top of parent ("" for a base layer). The
// parent must exist (an error wrapping errdefs.ErrFailedPrecondition otherwise: the
// caller commits bottom-up); from here until c's Release, Remove refuses it. Commit
// does what Unpack left for the lower layers: it refuses an entry reached through a
// symlink of a visible lower layer (errdefs.ErrInvalidArgument naming the layer and the
// entry, as Apply), and gives the directories the unpack created as parents of entries
// the attributes containerd gives them (those of the topmost lower layer's directory
// there, if any). Then it flushes the filesystem, so that a recorded layer is complete
// on disk, and records the snapshot. p is consumed: deleted on any error.
func (s *Snapshotter) Commit(ctx context.Context, c *Claim, p *Pending, parent digest.Digest) (Info, error) {
	return s.commit(ctx, c, p, parent, true)
}

// CommitUnsynced is Commit without the flush, for a caller that flushes once (Sync)
// for many layers before it records anything that needs them whole after a power cut:
// a layer committed so, and referenced by nothing when the power goes, is freed by the
// recovery of the next start, as every unreferenced layer is. One flush per image
// instead of one per layer saves the serial wait of each (0.25–0.4 s a layer measured
// here), and the flushes of concurrently committed layers no longer queue behind each
// other.
func (s *Snapshotter) CommitUnsynced(ctx context.Context, c *Claim, p *Pending, parent digest.Digest) (Info, error) {
	return s.commit(ctx, c, p, parent, false)
}

// Sync flushes the filesystem holding the snapshots: every layer committed before it
// returns is whole on disk.
func (s *Snapshotter) Sync() error { return syncfs(s.root) }

func (s *Snapshotter) commit(ctx context.Context, c *Claim, p *Pending, parent digest.Digest, durable bool) (_ Info, retErr error) {
	if p == nil {
		return Info{}, fmt.Errorf("commit layer: no unpacked layer: %w", errdefs.ErrInvalidArgument)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	layerName := p.layerName
	defer func() {
		if retErr != nil {
			if err := p.discardLocked(); err != nil {
				retErr = errors.Join(retErr, err)
			}
		}
		// A full filesystem is ResourceExhausted.
		retErr = diskspace.Classify(retErr, s.root)
	}()
	switch {
	case p.dir == "":
		return Info{}, fmt.Errorf("unpack layer %s: committed or discarded already: %w", layerName, errdefs.ErrFailedPrecondition)
	case p.s != s || c == nil || c.s != s:
		return Info{}, fmt.Errorf("unpack layer %s: commit without a claim of this snapshotter: %w", layerName, errdefs.ErrInvalidArgument)
	case parent == c.chainID:
		return Info{}, fmt.Errorf("unpack layer %s: %s is its own parent: %w", layerName, parent, errdefs.ErrInvalidArgument)
	}
	if parent != "" {
		if err := parent.Validate(); err != nil {
			return Info{}, fmt.Errorf("unpack layer %s: parent %q: %v: %w", layerName, parent, err, errdefs.ErrInvalidArgument)
		}
	}
	if err := ctx.Err(); err != nil {
		return Info{}, fmt.Errorf("unpack layer %s: %w", layerName, err)
	}
	lowers, err := s.pinParent(c, parent)
	if err != nil {
		return Info{}, fmt.Errorf("unpack layer %s: %w", layerName, err)
	}

	l := &lowerLayers{dirs: lowers}
	if len(lowers) > 0 {
		// In tar order: the first refused is the one Apply with the lowers at hand
		// would have stopped at.
		for _, lc := range p.g.lowerChecks {
			if err := l.check(lc); err != nil {
				return Info{}, fmt.Errorf("unpack layer %s: %w", layerName, err)
			}
		}
	}
	size := p.size
	err = p.g.dirs.walk("", func(rel string, d *dirNode) error {
		if d.made == byEntry || len(lowers) == 0 {
			return nil
		}
		// Extended attributes may take a block of their own.
		before, err := blocks(filepath.Join(p.dir, rel))
		if err != nil {
			return err
		}
		if err := l.fixParentDir(p.dir, rel, d.made); err != nil {
			return err
		}
		after, err := blocks(filepath.Join(p.dir, rel))
		size += after - before
		return err
	})
	if err != nil {
		return Info{}, fmt.Errorf("unpack layer %s: parent directories: %w", layerName, err)
	}
	// Once recorded, the layer is trusted to be complete: get it to disk first so that
	// a power loss cannot leave a recorded layer with empty files.
	if durable {
		if err := syncfs(p.dir); err != nil {
			return Info{}, fmt.Errorf("unpack layer %s: %w", layerName, err)
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if !c.heldLocked() {
		return Info{}, fmt.Errorf("unpack layer %s: the claim on %s was released: %w", layerName, c.chainID, errdefs.ErrFailedPrecondition)
	}
	id := s.nextID
	dir := s.dir(id)
	if err := os.Rename(p.dir, dir); err != nil {
		return Info{}, fmt.Errorf("unpack layer %s: %w", layerName, err)
	}
	s.nextID++
	p.dir = dir // what to delete on failure from here on
	rec := layerRecord{ID: id, Parent: parent, Size: size, Inodes: p.inodes, Created: time.Now().UTC()}
	if err := s.st.Put(layerBucket, c.chainID.String(), rec); err != nil {
		return Info{}, fmt.Errorf("unpack layer %s: %w", layerName, err)
	}
	p.dir = ""
	return s.info(c.chainID, rec), nil
}

// pinParent checks that the claim c is outstanding and parent exists, and makes Remove
// refuse parent until c's Release. It returns the parent chain's directories, topmost
// first.
func (s *Snapshotter) pinParent(c *Claim, parent digest.Digest) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !c.heldLocked() {
		return nil, fmt.Errorf("the claim on %s was released: %w", c.chainID, errdefs.ErrFailedPrecondition)
	}
	if c.fl.parent != "" && c.fl.parent != parent {
		return nil, fmt.Errorf("claimed on parent %s, committed on %s: %w", c.fl.parent, parent, errdefs.ErrInvalidArgument)
	}
	if parent == "" {
		return nil, nil
	}
	lowers, err := s.chainLocked(parent)
	if errdefs.IsNotFound(err) {
		// Not the caller's NotFound: the layer is fine, its parent is not there (yet).
		return nil, fmt.Errorf("parent: %v: %w", err, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return nil, fmt.Errorf("parent: %w", err)
	}
	c.fl.parent = parent
	return lowers, nil
}

// blocks returns the bytes path takes on disk.
func blocks(path string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Blocks * 512, nil
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
