// Package diskspace keeps image pulls from filling the image filesystem: a free-space
// reserve checked before and while data is written, and the classification of a full
// filesystem (ENOSPC, EDQUOT) as errdefs.ErrResourceExhausted.
package diskspace

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// CheckEvery is how many bytes a guarded reader passes between two statfs calls. It
// bounds how far a write can overshoot the reserve (plus the writer's own buffering)
// and keeps the check to one syscall per few MiB: statfs costs about a microsecond,
// writing 4 MiB about a millisecond.
const CheckEvery = 4 << 20

// Reserve is the free space writes to the filesystem holding Path must leave: the
// larger of Bytes and Percent of the filesystem's size. The zero value reserves
// nothing, and then no check is made.
type Reserve struct {
	// Path is any directory on the filesystem, named in errors.
	Path    string
	Bytes   int64
	Percent float64
}

// Enabled reports whether r reserves anything.
func (r Reserve) Enabled() bool { return r.Path != "" && (r.Bytes > 0 || r.Percent > 0) }

// Space is what statfs says about a filesystem, in bytes.
type Space struct {
	Total, Free int64
}

// Stat returns the size of the filesystem holding path and the space an unprivileged
// writer may still use (f_bavail: root's reserved blocks are not counted as free).
func Stat(path string) (Space, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return Space{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	bs := int64(st.Bsize)
	return Space{Total: int64(st.Blocks) * bs, Free: int64(st.Bavail) * bs}, nil
}

// bytesFor returns the reserve in bytes on a filesystem of total bytes.
func (r Reserve) bytesFor(total int64) int64 {
	pct := int64(float64(total) * r.Percent / 100)
	return max(r.Bytes, pct)
}

// Check returns an error wrapping errdefs.ErrResourceExhausted when writing need more
// bytes would leave less than the reserve free; what names the write ("layer
// sha256:…", "stopped after 64 MiB"). A disabled reserve never fails; statfs failing
// is an error.
func (r Reserve) Check(need int64, what string) error {
	if !r.Enabled() {
		return nil
	}
	sp, err := Stat(r.Path)
	if err != nil {
		return err
	}
	reserve := r.bytesFor(sp.Total)
	if sp.Free-need >= reserve {
		return nil
	}
	if need > 0 {
		return fmt.Errorf("%s needs %s but the image filesystem %s has %s free and must keep %s (image.min_free_bytes / image.min_free_percent): %w",
			what, Format(need), r.Path, Format(sp.Free), Format(reserve), errdefs.ErrResourceExhausted)
	}
	return fmt.Errorf("%s: the image filesystem %s is down to %s free and must keep %s (image.min_free_bytes / image.min_free_percent): %w",
		what, r.Path, Format(sp.Free), Format(reserve), errdefs.ErrResourceExhausted)
}

// Reader returns src with the reserve checked before the first byte and after every
// CheckEvery bytes read: whoever writes what it reads (a tar unpacker, a download)
// fails with Check's error once the filesystem is down to the reserve, however much the
// data expanded before it (a gzip of zeros). What a writer adds to the data it reads is
// not counted: a tar unpacker writes the holes of a sparse file out in full, so it must
// Check such a file's size itself. A disabled reserve returns src. what, when not
// empty, names the data in the error.
func (r Reserve) Reader(src io.Reader, what string) io.Reader {
	if !r.Enabled() {
		return src
	}
	if what != "" {
		what += ": "
	}
	return &guardedReader{r: r, src: src, what: what}
}

type guardedReader struct {
	r          Reserve
	src        io.Reader
	what       string
	untilCheck int64 // bytes left before the next check; <= 0: check now
	read       int64
	err        error // sticky: once refused, always refused
}

func (g *guardedReader) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	if g.untilCheck <= 0 {
		if err := g.r.Check(0, g.what+"stopped after "+Format(g.read)); err != nil {
			g.err = err
			return 0, g.err
		}
		g.untilCheck = CheckEvery
	}
	if int64(len(p)) > g.untilCheck {
		p = p[:g.untilCheck]
	}
	n, err := g.src.Read(p)
	g.untilCheck -= int64(n)
	g.read += int64(n)
	return n, err
}

// IsFull reports whether err says a filesystem (or a quota) is full.
func IsFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// Classify adds errdefs.ErrResourceExhausted, path and the size of its filesystem to an
// error caused by a full filesystem, so that it reaches the CRI client as
// ResourceExhausted with a message naming the place. Other errors, and ones already
// classified, are returned as they are.
func Classify(err error, path string) error {
	if err == nil || !IsFull(err) || errdefs.IsResourceExhausted(err) {
		return err
	}
	// Not the free space: by now the failed write's partial data may be gone again.
	var st unix.Statfs_t
	if unix.Statfs(path, &st) != nil {
		return fmt.Errorf("%w: the filesystem holding %s is full: %w", err, path, errdefs.ErrResourceExhausted)
	}
	size := Format(int64(st.Blocks) * int64(st.Bsize))
	if st.Files > 0 && st.Ffree == 0 {
		return fmt.Errorf("%w: the filesystem holding %s (%s) is full: it has no inodes left: %w", err, path, size, errdefs.ErrResourceExhausted)
	}
	return fmt.Errorf("%w: the filesystem holding %s (%s) is full: %w", err, path, size, errdefs.ErrResourceExhausted)
}

// Format renders n bytes for a person: "512 MiB", "3.2 GiB", "812 B".
func Format(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	f := float64(n)
	for _, suffix := range []string{"KiB", "MiB", "GiB", "TiB"} {
		f /= unit
		if f < unit && f > -unit || suffix == "TiB" {
			return strings.TrimSuffix(fmt.Sprintf("%.1f", f), ".0") + " " + suffix
		}
	}
	return fmt.Sprintf("%d B", n)
}
