package image

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/crisp-runtime/crisp/internal/image/diskspace"
	"github.com/crisp-runtime/crisp/internal/image/imagetest"
	"github.com/crisp-runtime/crisp/internal/store"
	"github.com/crisp-runtime/crisp/internal/testutil"
	"github.com/crisp-runtime/crisp/internal/testutil/fulldisk"
)

// newSmallFixture is a fixture whose images directory is a tmpfs of size bytes
// (unmounted when the test ends) with the given reserve; the database stays on disk.
func newSmallFixture(t *testing.T, size string, minFree int64) *fixture {
	t.Helper()
	testutil.RequiresRoot(t, rootWhy)
	root := t.TempDir()
	images := filepath.Join(root, "images")
	if err := os.Mkdir(images, 0o700); err != nil {
		t.Fatal(err)
	}
	fulldisk.Mount(t, images, "size="+size)
	db, err := store.Open(filepath.Join(root, "meta.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	svc, err := New(Config{Root: images, MinFreeBytes: minFree}, db, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, root: root, db: db, svc: svc}
}

// resize changes the size of the fixture's tmpfs, as an operator freeing space would.
func (f *fixture) resize(size string) {
	f.t.Helper()
	fulldisk.Resize(f.t, filepath.Join(f.root, "images"), size)
}

// assertNothingLeft fails if a failed pull left an image, a snapshot (recorded or a
// directory), a blob or an ingest file.
func (f *fixture) assertNothingLeft() {
	f.t.Helper()
	if imgs := f.svc.List(); len(imgs) != 0 {
		f.t.Errorf("images after a refused pull: %d", len(imgs))
	}
	if snaps, err := f.svc.snaps.List(); err != nil || len(snaps) != 0 {
		f.t.Errorf("snapshots after a refused pull: %v %v", snaps, err)
	}
	if blobs := f.blobs(); len(blobs) != 0 {
		f.t.Errorf("blobs after a refused pull: %v", blobs)
	}
	for _, dir := range []string{"snapshots", "content/ingest"} {
		entries, err := os.ReadDir(filepath.Join(f.root, "images", dir))
		if err != nil {
			f.t.Fatal(err)
		}
		for _, e := range entries {
			f.t.Errorf("left in %s: %s", dir, e.Name())
		}
	}
}

// TestPullRefusesLayerBeyondReserve: a layer whose small gzip unpacks to more than the
// image filesystem can hold above the reserve is refused while it unpacks, before the
// reserve is eaten into by more than one check interval, with ResourceExhausted naming
// the image and the space; nothing of the pull stays, and with more space the same
// pull succeeds.
func TestPullRefusesLayerBeyondReserve(t *testing.T) {
	const reserve = 32 << 20
	f := newSmallFixture(t, "96m", reserve)
	base := imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("etc/hello", "world"))
	bomb := imagetest.ZerosLayer(t, imagetest.OCI, "zeros", 256<<20)
	img := imagetest.NewImage(t, imagetest.ImageOptions{}, base, bomb)
	host := imagetest.StartRegistry(t)
	imagetest.Push(t, host, "bomb:v1", img)
	ref := host + "/bomb:v1"
	images := filepath.Join(f.root, "images")

	before, err := diskspace.Stat(images)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	low := fulldisk.LowestFree(images, stop)
	start := time.Now()
	_, err = f.svc.Pull(context.Background(), ref, nil)
	took := time.Since(start)
	close(stop)
	lowest := <-low
	if !errdefs.IsResourceExhausted(err) {
		t.Fatalf("pull of a %d byte layer unpacking to 256 MiB onto 96 MiB: err = %v, want ResourceExhausted", len(bomb.Blob()), err)
	}
	for _, want := range []string{ref, images, "free", "must keep 32 MiB", imagetest.Digest(t, bomb).String()} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %q: %v", want, err)
		}
	}
	written := before.Free - lowest
	t.Logf("refused after %v, %d MiB written (free %d MiB -> lowest %d MiB, reserve 32 MiB): %v",
		took, written>>20, before.Free>>20, lowest>>20, err)
	if lowest < reserve-diskspace.CheckEvery-(1<<20) {
		t.Errorf("free space went down to %d bytes, below the %d reserve by more than a check interval", lowest, reserve)
	}
	f.assertNothingLeft()

	f.resize("512m")
	got, err := f.svc.Pull(context.Background(), ref, nil)
	if err != nil {
		t.Fatalf("pull with room for the layer: %v", err)
	}
	if got.ID != imagetest.ConfigDigest(t, img).String() {
		t.Errorf("pulled %s", got.ID)
	}
	top, err := f.svc.snaps.Stat(got.TopChainID())
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(top.Dir, "zeros"))
	if err != nil || fi.Size() != 256<<20 {
		t.Errorf("unpacked zeros: %v %v", fi, err)
	}
}

