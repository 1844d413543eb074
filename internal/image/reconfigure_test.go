package image

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
	"github.com/crisp-runtime/crisp/internal/image/remote"
)

// TestReconfigurePinned: the pinned set Reconfigure is given is what Pinned reports
// from then on, by tag, by short name and by ID; an image no longer listed is no
// longer pinned.
func TestReconfigurePinned(t *testing.T) {
	f := newFixture(t)
	host := imagetest.StartRegistry(t)
	img := imagetest.NewImage(t, imagetest.ImageOptions{}, imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("a", "1")))
	imagetest.Push(t, host, "app:1", img)
	pulled, err := f.svc.Pull(context.Background(), host+"/app:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.svc.Pinned(pulled) {
		t.Fatal("pinned before any pinned list")
	}
	// kubelet lists images while a reload swaps the set (go test -race sees a swap
	// that is not under the lock Pinned reads with).
	stop := make(chan struct{})
	listed := make(chan struct{})
	go func() {
		defer close(listed)
		for {
			select {
			case <-stop:
				return
			default:
				f.svc.Pinned(pulled)
			}
		}
	}()
	defer func() { close(stop); <-listed }()
	for _, tc := range []struct {
		pinned []string
		want   bool
	}{
		{[]string{host + "/app:1"}, true},
		{[]string{host + "/other:1"}, false},
		{[]string{pulled.ID}, true},
		{nil, false},
	} {
		f.svc.Reconfigure(remote.Config{}, tc.pinned)
		if got := f.svc.Pinned(pulled); got != tc.want {
			t.Errorf("pinned %q: Pinned = %v, want %v", tc.pinned, got, tc.want)
		}
	}
}

// TestReconfigureMirrors: a pull that starts after Reconfigure goes through the new
// mirror; a pull already under way finishes where it started.
func TestReconfigureMirrors(t *testing.T) {
	f := newFixture(t)
	// Once armed, the next manifest GET to the origin waits until the test lets it go.
	var armed atomic.Bool
	arrived, release := make(chan struct{}), make(chan struct{})
	stall := imagetest.WithMiddleware(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/manifests/") && armed.CompareAndSwap(true, false) {
				close(arrived)
				<-release
			}
			next.ServeHTTP(w, r)
		})
	})
	origin := imagetest.StartRegistry(t, stall)
	mirror := imagetest.StartRegistry(t)
	fromOrigin := imagetest.NewImage(t, imagetest.ImageOptions{Config: v1.Config{Env: []string{"FROM=origin"}}},
		imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("from", "origin")))
	fromMirror := imagetest.NewImage(t, imagetest.ImageOptions{Config: v1.Config{Env: []string{"FROM=mirror"}}},
		imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("from", "mirror")))
	imagetest.Push(t, origin, "app:1", fromOrigin)
	imagetest.Push(t, mirror, "app:1", fromMirror)
	ref := origin + "/app:1"

	armed.Store(true)
	type result struct {
		img *Image
		err error
	}
	first := make(chan result, 1)
	go func() {
		img, err := f.svc.Pull(context.Background(), ref, nil)
		first <- result{img, err}
	}()
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the pull never asked the origin for the manifest")
	}
	f.svc.Reconfigure(remote.Config{Mirrors: map[string][]string{origin: {"http://" + mirror}}}, nil)
	close(release)
	r := <-first
	if r.err != nil {
		t.Fatalf("pull under way: %v", r.err)
	}
	if want := imagetest.ConfigDigest(t, fromOrigin).String(); r.img.ID != want {
		t.Errorf("pull under way got %s, want the origin's %s: it changed settings half-way", r.img.ID, want)
	}

	img, err := f.svc.Pull(context.Background(), ref, nil)
	if err != nil {
		t.Fatalf("pull after Reconfigure: %v", err)
	}
	if want := imagetest.ConfigDigest(t, fromMirror).String(); img.ID != want {
		t.Errorf("pull after Reconfigure got %s, want the mirror's %s", img.ID, want)
	}
}
