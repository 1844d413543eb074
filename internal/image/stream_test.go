package image

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
)

// findFile looks for a file named name anywhere under root.
func findFile(root, name string) bool {
	found := false
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == name {
			found = true
			return filepath.SkipAll
		}
		return nil
	})
	return found
}

// TestPullUnpacksWhileDownloading stalls both layers of an image mid-download: the top
// layer's first file must be on disk before its blob is complete (the unpack reads
// the download as it arrives) and before the layer below it is committed (layers
// unpack at once); nothing is a snapshot yet. Released, the pull gives the whole rootfs.
func TestPullUnpacksWhileDownloading(t *testing.T) {
	f := newFixture(t)
	base := imagetest.NewLayer(t, imagetest.OCI, imagetest.Uncompressed, imagetest.RandomFile("base-big", 4<<20, 1))
	top := imagetest.NewLayer(t, imagetest.OCI, imagetest.Uncompressed,
		imagetest.File("top-first", "first"), imagetest.RandomFile("top-big", 4<<20, 2))
	img := imagetest.NewImage(t, imagetest.ImageOptions{}, base, top)
	stall := imagetest.NewStaller()
	host := imagetest.StartRegistry(t, imagetest.WithStalledBlobs(imagetest.Blobs(imagetest.Digest(t, base), imagetest.Digest(t, top)), 1<<20, stall))
	imagetest.Push(t, host, "stream:v1", img)

	type result struct {
		img *Image
		err error
	}
	done := make(chan result, 1)
	var pulling sync.WaitGroup
	pulling.Add(1)
	go func() {
		defer pulling.Done()
		got, err := f.svc.Pull(context.Background(), host+"/stream:v1", nil)
		done <- result{got, err}
	}()
	// On a failure too, the pull ends before the fixture's directories are removed.
	t.Cleanup(func() {
		stall.Release()
		pulling.Wait()
	})
	snapRoot := filepath.Join(f.root, "images", "snapshots")
	deadline := time.Now().Add(20 * time.Second)
	for !findFile(snapRoot, "top-first") {
		if time.Now().After(deadline) {
			t.Fatal("the top layer's first file was not unpacked while its blob downloaded")
		}
		select {
		case r := <-done:
			t.Fatalf("pull ended while the registry stalls: %v", r.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if f.svc.content.Has(imagetest.Digest(t, top)) {
		t.Error("the top layer's blob is complete already: the test proves nothing")
	}
	if snaps, _ := f.svc.snaps.List(); len(snaps) != 0 {
		t.Errorf("snapshots committed before their blobs were verified: %v", snaps)
	}
	stall.Release()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	tree := f.tree(r.img)
	if tree["base-big"] != "big" || tree["top-first"] != "first" || tree["top-big"] != "big" {
		t.Errorf("rootfs: %v", tree)
	}
	noUnpackLeft(t, f)
}

// TestConcurrentPullsShareLayers pulls, all at once, images that share lower layers
// and images that hold the same two blobs in opposite orders (different chains, so
// different snapshots, and a deadlock if a layer's download waited for another
// image's lower layer). Every blob is downloaded once, every chain unpacked once, and
// every rootfs is whole.
func TestConcurrentPullsShareLayers(t *testing.T) {
	layer := func(name string) *imagetest.Layer {
		return imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File(name, name), imagetest.RandomFile(name+"-big", 256<<10, uint64(len(name))))
	}
	base, mid, topA, topB, x, y := layer("base"), layer("mid"), layer("topA"), layer("topB"), layer("x"), layer("y")
	images := map[string]struct {
		layers []*imagetest.Layer
		files  []string
	}{
		"a":  {[]*imagetest.Layer{base, mid, topA}, []string{"base", "mid", "topA"}},
		"b":  {[]*imagetest.Layer{base, mid, topB}, []string{"base", "mid", "topB"}},
		"xy": {[]*imagetest.Layer{x, y}, []string{"x", "y"}},
		"yx": {[]*imagetest.Layer{y, x}, []string{"y", "x"}},
	}
	for round := range 5 {
		f := newFixture(t)
		var counter imagetest.BlobCounter
		host := imagetest.StartRegistry(t, imagetest.WithBlobCounter(&counter))
		for name, im := range images {
			var ls []v1.Layer
			for _, l := range im.layers {
				ls = append(ls, l)
			}
			imagetest.Push(t, host, name+":1", imagetest.NewImage(t, imagetest.ImageOptions{}, ls...))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var wg sync.WaitGroup
		var mu sync.Mutex
		got := map[string]*Image{}
		for name := range images {
			for range 3 { // kubelet's pattern: several pods of one cold image at once
				wg.Add(1)
				go func() {
					defer wg.Done()
					img, err := f.svc.Pull(ctx, host+"/"+name+":1", nil)
					if err != nil {
						t.Errorf("round %d: pull %s: %v", round, name, err)
						return
					}
					mu.Lock()
					got[name] = img
					mu.Unlock()
				}()
			}
		}
		wg.Wait()
		cancel()
		if t.Failed() {
			t.FailNow()
		}
		for d, n := range counter.Counts() {
			if n != 1 {
				t.Errorf("round %d: blob %s downloaded %d times", round, d, n)
			}
		}
		// a and b share base and base+mid; xy and yx share no chain: 3+1+2+2.
		if snaps, _ := f.svc.snaps.List(); len(snaps) != 8 {
			t.Errorf("round %d: %d snapshots, want 8", round, len(snaps))
		}
		for name, im := range images {
			tree := f.tree(got[name])
			for _, file := range im.files {
				if tree[file] != file || tree[file+"-big"] != "big" {
					t.Errorf("round %d: image %s: %s = %q, %s-big = %q", round, name, file, tree[file], file, tree[file+"-big"])
				}
			}
		}
		noUnpackLeft(t, f)
	}
}

// noUnpackLeft fails when an unpack left its temporary directory ("tmp-…", the
// snapshotter's) behind.
func noUnpackLeft(t *testing.T, f *fixture) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(f.root, "images", "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "tmp-") {
			t.Errorf("unpack directory left behind: %s", e.Name())
		}
	}
}
