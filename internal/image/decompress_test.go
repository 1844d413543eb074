package image

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/crisp-runtime/crisp/internal/image/remote"
)

func TestDecompress(t *testing.T) {
	payload := bytes.Repeat([]byte("crisp layer "), 1000)
	var gz, zs bytes.Buffer
	gw := gzip.NewWriter(&gz)
	gw.Write(payload)
	gw.Close()
	zw, _ := zstd.NewWriter(&zs)
	zw.Write(payload)
	zw.Close()
	cases := map[string][]byte{"gzip": gz.Bytes(), "zstd": zs.Bytes(), "plain": payload, "empty": nil}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			r, err := decompress(bytes.NewReader(in))
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			got, err := io.ReadAll(r)
			if err != nil {
				t.Fatal(err)
			}
			want := payload
			if name == "empty" {
				want = nil
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("got %d bytes, want %d", len(got), len(want))
			}
		})
	}
	// Bad compressed data is the image's (InvalidArgument); a failing read of the blob
	// is not, even when the decoder sees it as the data ending early.
	diskErr := errors.New("input/output error")
	for _, tc := range []struct {
		name    string
		r       io.Reader
		invalid bool
	}{
		{"corrupt gzip header", bytes.NewReader([]byte{0x1f, 0x8b, 0, 0}), true},
		{"truncated gzip", bytes.NewReader(gz.Bytes()[:gz.Len()/2]), true},
		{"truncated zstd", bytes.NewReader(zs.Bytes()[:zs.Len()/2]), true},
		{"gzip blob read fails", io.MultiReader(bytes.NewReader(gz.Bytes()[:gz.Len()/2]), iotest.ErrReader(diskErr)), false},
		{"zstd blob read fails", io.MultiReader(bytes.NewReader(zs.Bytes()[:zs.Len()/2]), iotest.ErrReader(diskErr)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := decompress(tc.r)
			if err == nil {
				_, err = io.ReadAll(r)
			}
			if err == nil {
				t.Fatal("decoded without error")
			}
			if errdefs.IsInvalidArgument(err) != tc.invalid || !tc.invalid && !errors.Is(err, diskErr) {
				t.Errorf("error %v: InvalidArgument %v, want %v", err, errdefs.IsInvalidArgument(err), tc.invalid)
			}
		})
	}
}

// TestUnpackBudget: with a limit, the decompressed stream stops with
// errUnverifiedLimit once it goes past the limit, having passed no more than it (a
// zstd stream of zeros goes far beyond gzip's ratio), and so do files that declare more
// than it, sparse holes included; without a limit nothing is counted.
func TestUnpackBudget(t *testing.T) {
	var zs bytes.Buffer
	zw, _ := zstd.NewWriter(&zs)
	zw.Write(make([]byte, 64<<20))
	zw.Close()
	l := remote.Layer{Digest: digest.FromString("layer"), Size: int64(zs.Len())}
	const limit = 1 << 20
	b := &unpackBudget{layer: l, limit: limit}
	raw, err := decompress(bytes.NewReader(zs.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, b.reader(raw))
	t.Logf("%d byte zstd blob: %v", zs.Len(), err)
	if !errors.Is(err, errUnverifiedLimit) || n > limit {
		t.Errorf("read %d bytes of a %d limit, err %v: want at most the limit and errUnverifiedLimit", n, limit, err)
	}
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("the %d bytes the manifest declares", zs.Len())) || !strings.Contains(err.Error(), "1 MiB") {
		t.Errorf("error does not give the declared size and the limit: %v", err)
	}

	files := &unpackBudget{layer: l, limit: limit}
	if err := files.entry("a", limit/2); err != nil {
		t.Fatal(err)
	}
	if err := files.entry("b", limit/2+1); !errors.Is(err, errUnverifiedLimit) || !strings.Contains(err.Error(), `file "b"`) {
		t.Errorf("files past the limit: %v", err)
	}

	// A declared size near the int64 range (a lying manifest) must not overflow.
	huge := &unpackBudget{layer: l, limit: unverifiedLimit(math.MaxInt64 - 1)}
	raw, _ = decompress(bytes.NewReader(zs.Bytes()))
	if n, err := io.Copy(io.Discard, huge.reader(raw)); err != nil || n != 64<<20 {
		t.Errorf("with a limit near MaxInt64: read %d, %v", n, err)
	}

	verified := &unpackBudget{layer: l}
	raw, _ = decompress(bytes.NewReader(zs.Bytes()))
	if n, err := io.Copy(io.Discard, verified.reader(raw)); err != nil || n != 64<<20 {
		t.Errorf("without a limit: read %d, %v", n, err)
	}
	if err := verified.entry("huge", 1<<40); err != nil {
		t.Errorf("without a limit or reserve: %v", err)
	}
}

// zstdFrame returns a zstd frame whose header asks for a window of 1<<windowLog bytes
// and whose one raw block holds data: what a decoder must allocate up front, whatever
// the frame holds.
func zstdFrame(windowLog int, data []byte) []byte {
	frame := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, byte(windowLog-10) << 3}
	block := 1 | len(data)<<3 // last block, raw
	frame = append(frame, byte(block), byte(block>>8), byte(block>>16))
	return append(frame, data...)
}

// TestDecompressZstdWindow: a frame asking for a 512 MiB window (a 20 byte blob) is
// refused as a fault of the layer before the decoder allocates it, since the window is
// allocated whole before a byte is decoded, whether or not the blob is verified yet; a
// 128 MiB window, the most zstd itself decodes by default, is decoded.
func TestDecompressZstdWindow(t *testing.T) {
	for _, tc := range []struct {
		windowLog int
		ok        bool
	}{{29, false}, {27, true}} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		r, err := decompress(bytes.NewReader(zstdFrame(tc.windowLog, []byte("hello"))))
		var got []byte
		if err == nil {
			got, err = io.ReadAll(r)
			r.Close()
		}
		runtime.ReadMemStats(&after)
		alloc := after.TotalAlloc - before.TotalAlloc
		t.Logf("window 1<<%d: %q, %v; %d MiB allocated", tc.windowLog, got, err, alloc>>20)
		if tc.ok {
			if err != nil || string(got) != "hello" {
				t.Errorf("window 1<<%d: %q, %v", tc.windowLog, got, err)
			}
			continue
		}
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "window") {
			t.Errorf("window 1<<%d: err = %v, want InvalidArgument naming the window", tc.windowLog, err)
		}
		if alloc > 64<<20 {
			t.Errorf("window 1<<%d: %d MiB allocated to refuse it", tc.windowLog, alloc>>20)
		}
	}
}
