package imagetest

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	digest "github.com/opencontainers/go-digest"
)

func readTar(t *testing.T, b []byte) []*tar.Header {
	t.Helper()
	var out []*tar.Header
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h)
	}
}

func TestTarEntries(t *testing.T) {
	hdrs := readTar(t, Tar(t,
		Dir("/etc"), File("etc/a", "x"), Executable("bin/tool", []byte("#!")), Symlink("etc/l", "a"),
		Hardlink("etc/h", "/etc/a"), Whiteout("etc/gone"), Opaque("var/lib"),
		TarEntry{Type: TypeFile, Name: "owned", Mode: 0o600, UID: 1000, GID: 1000},
	))
	want := []struct {
		name, link string
		typ        byte
		mode       int64
	}{
		{"etc/", "", tar.TypeDir, 0o755},
		{"etc/a", "", tar.TypeReg, 0o644},
		{"bin/tool", "", tar.TypeReg, 0o755},
		{"etc/l", "a", tar.TypeSymlink, 0o777},
		{"etc/h", "etc/a", tar.TypeLink, 0},
		{"etc/.wh.gone", "", tar.TypeReg, 0o644},
		{"var/lib/.wh..wh..opq", "", tar.TypeReg, 0o644},
		{"owned", "", tar.TypeReg, 0o600},
	}
	if len(hdrs) != len(want) {
		t.Fatalf("%d entries, want %d", len(hdrs), len(want))
	}
	for i, w := range want {
		h := hdrs[i]
		if h.Name != w.name || h.Linkname != w.link || h.Typeflag != w.typ || h.Mode != w.mode {
			t.Errorf("entry %d = %q %q type %c mode %o; want %+v", i, h.Name, h.Linkname, h.Typeflag, h.Mode, w)
		}
	}
	if hdrs[7].Uid != 1000 || hdrs[7].Gid != 1000 {
		t.Errorf("owner %d:%d, want 1000:1000", hdrs[7].Uid, hdrs[7].Gid)
	}
}

func TestLayerCompressions(t *testing.T) {
	entries := []TarEntry{File("a", "hello"), RandomFile("r", 100<<10, 1)}
	if !bytes.Equal(RandomFile("r", 64, 9).Body, RandomFile("r", 64, 9).Body) ||
		bytes.Equal(RandomFile("r", 64, 9).Body, RandomFile("r", 64, 10).Body) {
		t.Fatal("RandomFile is not a function of its seed")
	}
	for _, c := range []Compression{Gzip, Zstd, Uncompressed} {
		for _, f := range []Format{OCI, Docker} {
			l := NewLayer(t, f, c, entries...)
			var r io.Reader = bytes.NewReader(l.Blob())
			switch c {
			case Gzip:
				zr, err := gzip.NewReader(r)
				if err != nil {
					t.Fatal(err)
				}
				r = zr
			case Zstd:
				zr, err := zstd.NewReader(r)
				if err != nil {
					t.Fatal(err)
				}
				defer zr.Close()
				r = zr
			}
			plain, err := io.ReadAll(r)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(plain, l.TarBytes()) {
				t.Fatalf("compression %d: blob does not decompress to the tar", c)
			}
			sum := sha256.Sum256(plain)
			diffID, _ := l.DiffID()
			if diffID.Hex != hex.EncodeToString(sum[:]) {
				t.Errorf("compression %d: wrong diff ID", c)
			}
			if Digest(t, l) != digest.FromBytes(l.Blob()) {
				t.Errorf("compression %d: wrong digest", c)
			}
			if mt, _ := l.MediaType(); mt != LayerMediaType(f, c) {
				t.Errorf("media type %s, want %s", mt, LayerMediaType(f, c))
			}
		}
	}
}

func TestBusybox(t *testing.T) {
	var sh, bin bool
	for _, e := range BusyboxEntries(t) {
		switch {
		case e.Name == "bin/sh" && e.Type == TypeSymlink && e.Link == "busybox":
			sh = true
		case e.Name == "bin/busybox" && e.Mode == 0o755 && len(e.Body) > 500<<10:
			bin = true
		}
	}
	if !sh || !bin {
		t.Fatalf("busybox entries: /bin/sh -> busybox %v, /bin/busybox %v", sh, bin)
	}
}

func TestRegistryRoundTrip(t *testing.T) {
	counter := &BlobCounter{}
	host := StartRegistry(t, WithBlobCounter(counter))
	idx, amd64, _ := MultiPlatformIndex(t, OCI)
	d := Push(t, host, "x/y:1", idx)
	ref, err := name.ParseReference(host+"/x/y@"+d.String(), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref) // resolves linux/amd64 from the index
	if err != nil {
		t.Fatal(err)
	}
	if Digest(t, img) != Digest(t, amd64) {
		t.Fatalf("registry gave %s for linux/amd64, want %s", Digest(t, img), Digest(t, amd64))
	}
	ls, _ := img.Layers()
	rc, err := ls[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, rc); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if counter.Gets(LayerDigests(t, amd64)[0]) != 1 || counter.Requests() == 0 {
		t.Errorf("counter: %v, %d requests", counter.Counts(), counter.Requests())
	}
}

func TestRegistryBasicAuth(t *testing.T) {
	host := StartRegistry(t, WithBasicAuth("u", "p"))
	resp, err := http.Get("http://" + host + "/v2/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
		t.Fatalf("unauthenticated ping: %s, challenge %q", resp.Status, resp.Header.Get("WWW-Authenticate"))
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+host+"/v2/", nil)
	req.SetBasicAuth("u", "p")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("authenticated ping: %s", resp.Status)
	}
}

// TestZerosLayer: the blob is about a thousandth of what it unpacks to, and the tar
// stream it regenerates is the one its diff ID and blob describe.
func TestZerosLayer(t *testing.T) {
	const size = 64 << 20
	start := time.Now()
	l := ZerosLayer(t, OCI, "big", size)
	t.Logf("%d MiB of zeros: %d byte gzip blob in %v", size>>20, len(l.Blob()), time.Since(start))
	if len(l.Blob()) > size/500 {
		t.Errorf("blob is %d bytes for %d of zeros", len(l.Blob()), size)
	}
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	h := sha256.New()
	tee := io.TeeReader(rc, h)
	tr := tar.NewReader(tee)
	hdr, err := tr.Next()
	if err != nil || hdr.Name != "big" || hdr.Size != size {
		t.Fatalf("first entry %+v, %v", hdr, err)
	}
	if _, err := io.Copy(io.Discard, tr); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, tee); err != nil { // the end-of-archive blocks
		t.Fatal(err)
	}
	if diffID, _ := l.DiffID(); diffID.Hex != hex.EncodeToString(h.Sum(nil)) {
		t.Errorf("regenerated tar does not hash to the diff ID")
	}
	zr, err := gzip.NewReader(bytes.NewReader(l.Blob()))
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, zr)
	if err != nil || n < size {
		t.Fatalf("blob decompresses to %d bytes, %v", n, err)
	}
}
