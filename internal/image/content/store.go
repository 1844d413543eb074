package content

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/image/diskspace"
)

// algorithms are the digest algorithms the store accepts. Anything else is refused
// before a digest is turned into a path, so the directory names are fixed.
var algorithms = []digest.Algorithm{digest.SHA256, digest.SHA512}

// copyBufSize is the read size while ingesting: large enough that a layer download is
// not dominated by syscalls, small enough to keep one buffer per concurrent write.
const copyBufSize = 1 << 20

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

// Store holds blobs by digest under one root directory.
type Store struct {
	root   string
	blobs  string
	ingest string
}

// Open opens (creating if needed) the store at root, laid out as root/blobs/sha256/<hex>
// and root/ingest/. Partial writes left in ingest/ by a crash are removed: nothing
// can resume them, since an ingest belongs to the process that started it.
func Open(root string) (*Store, error) {
	s := &Store{
		root:   root,
		blobs:  filepath.Join(root, "blobs"),
		ingest: filepath.Join(root, "ingest"),
	}
	if err := os.RemoveAll(s.ingest); err != nil {
		return nil, fmt.Errorf("open content store %s: remove stale ingest files: %w", root, err)
	}
	for _, dir := range []string{s.ingest, filepath.Join(s.blobs, string(digest.SHA256))} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("open content store %s: %w", root, err)
		}
	}
	return s, nil
}

// Root returns the directory the store lives in.
func (s *Store) Root() string { return s.root }

// validate refuses any digest that is not a well-formed sha256 or sha512 digest.
// go-digest's Validate checks the encoded part is lowercase hex of the right length,
// so a valid digest can never contain a path separator or "..".
func validate(d digest.Digest) error {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("invalid digest %q: %v: %w", d, err, errdefs.ErrInvalidArgument)
	}
	alg := d.Algorithm()
	for _, a := range algorithms {
		if alg == a {
			return nil
		}
	}
	return fmt.Errorf("invalid digest %q: algorithm %s is not supported (only sha256 and sha512): %w", d, alg, errdefs.ErrInvalidArgument)
}

// path returns the file that holds blob d, after validating d.
func (s *Store) path(d digest.Digest) (string, error) {
	if err := validate(d); err != nil {
		return "", err
	}
	return filepath.Join(s.blobs, string(d.Algorithm()), d.Encoded()), nil
}

// Has reports whether blob d is in the store. An invalid digest is never present.
func (s *Store) Has(d digest.Digest) bool {
	_, err := s.Info(d)
	return err == nil
}

// Info returns the size of blob d, or an error wrapping errdefs.ErrNotFound.
func (s *Store) Info(d digest.Digest) (int64, error) {
	p, err := s.path(d)
	if err != nil {
		return 0, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return 0, notFound(d, err)
	}
	return fi.Size(), nil
}

// notFound turns a missing file into errdefs.ErrNotFound and keeps other errors.
func notFound(d digest.Digest, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blob %s: %w", d, errdefs.ErrNotFound)
	}
	return fmt.Errorf("blob %s: %w", d, err)
}

// Open opens blob d for reading; the caller closes it.
func (s *Store) Open(d digest.Digest) (io.ReadSeekCloser, error) {
	p, err := s.path(d)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, notFound(d, err)
	}
	return f, nil
}

// ReadAll returns the whole of blob d, refusing one larger than max bytes so that a
// hostile manifest or config cannot make the caller allocate without bound.
func (s *Store) ReadAll(d digest.Digest, max int64) ([]byte, error) {
	f, err := s.Open(d)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("read blob %s: %w", d, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("read blob %s: larger than the %d bytes allowed: %w", d, max, errdefs.ErrOutOfRange)
	}
	return b, nil
}

// Write streams r into the store as blob d. The bytes go to a unique file in ingest/,
// are hashed and counted on the way, and the file is synced and renamed into place
// only if they match d and size (size < 0: size unknown). A mismatch, a short or long
// read, a read error or a cancelled ctx is an error naming d and what went wrong, and
// leaves no file behind; a full filesystem is an error wrapping
// errdefs.ErrResourceExhausted. If d is already present Write reads nothing and returns nil.
func (s *Store) Write(ctx context.Context, d digest.Digest, size int64, r io.Reader) error {
	return s.write(ctx, d, size, r, true)
}

// WriteUnsynced is Write without the fsyncs, for a caller that flushes once (Sync)
// before it records anything referencing the blob: after a power cut a blob written so
// may be incomplete under its final name, so only a store whose unreferenced blobs are
// freed at the next start (image.Service's) may use it. An image's blobs then cost one
// flush instead of one each, and a download no longer waits for its blob to reach the
// disk before its unpack can finish.
func (s *Store) WriteUnsynced(ctx context.Context, d digest.Digest, size int64, r io.Reader) error {
	return s.write(ctx, d, size, r, false)
}

