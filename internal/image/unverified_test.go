package image

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"

	"github.com/crisp-runtime/crisp/internal/image/diskspace"
	"github.com/crisp-runtime/crisp/internal/image/imagetest"
	"github.com/crisp-runtime/crisp/internal/testutil/fulldisk"
)

// sparseTar returns a tar holding one PAX sparse file, name, of size bytes that are
// all a hole: about 2 KiB of tar that a tar reader expands to size zeros, which the
// unpack writes out in full. Go's tar writer cannot write sparse files, so the
// headers are made by hand.
func sparseTar(t *testing.T, name string, size int64) []byte {
	t.Helper()
	var recs bytes.Buffer
	for _, kv := range [][2]string{{"GNU.sparse.map", "0,0"}, {"GNU.sparse.numblocks", "1"}, {"GNU.sparse.size", strconv.FormatInt(size, 10)}} {
		rec := " " + kv[0] + "=" + kv[1] + "\n"
		n := len(rec)
		for n != len(strconv.Itoa(n))+len(rec) {
			n = len(strconv.Itoa(n)) + len(rec)
		}
		recs.WriteString(strconv.Itoa(n) + rec)
	}
	header := func(name string, typ byte, size int) []byte {
		b := make([]byte, 512)
		copy(b, name)
		copy(b[100:], "0000644\x00")
		copy(b[108:], "0000000\x00")
		copy(b[116:], "0000000\x00")
		copy(b[124:], fmt.Sprintf("%011o\x00", size))
		copy(b[136:], "00000000000\x00")
		b[156] = typ
		copy(b[257:], "ustar\x0000")
		copy(b[148:], "        ")
		sum := 0
		for _, c := range b {
			sum += int(c)
		}
		copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
		return b
	}
	var out bytes.Buffer
	out.Write(header("PaxHeaders/"+name, 'x', recs.Len()))
	out.Write(recs.Bytes())
	out.Write(make([]byte, 512-recs.Len()%512))
	out.Write(header(name, '0', 0))
	out.Write(make([]byte, 1024))
	return out.Bytes()
}

// used returns how much of the fixture's images filesystem is used beyond free0.
func (f *fixture) used(free0 int64) int64 {
	f.t.Helper()
	sp, err := diskspace.Stat(filepath.Join(f.root, "images"))
	if err != nil {
		f.t.Fatal(err)
	}
	return free0 - sp.Free
}

// assertLayerLeftNothing fails if a pull refused for layer left an image, a snapshot,
// an unpack directory, an ingest file or the layer's blob, or took more than a few KiB
// (its manifest and config, freed by the next image removal) of the filesystem.
func (f *fixture) assertLayerLeftNothing(layer digest.Digest, free0 int64) {
	f.t.Helper()
	if imgs := f.svc.List(); len(imgs) != 0 {
		f.t.Errorf("images after a refused pull: %d", len(imgs))
	}
	if snaps, err := f.svc.snaps.List(); err != nil || len(snaps) != 0 {
		f.t.Errorf("snapshots after a refused pull: %v %v", snaps, err)
	}
	if f.svc.content.Has(layer) {
		f.t.Errorf("the refused layer's blob is stored")
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
	if u := f.used(free0); u > 64<<10 {
		f.t.Errorf("%s of the filesystem still used after the refused pull", diskspace.Format(u))
	}
}

// logWatch is a slog handler that hands every record's message to a channel.
type logWatch chan string

func (w logWatch) Enabled(context.Context, slog.Level) bool { return true }
func (w logWatch) Handle(_ context.Context, r slog.Record) error {
	select {
	case w <- r.Message:
	default:
	}
	return nil
}
func (w logWatch) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w logWatch) WithGroup(string) slog.Handler      { return w }

