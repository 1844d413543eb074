package content

import (
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
)

func openStore(t *testing.T) *Store {
	t.Helper()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// ingestEmpty fails the test if any partial write is left behind.
func ingestEmpty(t *testing.T, s *Store) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(s.Root(), "ingest"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("ingest file left behind: %s", e.Name())
	}
}

func blobCount(t *testing.T, s *Store) int {
	t.Helper()
	n := 0
	if err := s.Walk(func(digest.Digest, int64) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestWriteReadRoundTrip(t *testing.T) {
	s := openStore(t)
	data := []byte("hello, content store")
	d := digest.FromBytes(data)
	if s.Has(d) {
		t.Fatal("empty store has a blob")
	}
	if err := s.Write(context.Background(), d, int64(len(data)), bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if !s.Has(d) {
		t.Fatal("blob missing after Write")
	}
	size, err := s.Info(d)
	if err != nil || size != int64(len(data)) {
		t.Fatalf("Info = %d, %v; want %d", size, err, len(data))
	}
	rc, err := s.Open(d)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := rc.Seek(7, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(rc)
	if string(rest) != "content store" {
		t.Fatalf("read after seek = %q", rest)
	}
	got, err := s.ReadAll(d, 1024)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadAll = %q, %v", got, err)
	}
	fi, err := os.Stat(filepath.Join(s.Root(), "blobs", "sha256", d.Encoded()))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o444 {
		t.Errorf("blob mode %v, want read-only", fi.Mode().Perm())
	}
	ingestEmpty(t, s)
}

func TestWriteUnknownSizeAndSHA512(t *testing.T) {
	s := openStore(t)
	data := bytes.Repeat([]byte("x"), 3<<20) // more than one copy buffer
	d := digest.FromBytes(data)
	if err := s.Write(context.Background(), d, -1, iotest.HalfReader(bytes.NewReader(data))); err != nil {
		t.Fatal(err)
	}
	sum := sha512.Sum512(data)
	d512 := digest.NewDigestFromEncoded(digest.SHA512, hex.EncodeToString(sum[:]))
	if err := s.Write(context.Background(), d512, int64(len(data)), bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if !s.Has(d) || !s.Has(d512) {
		t.Fatal("blobs missing")
	}
	if n := blobCount(t, s); n != 2 {
		t.Fatalf("Walk saw %d blobs, want 2", n)
	}
}

func TestWriteVerifies(t *testing.T) {
	data := []byte("the real content")
	d := digest.FromBytes(data)
	for _, tc := range []struct {
		name    string
		size    int64
		r       func() io.Reader // a fresh one for each way of writing
		wantMsg string
	}{
		{"digest mismatch", int64(len(data)), func() io.Reader { return strings.NewReader("the fake content") }, "digest mismatch"},
		{"digest mismatch unknown size", -1, func() io.Reader { return strings.NewReader("other") }, "digest mismatch"},
		{"short read", int64(len(data)), func() io.Reader { return bytes.NewReader(data[:5]) }, "truncated: got 5 of 16 bytes"},
		{"long read", 4, func() io.Reader { return bytes.NewReader(data) }, "too long"},
		{"read error", int64(len(data)), func() io.Reader {
			return io.MultiReader(bytes.NewReader(data[:3]), iotest.ErrReader(io.ErrUnexpectedEOF))
		}, "read failed after 3 of 16 bytes"},
	} {
		// The unsynced write verifies exactly as the synced one.
		for _, w := range []struct {
			name  string
			write func(*Store, io.Reader) error
		}{
			{"synced", func(s *Store, r io.Reader) error { return s.Write(context.Background(), d, tc.size, r) }},
			{"unsynced", func(s *Store, r io.Reader) error { return s.WriteUnsynced(context.Background(), d, tc.size, r) }},
		} {
			t.Run(tc.name+"/"+w.name, func(t *testing.T) {
				s := openStore(t)
				err := w.write(s, tc.r())
				if err == nil {
					t.Fatal("Write accepted bad content")
				}
				if !strings.Contains(err.Error(), tc.wantMsg) || !strings.Contains(err.Error(), d.String()) {
					t.Errorf("error %q does not name the digest and %q", err, tc.wantMsg)
				}
				if s.Has(d) || blobCount(t, s) != 0 {
					t.Error("bad content became a blob")
				}
				ingestEmpty(t, s)
			})
		}
	}
}

// TestWriteUnsyncedThenSync: an unsynced blob is stored and readable like any other,
// and Sync succeeds on the store's filesystem.
func TestWriteUnsyncedThenSync(t *testing.T) {
	s := openStore(t)
	data := []byte("layer bytes")
	d := digest.FromBytes(data)
	if err := s.WriteUnsynced(context.Background(), d, int64(len(data)), bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	got, err := s.ReadAll(d, 100)
	if err != nil || string(got) != string(data) {
		t.Fatalf("ReadAll = %q, %v", got, err)
	}
	ingestEmpty(t, s)
}

func TestWriteExistingIsNoop(t *testing.T) {
	s := openStore(t)
	data := []byte("once")
	d := digest.FromBytes(data)
	if err := s.Write(context.Background(), d, 4, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	// A reader that fails if touched proves the second write consumes nothing.
	if err := s.Write(context.Background(), d, 4, iotest.ErrReader(errors.New("read called"))); err != nil {
		t.Fatalf("second Write: %v", err)
	}
	if err := s.Write(context.Background(), d, 5, iotest.ErrReader(errors.New("read called"))); err == nil {
		t.Fatal("Write with a size contradicting the stored blob succeeded")
	}
}

func TestWriteCancelled(t *testing.T) {
	s := openStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	data := bytes.Repeat([]byte("y"), 4<<20)
	d := digest.FromBytes(data)
	pr, pw := io.Pipe()
	go func() {
		pw.Write(data[:1<<20])
		cancel()
		pw.Write(data[1<<20:])
		pw.Close()
	}()
	err := s.Write(ctx, d, int64(len(data)), pr)
	pr.Close()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Write after cancel = %v, want context.Canceled", err)
	}
	if s.Has(d) {
		t.Fatal("cancelled write became a blob")
	}
	ingestEmpty(t, s)
}

func TestMaliciousDigestsRefused(t *testing.T) {
	s := openStore(t)
	outside := filepath.Join(filepath.Dir(s.Root()), "escaped")
	for _, bad := range []digest.Digest{
		"",
		"sha256:",
		"sha256:../../../escaped",
		"sha256:../../" + digest.Digest(strings.Repeat("a", 58)),
		"sha256/../../x:" + digest.Digest(strings.Repeat("a", 64)),
		"../sha256:" + digest.Digest(strings.Repeat("a", 64)),
		"sha256:" + digest.Digest(strings.Repeat("A", 64)), // uppercase hex is not canonical
		"sha256:" + digest.Digest(strings.Repeat("a", 63)),
		"sha256:" + digest.Digest(strings.Repeat("a", 63)) + "/",
		"md5:d41d8cd98f00b204e9800998ecf8427e",
		"sha384:" + digest.Digest(strings.Repeat("a", 96)), // valid go-digest, but not accepted here
	} {
		err := s.Write(context.Background(), bad, 1, strings.NewReader("x"))
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("Write(%q) = %v, want InvalidArgument", bad, err)
		}
		if _, err := s.Open(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Open(%q) = %v, want InvalidArgument", bad, err)
		}
		if err := s.Delete(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Delete(%q) = %v, want InvalidArgument", bad, err)
		}
		if s.Has(bad) {
			t.Errorf("Has(%q) = true", bad)
		}
	}
	if _, err := os.Stat(outside); err == nil {
		t.Fatal("a file was written outside the store")
	}
	ingestEmpty(t, s)
}

func TestDeleteAndNotFound(t *testing.T) {
	s := openStore(t)
	data := []byte("delete me")
	d := digest.FromBytes(data)
	if err := s.Write(context.Background(), d, -1, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(d); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(d); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	if _, err := s.Info(d); !errdefs.IsNotFound(err) {
		t.Fatalf("Info after delete = %v, want NotFound", err)
	}
	if _, err := s.Open(d); !errdefs.IsNotFound(err) {
		t.Fatalf("Open after delete = %v, want NotFound", err)
	}
	if _, err := s.ReadAll(d, 10); !errdefs.IsNotFound(err) {
		t.Fatalf("ReadAll after delete = %v, want NotFound", err)
	}
}

func TestReadAllBounded(t *testing.T) {
	s := openStore(t)
	data := bytes.Repeat([]byte("z"), 100)
	d := digest.FromBytes(data)
	if err := s.Write(context.Background(), d, 100, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadAll(d, 99); !errdefs.IsOutOfRange(err) {
		t.Fatalf("ReadAll over the limit = %v, want OutOfRange", err)
	}
	if b, err := s.ReadAll(d, 100); err != nil || len(b) != 100 {
		t.Fatalf("ReadAll at the limit = %d bytes, %v", len(b), err)
	}
}

func TestWalkAndUsage(t *testing.T) {
	s := openStore(t)
	want := map[digest.Digest]int64{}
	for i := range 5 {
		data := bytes.Repeat([]byte{byte('a' + i)}, 10000*(i+1))
		d := digest.FromBytes(data)
		want[d] = int64(len(data))
		if err := s.Write(context.Background(), d, -1, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
	}
	// Junk in the blob directory is not a blob.
	if err := os.WriteFile(filepath.Join(s.Root(), "blobs", "sha256", "not-a-digest"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := map[digest.Digest]int64{}
	var prev digest.Digest
	err := s.Walk(func(d digest.Digest, size int64) error {
		if prev != "" && d < prev {
			t.Errorf("Walk out of order: %s after %s", d, prev)
		}
		prev = d
		got[d] = size
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("Walk saw %d blobs, want %d", len(got), len(want))
	}
	for d, size := range want {
		if got[d] != size {
			t.Errorf("Walk: %s size %d, want %d", d, got[d], size)
		}
	}
	stop := errors.New("stop")
	if err := s.Walk(func(digest.Digest, int64) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("Walk did not return fn's error: %v", err)
	}

	bytesUsed, inodes, err := s.Usage()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, size := range want {
		total += size
	}
	// root, blobs, blobs/sha256, ingest, five blobs and the junk file.
	if inodes != 10 {
		t.Errorf("Usage inodes = %d, want 10", inodes)
	}
	if bytesUsed < total {
		t.Errorf("Usage bytes = %d, less than the %d bytes stored", bytesUsed, total)
	}
}

func TestOpenRemovesStaleIngest(t *testing.T) {
	root := t.TempDir()
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(root, "ingest", "0123456789abcdef-12345")
	if err := os.WriteFile(stale, []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	data := []byte("kept")
	d := digest.FromBytes(data)
	if err := s.Write(context.Background(), d, 4, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); err == nil {
		t.Fatal("stale ingest file survived Open")
	}
	if !s2.Has(d) {
		t.Fatal("reopened store lost a blob")
	}
}