// Sync flushes the filesystem holding the store: every blob written before it returns
// is whole on disk under its name.
func (s *Store) Sync() error {
	f, err := os.Open(s.root)
	if err != nil {
		return fmt.Errorf("sync content store: %w", err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("sync content store %s: %w", s.root, err)
	}
	return nil
}

func (s *Store) write(ctx context.Context, d digest.Digest, size int64, r io.Reader, durable bool) (retErr error) {
	// A full filesystem is ResourceExhausted; the ingest file is removed below.
	defer func() { retErr = diskspace.Classify(retErr, s.root) }()
	p, err := s.path(d)
	if err != nil {
		return fmt.Errorf("write blob: %w", err)
	}
	if fi, err := os.Stat(p); err == nil {
		if size >= 0 && fi.Size() != size {
			// The stored blob was verified against d, so it is the descriptor that is wrong.
			return fmt.Errorf("write blob %s: expected %d bytes, but the stored blob with that digest has %d: %w",
				d, size, fi.Size(), errdefs.ErrFailedPrecondition)
		}
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("write blob %s: %w", d, err)
	}

	// The ingest file's name starts with the digest so a leftover is recognisable;
	// CreateTemp's random suffix keeps concurrent writers of one digest apart.
	f, err := os.CreateTemp(s.ingest, d.Encoded()[:16]+"-*")
	if err != nil {
		return fmt.Errorf("write blob %s: %w", d, err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()

	h := d.Algorithm().Hash()
	var src io.Reader = &ctxReader{ctx: ctx, r: r}
	if size >= 0 {
		// One byte more than announced is enough to tell that the source is too long.
		src = io.LimitReader(src, size+1)
	}
	bufp := copyBufs.Get().(*[]byte)
	n, err := io.CopyBuffer(io.MultiWriter(f, h), src, *bufp)
	copyBufs.Put(bufp)
	if err != nil {
		if size >= 0 {
			return fmt.Errorf("write blob %s: read failed after %d of %d bytes: %w", d, n, size, err)
		}
		return fmt.Errorf("write blob %s: read failed after %d bytes: %w", d, n, err)
	}
	switch {
	case size >= 0 && n < size:
		return fmt.Errorf("write blob %s: truncated: got %d of %d bytes: %w", d, n, size, errdefs.ErrFailedPrecondition)
	case size >= 0 && n > size:
		return fmt.Errorf("write blob %s: too long: got more than the %d bytes expected: %w", d, size, errdefs.ErrFailedPrecondition)
	}
	if got := digest.NewDigest(d.Algorithm(), h); got != d {
		return fmt.Errorf("write blob %s: digest mismatch: the %d bytes received hash to %s: %w", d, n, got, errdefs.ErrFailedPrecondition)
	}

	// Sync before the rename: after a crash a blob under its final name must be whole.
	if err := f.Chmod(0o444); err != nil {
		return fmt.Errorf("write blob %s: %w", d, err)
	}
	if durable {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("write blob %s: sync: %w", d, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write blob %s: %w", d, err)
	}
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("write blob %s: %w", d, err)
	}
	// Rename is atomic; a concurrent writer of the same digest renames identical bytes.
	if err := os.Rename(f.Name(), p); err != nil {
		return fmt.Errorf("write blob %s: commit: %w", d, err)
	}
	committed = true
	if !durable {
		return nil
	}
	// Sync the directory so the new name itself survives a crash.
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("write blob %s: sync directory: %w", d, err)
	}
	return nil
}

func syncDir(dir string) error {
	df, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer df.Close()
	return df.Sync()
}

// ctxReader stops a copy as soon as ctx is done, whatever the underlying reader does.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// Delete removes blob d; removing a blob that is not there is not an error.
func (s *Store) Delete(d digest.Digest) error {
	p, err := s.path(d)
	if err != nil {
		return fmt.Errorf("delete blob: %w", err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete blob %s: %w", d, err)
	}
	return nil
}

// Walk calls fn for every blob in the store, in digest order within each algorithm.
// Files whose names are not valid digests are skipped. An error from fn stops the walk
// and is returned.
func (s *Store) Walk(fn func(d digest.Digest, size int64) error) error {
	for _, alg := range algorithms {
		dir := filepath.Join(s.blobs, string(alg))
		entries, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("walk content store: %w", err)
		}
		for _, e := range entries {
			if !e.Type().IsRegular() {
				continue
			}
			d := digest.NewDigestFromEncoded(alg, e.Name())
			if d.Validate() != nil {
				continue
			}
			fi, err := e.Info()
			if errors.Is(err, fs.ErrNotExist) {
				continue // deleted while walking
			}
			if err != nil {
				return fmt.Errorf("walk content store: %w", err)
			}
			if err := fn(d, fi.Size()); err != nil {
				return err
			}
		}
	}
	return nil
}

// Usage returns the disk space (allocated blocks, as du counts) and the number of
// inodes used under the store's root, including ingests in progress: this is what
// the store costs the filesystem, which is what kubelet's image GC needs to know.
func (s *Store) Usage() (bytes, inodes int64, err error) {
	err = filepath.WalkDir(s.root, func(path string, e fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		fi, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		inodes++
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			bytes += st.Blocks * 512
		} else {
			bytes += fi.Size()
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("content store usage: %w", err)
	}
	return bytes, inodes, nil
}