// TestPullRefusedBeforeDownload: layers whose blobs alone would eat into the reserve
// are refused before a byte of them is downloaded.
func TestPullRefusedBeforeDownload(t *testing.T) {
	f := newSmallFixture(t, "64m", 48<<20)
	layer := imagetest.NewLayer(t, imagetest.OCI, imagetest.Uncompressed, imagetest.RandomFile("random", 24<<20, 3))
	img := imagetest.NewImage(t, imagetest.ImageOptions{}, layer)
	var counter imagetest.BlobCounter
	host := imagetest.StartRegistry(t, imagetest.WithBlobCounter(&counter))
	imagetest.Push(t, host, "big:v1", img)
	_, err := f.svc.Pull(context.Background(), host+"/big:v1", nil)
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "needs 24 MiB") {
		t.Fatalf("err = %v, want ResourceExhausted saying the layers need 24 MiB", err)
	}
	if n := counter.Gets(imagetest.Digest(t, layer)); n != 0 {
		t.Errorf("the layer was downloaded %d times", n)
	}
	f.assertNothingLeft()
}

// TestPullFullDisk: with no reserve, a filesystem that fills up during the download
// or during the unpack fails the pull with ResourceExhausted, leaves nothing of it, and
// once there is space the same pulls succeed.
func TestPullFullDisk(t *testing.T) {
	f := newSmallFixture(t, "16m", 0)
	host := imagetest.StartRegistry(t)
	base := imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("etc/hello", "world"))
	download := imagetest.NewImage(t, imagetest.ImageOptions{}, base,
		imagetest.NewLayer(t, imagetest.OCI, imagetest.Uncompressed, imagetest.RandomFile("random", 24<<20, 5)))
	unpack := imagetest.NewImage(t, imagetest.ImageOptions{}, base, imagetest.ZerosLayer(t, imagetest.OCI, "zeros", 32<<20))
	imagetest.Push(t, host, "download:v1", download)
	imagetest.Push(t, host, "unpack:v1", unpack)

	for _, name := range []string{"download:v1", "unpack:v1"} {
		start := time.Now()
		_, err := f.svc.Pull(context.Background(), host+"/"+name, nil)
		if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "is full") || !strings.Contains(err.Error(), host+"/"+name) {
			t.Fatalf("pull %s onto a 16 MiB filesystem: err = %v, want ResourceExhausted saying it is full", name, err)
		}
		t.Logf("pull %s failed after %v: %v", name, time.Since(start), err)
		f.assertNothingLeft()
	}
	f.resize("128m")
	for _, name := range []string{"download:v1", "unpack:v1"} {
		if _, err := f.svc.Pull(context.Background(), host+"/"+name, nil); err != nil {
			t.Fatalf("pull %s after space was freed: %v", name, err)
		}
	}
	if n := len(f.svc.List()); n != 2 {
		t.Errorf("%d images after the pulls", n)
	}
}

// TestPullReserveCountsSparseFiles: a verified layer holding a sparse file (a 2 KiB tar
// that unpacks to 256 MiB of zeros, written out in full) is refused before the file is
// written when it would eat into the reserve: the holes are not in the tar stream, so
// the check of the stream as it is read cannot see them.
func TestPullReserveCountsSparseFiles(t *testing.T) {
	const reserve = 32 << 20
	f := newSmallFixture(t, "96m", reserve)
	layer := imagetest.LayerFromTar(t, imagetest.OCI, imagetest.Gzip, sparseTar(t, "sparse", 256<<20))
	host := imagetest.StartRegistry(t)
	imagetest.Push(t, host, "sparse:v1", imagetest.NewImage(t, imagetest.ImageOptions{}, layer))
	images := filepath.Join(f.root, "images")
	stop := make(chan struct{})
	low := fulldisk.LowestFree(images, stop)
	_, err := f.svc.Pull(context.Background(), host+"/sparse:v1", nil)
	close(stop)
	lowest := <-low
	t.Logf("lowest free %d MiB: %v", lowest>>20, err)
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "must keep 32 MiB") || !strings.Contains(err.Error(), `file "sparse" needs 256 MiB`) {
		t.Fatalf("err = %v, want ResourceExhausted naming the file and the reserve", err)
	}
	if lowest < reserve-diskspace.CheckEvery {
		t.Errorf("free space went down to %d MiB, below the %d MiB reserve", lowest>>20, reserve>>20)
	}
	f.assertNothingLeft()
}