// TestPullCapsUnverifiedUnpack serves layers that inflate far beyond what their
// declared compressed size lets an unverified stream write (200 MiB from a 200 KiB
// gzip of zeros, or from a 2 KiB tar of one sparse file; 64 MiB from a 64 KiB gzip of
// 64 files), as a man in the middle of a
// plain-HTTP mirror could. With a blob that fails its digest check at its last byte,
// the streamed unpack must stop at the cap, the pull fail with FailedPrecondition
// naming the layer, its declared size and the cap, and nothing remain. With a blob
// that is what the manifest names, held back before its last byte, the streamed
// unpack must stop at the cap too, and the layer is unpacked whole from the verified
// blob once it is complete, as containerd unpacks.
func TestPullCapsUnverifiedUnpack(t *testing.T) {
	const inflated = 200 << 20
	const slack = 2 << 20
	// Many files: the cap is reached part-way, with files of the layer written.
	var files []imagetest.TarEntry
	for i := range 64 {
		files = append(files, imagetest.File(fmt.Sprintf("f%02d", i), string(make([]byte, 1<<20))))
	}
	layers := map[string]*imagetest.Layer{
		"zeros":  imagetest.ZerosLayer(t, imagetest.OCI, "big", inflated),
		"sparse": imagetest.LayerFromTar(t, imagetest.OCI, imagetest.Gzip, sparseTar(t, "big", inflated)),
		"files":  imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, files...),
	}
	for _, name := range []string{"zeros", "sparse", "files"} {
		t.Run(name+"/digest-mismatch", func(t *testing.T) {
			layer := layers[name]
			size := int64(len(layer.Blob()))
			limit := unverifiedLimit(size)
			f := newSmallFixture(t, "512m", 0)
			host := imagetest.StartRegistry(t, imagetest.WithTamperedTails(imagetest.Blobs(imagetest.Digest(t, layer))))
			imagetest.Push(t, host, "bomb:v1", imagetest.NewImage(t, imagetest.ImageOptions{}, layer))
			images := filepath.Join(f.root, "images")
			before, err := diskspace.Stat(images)
			if err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			low := fulldisk.LowestFree(images, stop)
			start := time.Now()
			_, err = f.svc.Pull(context.Background(), host+"/bomb:v1", nil)
			took := time.Since(start)
			close(stop)
			peak := before.Free - <-low
			t.Logf("%d byte blob, cap %s: pull failed after %v, at most %s written: %v", size, diskspace.Format(limit), took, diskspace.Format(peak), err)
			if !errdefs.IsFailedPrecondition(err) {
				t.Errorf("err = %v, want FailedPrecondition", err)
			}
			for _, want := range []string{imagetest.Digest(t, layer).String(), fmt.Sprintf("%d bytes", size), diskspace.Format(limit)} {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("error does not say %q: %v", want, err)
				}
			}
			if peak > limit+slack {
				t.Errorf("the unverified layer took %s of the filesystem, more than its cap %s", diskspace.Format(peak), diskspace.Format(limit))
			}
			f.assertLayerLeftNothing(imagetest.Digest(t, layer), before.Free)
		})
	}

	t.Run("zeros/digest-matches", func(t *testing.T) {
		layer := layers["zeros"]
		size := int64(len(layer.Blob()))
		limit := unverifiedLimit(size)
		f := newSmallFixture(t, "512m", 0)
		stall := imagetest.NewStaller()
		host := imagetest.StartRegistry(t, imagetest.WithStalledBlobs(imagetest.Blobs(imagetest.Digest(t, layer)), int(size)-1, stall))
		img := imagetest.NewImage(t, imagetest.ImageOptions{}, layer)
		imagetest.Push(t, host, "bomb:v1", img)
		logs := make(logWatch, 64)
		f.svc.log = slog.New(logs)
		before, err := diskspace.Stat(filepath.Join(f.root, "images"))
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			img *Image
			err error
		}
		done := make(chan result, 1)
		go func() {
			got, err := f.svc.Pull(context.Background(), host+"/bomb:v1", nil)
			done <- result{got, err}
		}()
		t.Cleanup(func() {
			stall.Release()
			<-done
		})
		// All but the blob's last byte is there, unverified: the streamed unpack must
		// stop at the cap (and say so), not write the whole layer and wait.
		var peak int64
		deadline := time.Now().Add(30 * time.Second)
	wait:
		for {
			u := f.used(before.Free)
			peak = max(peak, u)
			if u > limit+slack {
				t.Fatalf("%s written from a blob not verified yet, more than its cap %s", diskspace.Format(u), diskspace.Format(limit))
			}
			select {
			case msg := <-logs:
				if strings.Contains(msg, "inflates past") {
					break wait
				}
			case <-time.After(time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("the streamed unpack neither stopped nor grew past its cap: %s written at most", diskspace.Format(peak))
			}
		}
		if u := f.used(before.Free); u > size+slack {
			t.Errorf("%s used once the streamed unpack stopped, want its blob's %d bytes and little more", diskspace.Format(u), size)
		}
		t.Logf("%d byte blob, cap %s: the streamed unpack stopped after %s", size, diskspace.Format(limit), diskspace.Format(peak))
		stall.Release()
		r := <-done
		done <- r
		if r.err != nil {
			t.Fatalf("pull of a verified layer: %v", r.err)
		}
		top, err := f.svc.snaps.Stat(r.img.TopChainID())
		if err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(filepath.Join(top.Dir, "big")); err != nil || fi.Size() != inflated {
			t.Errorf("unpacked file: %v %v", fi, err)
		}
		noUnpackLeft(t, f)
	})
}
