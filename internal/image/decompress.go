package image

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/containerd/errdefs"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/crisp-runtime/crisp/internal/image/diskspace"
	"github.com/crisp-runtime/crisp/internal/image/remote"
)

// maxZstdWindow is the largest zstd window decoded: the decoder allocates the window
// a frame's header asks for before it decodes a byte, so a 20 byte blob asking for the
// library's default limit (512 MiB) costs that much memory per layer at once, before
// its digest is checked. 128 MiB is what the zstd tool decodes without --memory
// (windowLog 27: its --long default and its level 22); build tools default to 8 MiB
// or less.
const maxZstdWindow = 1 << 27

var (
	gzipMagic = []byte{0x1f, 0x8b}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

// decompress returns the uncompressed stream of a layer blob. The format is taken from
// the data's magic bytes rather than the media type, because registries and build tools
// mislabel layers often enough that trusting the label breaks real images.
//
// Errors of the decompressor (corrupt or truncated gzip or zstd data, a zstd window
// over maxZstdWindow) wrap errdefs.ErrInvalidArgument: the blob was verified against its digest when it was
// stored, so the bad data is what the image holds and a retry cannot help. An error
// reading r itself (the disk) is returned as it is.
func decompress(r io.Reader) (io.ReadCloser, error) {
	src := &blobReader{r: r}
	br := bufio.NewReaderSize(src, 64<<10)
	head, err := br.Peek(4)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("read layer header: %w", err)
	}
	switch {
	case bytes.HasPrefix(head, gzipMagic):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, src.corrupt("gzip", err)
		}
		return &decoded{rc: zr, src: src, format: "gzip"}, nil
	case bytes.HasPrefix(head, zstdMagic):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true), zstd.WithDecoderMaxWindow(maxZstdWindow))
		if err != nil {
			return nil, fmt.Errorf("open zstd layer: %w", err)
		}
		return &decoded{rc: zr.IOReadCloser(), src: src, format: "zstd"}, nil
	default:
		return io.NopCloser(br), nil
	}
}

// blobReader remembers whether reading the blob failed, to tell that failure from the
// decompressor's own.
type blobReader struct {
	r   io.Reader
	err error
}

func (b *blobReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF && b.err == nil {
		b.err = err
	}
	return n, err
}

// corrupt returns err of the format's decoder: as it is when reading the blob failed,
// else as corrupt data (InvalidArgument). A blob that ends too early makes the
// decoders return io.ErrUnexpectedEOF, which is kept in the chain.
func (b *blobReader) corrupt(format string, err error) error {
	if b.err != nil || err == nil || err == io.EOF {
		return err
	}
	if errors.Is(err, zstd.ErrWindowSizeExceeded) {
		return fmt.Errorf("zstd frame asks for a window larger than the %d bytes crisp decodes (%w): %w", maxZstdWindow, err, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("corrupt or truncated %s data (%w): %w", format, err, errdefs.ErrInvalidArgument)
}

// decoded is a decompressing reader whose errors say whose fault they are.
type decoded struct {
	rc     io.ReadCloser
	src    *blobReader
	format string
}

func (d *decoded) Read(p []byte) (int, error) {
	n, err := d.rc.Read(p)
	return n, d.src.corrupt(d.format, err)
}

func (d *decoded) Close() error { return d.rc.Close() }

// unpackBudget bounds one layer's unpack. With a limit (a stream not verified yet) it
// counts the bytes decompressed, which bounds the entries and the file data the tar
// stream holds, and the bytes the files declare, which also counts the holes of
// sparse files that the unpack writes out in full; each may reach the limit. Without
// one, only the reserve is checked before each large file.
type unpackBudget struct {
	layer   remote.Layer
	limit   int64 // 0: none
	reserve diskspace.Reserve
	read    int64
	files   int64
	err     error // the limit's error, once exceeded
}

// reader counts what is read from the decompressed stream r.
func (b *unpackBudget) reader(r io.Reader) io.Reader {
	if b.limit <= 0 {
		return r
	}
	return &budgetReader{b: b, r: r}
}

// entry is the snapshot's entry check: file name is about to write size bytes.
func (b *unpackBudget) entry(name string, size int64) error {
	if b.limit > 0 {
		b.files += size
		if b.files > b.limit {
			return b.exceeded(fmt.Sprintf("its files declare %s so far (file %q: %s)", diskspace.Format(b.files), name, diskspace.Format(size)))
		}
	}
	// A file the size of a reserve check interval or more: what the guarded stream
	// would find only after writing it, or never for a sparse file.
	if size >= diskspace.CheckEvery {
		return b.reserve.Check(size, fmt.Sprintf("file %q", name))
	}
	return nil
}

// exceeded records and returns the error of a stream past the limit; what says which
// count went past it.
func (b *unpackBudget) exceeded(what string) error {
	b.err = fmt.Errorf("its stream inflated past the %s a layer may write before its blob is verified (%d times the %d bytes the manifest declares, at least %s): %s: %w",
		diskspace.Format(b.limit), unverifiedRatio, b.layer.Size, diskspace.Format(unverifiedFloor), what, errUnverifiedLimit)
	return b.err
}

type budgetReader struct {
	b *unpackBudget
	r io.Reader
}

func (br *budgetReader) Read(p []byte) (int, error) {
	// One byte past the limit tells that the stream goes on. left+1 could overflow.
	if left := br.b.limit - br.b.read; left < int64(len(p)) {
		p = p[:max(left, 0)+1]
	}
	n, err := br.r.Read(p)
	br.b.read += int64(n)
	if br.b.read > br.b.limit {
		return 0, br.b.exceeded("it decompresses to more")
	}
	return n, err
}
