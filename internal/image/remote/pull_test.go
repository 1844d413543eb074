package remote

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	ggcrremote "github.com/google/go-containerregistry/pkg/v1/remote"
	digest "github.com/opencontainers/go-digest"

	"github.com/crisp-runtime/crisp/internal/image/content"
	"github.com/crisp-runtime/crisp/internal/image/imagetest"
)

func newPuller(t testing.TB, cfg Config) (*Puller, *content.Store) {
	t.Helper()
	cs, err := content.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	return New(cfg, cs, log), cs
}

// storedBlobs returns every blob in cs after checking that each one really has the
// digest it is stored under: the store must hold nothing that was not verified.
func storedBlobs(t testing.TB, cs *content.Store) map[digest.Digest]bool {
	t.Helper()
	out := map[digest.Digest]bool{}
	err := cs.Walk(func(d digest.Digest, _ int64) error {
		rc, err := cs.Open(d)
		if err != nil {
			return err
		}
		defer rc.Close()
		v := d.Algorithm().Digester()
		if _, err := io.Copy(v.Hash(), rc); err != nil {
			return err
		}
		if v.Digest() != d {
			t.Errorf("blob %s holds content hashing to %s", d, v.Digest())
		}
		out[d] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func noIngest(t testing.TB, cs *content.Store) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(cs.Root(), "ingest"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("ingest file left behind: %s", e.Name())
	}
}

// checkPulled checks that got describes img and that the store holds exactly
// img's manifest, config and layers (plus extra, e.g. an index), byte for byte.
func checkPulled(t testing.TB, cs *content.Store, got *Image, img v1.Image, extra ...digest.Digest) {
	t.Helper()
	if got.ManifestDigest != imagetest.Digest(t, img) {
		t.Errorf("ManifestDigest = %s, want %s", got.ManifestDigest, imagetest.Digest(t, img))
	}
	if got.ConfigDigest != imagetest.ConfigDigest(t, img) {
		t.Errorf("ConfigDigest = %s, want %s", got.ConfigDigest, imagetest.ConfigDigest(t, img))
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Layers) != len(layers) {
		t.Fatalf("got %d layers, want %d", len(got.Layers), len(layers))
	}
	want := map[digest.Digest]bool{got.ManifestDigest: true, got.ConfigDigest: true}
	for _, d := range extra {
		want[d] = true
	}
	for i, l := range layers {
		gl := got.Layers[i]
		diffID, _ := l.DiffID()
		mt, _ := l.MediaType()
		size, _ := l.Size()
		if gl.Digest != imagetest.Digest(t, l) || gl.DiffID != digest.Digest(diffID.String()) || gl.MediaType != string(mt) || gl.Size != size {
			t.Errorf("layer %d = %+v, want digest %s diffID %s media type %s size %d", i, gl, imagetest.Digest(t, l), diffID, mt, size)
		}
		want[gl.Digest] = true
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		wantBytes, _ := io.ReadAll(rc)
		gotBytes, err := cs.ReadAll(gl.Digest, 1<<30)
		if err != nil {
			t.Fatalf("layer %d not in the store: %v", i, err)
		}
		if !bytes.Equal(gotBytes, wantBytes) {
			t.Errorf("layer %d: stored bytes differ from the pushed blob", i)
		}
	}
	stored := storedBlobs(t, cs)
	for d := range want {
		if !stored[d] {
			t.Errorf("blob %s missing from the store", d)
		}
	}
	for d := range stored {
		if !want[d] {
			t.Errorf("unexpected blob %s in the store", d)
		}
	}
	noIngest(t, cs)
}

// twoLayerEntries exercises every kind of tar entry.
func twoLayerEntries() [][]imagetest.TarEntry {
	return [][]imagetest.TarEntry{
		{
			imagetest.Dir("etc"), imagetest.File("etc/hostname", "base\n"), imagetest.Dir("usr/share/doc"),
			imagetest.File("usr/share/doc/a", "a"), imagetest.Symlink("etc/link", "hostname"),
			imagetest.Hardlink("etc/hard", "etc/hostname"),
		},
		{
			imagetest.File("etc/hostname", "top\n"), imagetest.Whiteout("etc/link"), imagetest.Opaque("usr/share/doc"),
			imagetest.File("usr/share/doc/b", "b"),
		},
	}
}

func TestPullSinglePlatform(t *testing.T) {
	host := imagetest.StartRegistry(t)
	for _, f := range []struct {
		name string
		f    imagetest.Format
	}{{"oci", imagetest.OCI}, {"docker", imagetest.Docker}} {
		for _, c := range []struct {
			name string
			c    imagetest.Compression
		}{{"gzip", imagetest.Gzip}, {"zstd", imagetest.Zstd}, {"uncompressed", imagetest.Uncompressed}} {
			t.Run(f.name+"-"+c.name, func(t *testing.T) {
				var layers []v1.Layer
				for _, entries := range twoLayerEntries() {
					layers = append(layers, imagetest.NewLayer(t, f.f, c.c, entries...))
				}
				img := imagetest.NewImage(t, imagetest.ImageOptions{Format: f.f}, layers...)
				repo := "single/" + f.name + "-" + c.name
				imagetest.Push(t, host, repo+":v1", img)

				p, cs := newPuller(t, Config{})
				got, err := p.Pull(context.Background(), host+"/"+repo+":v1", nil)
				if err != nil {
					t.Fatal(err)
				}
				if got.Name != host+"/"+repo+":v1" || got.IndexDigest != "" ||
					got.RepoDigest != host+"/"+repo+"@"+imagetest.Digest(t, img).String() {
					t.Errorf("got Name %q IndexDigest %q RepoDigest %q", got.Name, got.IndexDigest, got.RepoDigest)
				}
				checkPulled(t, cs, got, img)
				if want := string(imagetest.LayerMediaType(f.f, c.c)); got.Layers[0].MediaType != want {
					t.Errorf("media type %s, want %s", got.Layers[0].MediaType, want)
				}
			})
		}
	}
}

// Downloaded counts what a pull transferred: everything the first time, nothing when
// every blob is in the store already.
func TestPullCountsDownloadedBytes(t *testing.T) {
	host := imagetest.StartRegistry(t)
	var layers []v1.Layer
	for _, entries := range twoLayerEntries() {
		layers = append(layers, imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, entries...))
	}
	img := imagetest.NewImage(t, imagetest.ImageOptions{}, layers...)
	imagetest.Push(t, host, "counted:v1", img)
	p, _ := newPuller(t, Config{})
	first, err := p.Pull(context.Background(), host+"/counted:v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	var blobs int64
	for _, l := range first.Layers {
		blobs += l.Size
	}
	if first.Downloaded < blobs {
		t.Errorf("first pull downloaded %d bytes, less than its layers' %d", first.Downloaded, blobs)
	}
	again, err := p.Pull(context.Background(), host+"/counted:v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.Downloaded >= first.Downloaded {
		t.Errorf("second pull downloaded %d bytes, want fewer than the first's %d (blobs are stored)", again.Downloaded, first.Downloaded)
	}
}

func TestPullBusybox(t *testing.T) {
	host := imagetest.StartRegistry(t)
	img := imagetest.BusyboxImage(t, imagetest.OCI, imagetest.Gzip)
	imagetest.Push(t, host, "library/busybox:1.36", img)
	p, cs := newPuller(t, Config{})
	got, err := p.Pull(context.Background(), host+"/library/busybox:1.36", nil)
	if err != nil {
		t.Fatal(err)
	}
	checkPulled(t, cs, got, img)
	if got.Layers[0].Size < 500<<10 {
		t.Errorf("busybox layer is only %d bytes", got.Layers[0].Size)
	}
	// A second pull downloads nothing and returns the same.
	again, err := p.Pull(context.Background(), host+"/library/busybox:1.36", nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.Downloaded != 0 {
		t.Errorf("second pull downloaded %d bytes, want 0", again.Downloaded)
	}
	again.Downloaded = got.Downloaded
	if fmt.Sprint(again) != fmt.Sprint(got) {
		t.Errorf("second pull = %+v, want %+v", again, got)
	}
}

func TestPullMultiPlatform(t *testing.T) {
	host := imagetest.StartRegistry(t)
	for _, f := range []struct {
		name string
		f    imagetest.Format
	}{{"oci", imagetest.OCI}, {"docker", imagetest.Docker}} {
		t.Run(f.name, func(t *testing.T) {
			idx, amd64, arm64 := imagetest.MultiPlatformIndex(t, f.f)
			repo := "multi/" + f.name
			idxDigest := imagetest.Push(t, host, repo+":latest", idx)

			p, cs := newPuller(t, Config{Platform: "linux/amd64"})
			got, err := p.Pull(context.Background(), host+"/"+repo, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got.IndexDigest != idxDigest || got.RepoDigest != host+"/"+repo+"@"+idxDigest.String() {
				t.Errorf("IndexDigest %s RepoDigest %s, want the index %s", got.IndexDigest, got.RepoDigest, idxDigest)
			}
			checkPulled(t, cs, got, amd64, idxDigest)
			if got.Layers[0].Digest == imagetest.LayerDigests(t, arm64)[0] {
				t.Fatal("amd64 and arm64 layers are the same: the test proves nothing")
			}

			p, cs = newPuller(t, Config{Platform: "linux/arm64/v8"})
			got, err = p.Pull(context.Background(), host+"/"+repo, nil)
			if err != nil {
				t.Fatal(err)
			}
			checkPulled(t, cs, got, arm64, idxDigest)

			p, _ = newPuller(t, Config{Platform: "linux/s390x"})
			_, err = p.Pull(context.Background(), host+"/"+repo, nil)
			if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "no image for platform linux/s390x") ||
				!strings.Contains(err.Error(), "linux/amd64") {
				t.Errorf("pull for a missing platform = %v, want NotFound listing the platforms there are", err)
			}
		})
	}
}

func TestPullByDigest(t *testing.T) {
	host := imagetest.StartRegistry(t)
	a := imagetest.BuildImage(t, []imagetest.TarEntry{imagetest.File("a", "a")})
	b := imagetest.BuildImage(t, []imagetest.TarEntry{imagetest.File("b", "b")})
	imagetest.Push(t, host, "bydigest:v1", a)
	bd := imagetest.Push(t, host, "bydigest:v2", b)
	idx, amd64, _ := imagetest.MultiPlatformIndex(t, imagetest.OCI)
	idxDigest := imagetest.Push(t, host, "bydigest:multi", idx)

	for _, tc := range []struct {
		ref      string
		want     v1.Image
		index    digest.Digest
		wantName string
	}{
		{host + "/bydigest@" + bd.String(), b, "", host + "/bydigest@" + bd.String()},
		// The tag points at a; the digest decides, as with docker.
		{host + "/bydigest:v1@" + bd.String(), b, "", host + "/bydigest:v1@" + bd.String()},
		{host + "/bydigest@" + idxDigest.String(), amd64, idxDigest, host + "/bydigest@" + idxDigest.String()},
	} {
		p, cs := newPuller(t, Config{})
		got, err := p.Pull(context.Background(), tc.ref, nil)
		if err != nil {
			t.Fatalf("pull %s: %v", tc.ref, err)
		}
		if got.Name != tc.wantName {
			t.Errorf("Name %q, want %q", got.Name, tc.wantName)
		}
		if tc.index != "" {
			checkPulled(t, cs, got, tc.want, tc.index)
		} else {
			checkPulled(t, cs, got, tc.want)
		}
	}

	p, _ := newPuller(t, Config{})
	missing := digest.FromString("nothing")
	_, err := p.Pull(context.Background(), host+"/bydigest@"+missing.String(), nil)
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "bydigest@"+missing.String()) {
		t.Errorf("pull of a missing digest = %v, want NotFound naming it", err)
	}
}

func TestPullNotFound(t *testing.T) {
	host := imagetest.StartRegistry(t)
	imagetest.Push(t, host, "present:v1", imagetest.BuildImage(t))
	p, cs := newPuller(t, Config{})
	for _, ref := range []string{host + "/present:v2", host + "/absent:v1"} {
		_, err := p.Pull(context.Background(), ref, nil)
		t.Log(err)
		if !errdefs.IsNotFound(err) {
			t.Errorf("pull %s = %v, want NotFound", ref, err)
			continue
		}
		if !strings.HasPrefix(err.Error(), "pull "+ref+": ") || !strings.Contains(err.Error(), "not found") {
			t.Errorf("pull %s: error %q does not name the reference", ref, err)
		}
	}
	if _, err := p.Pull(context.Background(), "Bad/Ref", nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("pull of a bad reference = %v, want InvalidArgument", err)
	}
	if len(storedBlobs(t, cs)) != 0 {
		t.Error("failed pulls stored blobs")
	}
}

func TestPullBasicAuth(t *testing.T) {
	host := imagetest.StartRegistry(t, imagetest.WithBasicAuth("alice", "s3cret"))
	img := imagetest.BuildImage(t, twoLayerEntries()...)
	imagetest.Push(t, host, "private/app:v1", img, ggcrremote.WithAuth(&authn.Basic{Username: "alice", Password: "s3cret"}))
	ref := host + "/private/app:v1"

	t.Run("no credentials", func(t *testing.T) {
		p, cs := newPuller(t, Config{})
		_, err := p.Pull(context.Background(), ref, nil)
		if !errdefs.IsUnauthorized(err) {
			t.Fatalf("pull without credentials = %v, want Unauthenticated", err)
		}
		msg := err.Error()
		t.Log(msg)
		if !strings.Contains(msg, "registry "+host) || !strings.Contains(msg, "requires credentials and none were given") {
			t.Errorf("unclear message: %s", msg)
		}
		if len(storedBlobs(t, cs)) != 0 {
			t.Error("an unauthenticated pull stored blobs")
		}
	})
	t.Run("wrong password", func(t *testing.T) {
		p, _ := newPuller(t, Config{})
		_, err := p.Pull(context.Background(), ref, &Auth{Username: "alice", Password: "wrong"})
		t.Log(err)
		if !errdefs.IsUnauthorized(err) || !strings.Contains(err.Error(), "rejected the credentials") {
			t.Fatalf("pull with a wrong password = %v, want Unauthenticated saying the credentials were rejected", err)
		}
	})
	t.Run("credentials for another registry", func(t *testing.T) {
		p, _ := newPuller(t, Config{})
		_, err := p.Pull(context.Background(), ref, &Auth{Username: "alice", Password: "s3cret", ServerAddress: "other.example:5000"})
		if !errdefs.IsUnauthorized(err) {
			t.Fatalf("credentials meant for another registry were used: %v", err)
		}
	})
	t.Run("bad auth field", func(t *testing.T) {
		p, _ := newPuller(t, Config{})
		_, err := p.Pull(context.Background(), ref, &Auth{Auth: "%%%not base64"})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "base64") {
			t.Fatalf("pull with a malformed auth field = %v, want InvalidArgument", err)
		}
	})
	for name, auth := range map[string]*Auth{
		"username and password": {Username: "alice", Password: "s3cret"},
		"auth field":            {Auth: "YWxpY2U6czNjcmV0"}, // base64("alice:s3cret")
		"server address URL":    {Username: "alice", Password: "s3cret", ServerAddress: "https://" + host + "/v2/"},
	} {
		t.Run(name, func(t *testing.T) {
			p, cs := newPuller(t, Config{})
			got, err := p.Pull(context.Background(), ref, auth)
			if err != nil {
				t.Fatal(err)
			}
			checkPulled(t, cs, got, img)
		})
	}
	t.Run("credentials are not sent to a mirror", func(t *testing.T) {
		mc := &imagetest.BlobCounter{}
		mirror := imagetest.StartRegistry(t, imagetest.WithBlobCounter(mc), imagetest.WithBasicAuth("alice", "s3cret"))
		imagetest.Push(t, mirror, "private/app:v1", img, ggcrremote.WithAuth(&authn.Basic{Username: "alice", Password: "s3cret"}))
		p, cs := newPuller(t, Config{Mirrors: map[string][]string{host: {"http://" + mirror}}})
		got, err := p.Pull(context.Background(), ref, &Auth{Username: "alice", Password: "s3cret"})
		if err != nil {
			t.Fatal(err)
		}
		checkPulled(t, cs, got, img)
		if mc.Requests() == 0 || mc.TotalGets() != 0 {
			t.Errorf("mirror saw %d requests and %d blob GETs; want it tried and refused", mc.Requests(), mc.TotalGets())
		}
	})
}

func TestPullTokenAuth(t *testing.T) {
	ta := imagetest.TokenAuth{Username: "bob", Password: "hunter2", RefreshToken: "refresh-123", Token: "bearer-xyz"}
	host := imagetest.StartRegistry(t, imagetest.WithTokenAuth(ta))
	img := imagetest.BuildImage(t, twoLayerEntries()...)
	imagetest.Push(t, host, "private/app:v1", img, ggcrremote.WithAuth(&authn.Basic{Username: "bob", Password: "hunter2"}))
	ref := host + "/private/app:v1"

	for name, auth := range map[string]*Auth{
		"username and password": {Username: "bob", Password: "hunter2"},
		"auth field":            {Auth: "Ym9iOmh1bnRlcjI="}, // base64("bob:hunter2")
		"identity token":        {IdentityToken: "refresh-123"},
		"registry token":        {RegistryToken: "bearer-xyz"},
	} {
		t.Run(name, func(t *testing.T) {
			p, cs := newPuller(t, Config{})
			got, err := p.Pull(context.Background(), ref, auth)
			if err != nil {
				t.Fatal(err)
			}
			checkPulled(t, cs, got, img)
		})
	}
	for name, auth := range map[string]*Auth{
		"no credentials": nil,
		"wrong password": {Username: "bob", Password: "nope"},
	} {
		t.Run(name, func(t *testing.T) {
			p, _ := newPuller(t, Config{})
			_, err := p.Pull(context.Background(), ref, auth)
			t.Log(err)
			if !errdefs.IsUnauthorized(err) || !strings.Contains(err.Error(), "registry "+host) {
				t.Fatalf("pull = %v, want Unauthenticated naming the registry", err)
			}
		})
	}
}

// TestMaxConcurrentDownloads checks that one pull has at most
// MaxConcurrentDownloads blob downloads in flight, and uses them all.
func TestMaxConcurrentDownloads(t *testing.T) {
	var mu sync.Mutex
	inFlight, peak := 0, 0
	slow := imagetest.WithMiddleware(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/sha256:") {
				mu.Lock()
				inFlight++
				peak = max(peak, inFlight)
				mu.Unlock()
				time.Sleep(50 * time.Millisecond)
				defer func() { mu.Lock(); inFlight--; mu.Unlock() }()
			}
			next.ServeHTTP(w, r)
		})
	})
	host := imagetest.StartRegistry(t, slow)
	var layers []v1.Layer
	for i := range 8 {
		layers = append(layers, imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("f", fmt.Sprint(i))))
	}
	img := imagetest.NewImage(t, imagetest.ImageOptions{}, layers...)
	imagetest.Push(t, host, "many:v1", img)
	for _, limit := range []int{1, 3} {
		mu.Lock()
		peak = 0
		mu.Unlock()
		p, cs := newPuller(t, Config{MaxConcurrentDownloads: limit})
		got, err := p.Pull(context.Background(), host+"/many:v1", nil)
		if err != nil {
			t.Fatal(err)
		}
		checkPulled(t, cs, got, img)
		mu.Lock()
		if peak != limit {
			t.Errorf("MaxConcurrentDownloads %d: %d downloads at once at most", limit, peak)
		}
		mu.Unlock()
	}
}

// TestPullBadBlob checks that a blob the registry corrupts is refused with a clear
// error, leaves the store with only verified blobs and no ingest file, and does not
// stop the next pull from a healthy registry.
func TestPullBadBlob(t *testing.T) {
	big := imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.RandomFile("big", 512<<10, 1))
	small := imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("small", "small"))
	img := imagetest.NewImage(t, imagetest.ImageOptions{}, small, big)
	bad := imagetest.Digest(t, big)
	healthy := imagetest.StartRegistry(t)
	imagetest.Push(t, healthy, "app:v1", img)

	// kind: what arrives whole but wrong is the registry's to fix (FailedPrecondition,
	// as containerd's content store); a connection cut mid-blob is worth a retry.
	for _, tc := range []struct {
		name  string
		fault imagetest.RegistryOption
		want  string
		kind  func(error) bool
	}{
		{"tampered", imagetest.WithTamperedBlobs(imagetest.Blobs(bad)), "digest mismatch", errdefs.IsFailedPrecondition},
		{"truncated", imagetest.WithTruncatedBlobs(imagetest.Blobs(bad), 100<<10), "truncated: got 102400 of", errdefs.IsFailedPrecondition},
		{"registry dies mid-blob", imagetest.WithDyingBlobs(imagetest.Blobs(bad), 200<<10), "read failed after 204800 of", errdefs.IsUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := imagetest.StartRegistry(t, tc.fault)
			imagetest.Push(t, host, "app:v1", img)
			p, cs := newPuller(t, Config{})
			_, err := p.Pull(context.Background(), host+"/app:v1", nil)
			if err == nil {
				t.Fatal("pull of a corrupted blob succeeded")
			}
			msg := err.Error()
			t.Log(msg)
			prefix := fmt.Sprintf("pull %s/app:v1: fetch layer %s: ", host, bad)
			if !strings.HasPrefix(msg, prefix) || !strings.Contains(msg, tc.want) {
				t.Errorf("error %q: want it to start with %q and say %q", msg, prefix, tc.want)
			}
			if !tc.kind(err) {
				t.Errorf("error of the wrong kind: %v", err)
			}
			stored := storedBlobs(t, cs) // also checks every stored blob is what its name says
			if stored[bad] {
				t.Error("the corrupted blob is in the store")
			}
			noIngest(t, cs)

			got, err := p.Pull(context.Background(), healthy+"/app:v1", nil)
			if err != nil {
				t.Fatalf("pull from a healthy registry after a failure: %v", err)
			}
			checkPulled(t, cs, got, img)
		})
	}
}

// TestPullRefusesOversizedDocuments: a config or manifest over the size crisp reads is
// the image's fault (InvalidArgument), refused before the config is downloaded.
func TestPullRefusesOversizedDocuments(t *testing.T) {
	host := imagetest.StartRegistry(t)
	layer := imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("a", "b"))
	bigConfig := imagetest.NewImage(t, imagetest.ImageOptions{Config: v1.Config{Labels: map[string]string{"junk": strings.Repeat("y", maxConfigSize)}}}, layer)
	bigManifest := imagetest.NewImage(t, imagetest.ImageOptions{Annotations: map[string]string{"junk": strings.Repeat("y", maxManifestSize)}}, layer)
	imagetest.Push(t, host, "big/config:1", bigConfig)
	imagetest.Push(t, host, "big/manifest:1", bigManifest)
	for _, tc := range []struct {
		ref, say string
	}{
		{"big/config:1", "image config " + imagetest.ConfigDigest(t, bigConfig).String() + " is "},
		{"big/manifest:1", "larger than the 4194304 allowed"},
	} {
		t.Run(tc.ref, func(t *testing.T) {
			p, cs := newPuller(t, Config{})
			_, err := p.Pull(context.Background(), host+"/"+tc.ref, nil)
			t.Log(err)
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), host+"/"+tc.ref) || !strings.Contains(err.Error(), tc.say) {
				t.Fatalf("pull = %v, want InvalidArgument naming the image and saying %q", err, tc.say)
			}
			if blobs := storedBlobs(t, cs); len(blobs) > 1 {
				t.Errorf("stored %d blobs of a refused image, want at most its manifest", len(blobs))
			}
		})
	}
}

// TestPullRefusesOverlongBlob: a registry (or a man in the middle of a plain-HTTP
// mirror) that sends more bytes than the manifest declares, without a Content-Length
// to refuse up front, is cut off at the declared size plus one byte: the layer's
// consumer (the unpacker) never sees the excess, here a second gzip member inflating
// to 64 MiB, and nothing is stored.
func TestPullRefusesOverlongBlob(t *testing.T) {
	layer := imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("a", "b"))
	img := imagetest.NewImage(t, imagetest.ImageOptions{}, layer)
	d := imagetest.Digest(t, layer)
	size := int64(len(layer.Blob()))
	bomb := imagetest.ZerosLayer(t, imagetest.OCI, "zeros", 64<<20).Blob()
	host := imagetest.StartRegistry(t, imagetest.WithOverlongBlobs(imagetest.Blobs(d), bomb))
	imagetest.Push(t, host, "long:v1", img)
	p, cs := newPuller(t, Config{})
	var mu sync.Mutex
	var seen int64
	unpacker := func([]Layer) LayerFunc {
		return func(ctx context.Context, _ int, _ Layer, fetch FetchFunc) error {
			_, err := fetch(ctx, func(r io.Reader) error {
				n, err := io.Copy(io.Discard, r)
				mu.Lock()
				seen += n
				mu.Unlock()
				return err
			})
			return err
		}
	}
	_, err := p.PullLayers(context.Background(), host+"/long:v1", nil, unpacker)
	t.Log(err)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "too long") || !strings.Contains(err.Error(), d.String()) {
		t.Fatalf("pull = %v, want FailedPrecondition naming the layer and saying it is too long", err)
	}
	if seen > size+1 {
		t.Errorf("the consumer read %d bytes of a blob declared %d bytes long", seen, size)
	}
	if storedBlobs(t, cs)[d] {
		t.Error("the overlong blob is in the store")
	}
	noIngest(t, cs)
}

// TestPullRefusesOversizedManifestEarly: a manifest response larger than the 4 MiB
// crisp reads is cut off while it arrives, not held in memory whole (up to the 100 MiB
// of the registry client) and measured afterwards.
func TestPullRefusesOversizedManifestEarly(t *testing.T) {
	const served = 96 << 20
	var mu sync.Mutex
	var wrote int64
	huge := imagetest.WithMiddleware(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !strings.Contains(r.URL.Path, "/manifests/") || r.Method != http.MethodGet {
				next.ServeHTTP(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush() // chunked: no Content-Length to refuse up front
			chunk := bytes.Repeat([]byte(" "), 1<<20)
			for range served / len(chunk) {
				n, err := w.Write(chunk)
				mu.Lock()
				wrote += int64(n)
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	})
	host := imagetest.StartRegistry(t, huge)
	p, _ := newPuller(t, Config{})
	_, err := p.Pull(context.Background(), host+"/huge:v1", nil)
	t.Log(err)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "4194304") {
		t.Fatalf("pull = %v, want InvalidArgument saying the manifest is larger than 4194304 bytes", err)
	}
	// Socket buffers hold a few MiB more than the client read.
	mu.Lock()
	defer mu.Unlock()
	if wrote > 32<<20 {
		t.Errorf("the registry sent %d MiB of a manifest before the pull refused it", wrote>>20)
	}
}

// TestConcurrentPulls pulls one image ten times at once, and two images sharing a
// layer, and checks every blob crossed the network exactly once.
func TestConcurrentPulls(t *testing.T) {
	counter := &imagetest.BlobCounter{}
	host := imagetest.StartRegistry(t, imagetest.WithBlobCounter(counter))
	shared := imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.RandomFile("shared", 2<<20, 7))
	var layers []v1.Layer
	for i := range 4 {
		layers = append(layers, imagetest.NewLayer(t, imagetest.OCI, imagetest.Uncompressed, imagetest.RandomFile("f", 1<<20, uint64(10+i))))
	}
	img := imagetest.NewImage(t, imagetest.ImageOptions{}, append([]v1.Layer{shared}, layers...)...)
	other := imagetest.NewImage(t, imagetest.ImageOptions{}, shared,
		imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("other", "other")))
	imagetest.Push(t, host, "concurrent:v1", img)
	imagetest.Push(t, host, "other:v1", other)

	p, cs := newPuller(t, Config{MaxConcurrentDownloads: 2})
	var wg sync.WaitGroup
	results := make([]*Image, 12)
	errs := make([]error, 12)
	for i := range 12 {
		ref := host + "/concurrent:v1"
		if i >= 10 {
			ref = host + "/other:v1"
		}
		wg.Go(func() { results[i], errs[i] = p.Pull(context.Background(), ref, nil) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("pull %d: %v", i, err)
		}
	}
	checkPulled(t, cs, results[0], img, results[10].ManifestDigest, results[10].ConfigDigest, results[10].Layers[1].Digest)
	want := append(imagetest.LayerDigests(t, img), imagetest.ConfigDigest(t, img), imagetest.ConfigDigest(t, other), imagetest.LayerDigests(t, other)[1])
	for _, d := range want {
		if n := counter.Gets(d); n != 1 {
			t.Errorf("blob %s downloaded %d times, want once", d, n)
		}
	}
	if n := counter.TotalGets(); n != len(want) {
		t.Errorf("%d blob GETs in all, want %d", n, len(want))
	}
}

func TestMirrors(t *testing.T) {
	img := imagetest.BuildImage(t, twoLayerEntries()...)
	upCount := &imagetest.BlobCounter{}
	upstream := imagetest.StartRegistry(t, imagetest.WithBlobCounter(upCount))
	imagetest.Push(t, upstream, "team/app:v1", img)

	t.Run("mirror first, with a path prefix", func(t *testing.T) {
		mc := &imagetest.BlobCounter{}
		mirror := imagetest.StartRegistry(t, imagetest.WithBlobCounter(mc))
		imagetest.Push(t, mirror, "cache/team/app:v1", img)
		before := upCount.Requests()
		p, cs := newPuller(t, Config{Mirrors: map[string][]string{upstream: {"http://" + mirror + "/cache"}}})
		got, err := p.Pull(context.Background(), upstream+"/team/app:v1", nil)
		if err != nil {
			t.Fatal(err)
		}
		checkPulled(t, cs, got, img)
		if got.Name != upstream+"/team/app:v1" {
			t.Errorf("Name %q: the name must stay the registry's, not the mirror's", got.Name)
		}
		if upCount.Requests() != before {
			t.Errorf("upstream saw %d requests; the mirror should have served everything", upCount.Requests()-before)
		}
		if mc.TotalGets() != 3 {
			t.Errorf("mirror served %d blobs, want 3", mc.TotalGets())
		}
	})
	t.Run("fallback when mirrors fail", func(t *testing.T) {
		broken := imagetest.StartRegistry(t, imagetest.WithErrorStatus(503, nil))
		empty := imagetest.StartRegistry(t)
		tampering := imagetest.StartRegistry(t, imagetest.WithTamperedBlobs(nil))
		imagetest.Push(t, tampering, "team/app:v1", img)
		before := upCount.TotalGets()
		p, cs := newPuller(t, Config{Mirrors: map[string][]string{upstream: {
			"http://" + broken, "http://127.0.0.1:1", "http://" + empty, "http://" + tampering,
		}}})
		start := time.Now()
		got, err := p.Pull(context.Background(), upstream+"/team/app:v1", nil)
		if err != nil {
			t.Fatal(err)
		}
		checkPulled(t, cs, got, img)
		if upCount.TotalGets() == before {
			t.Error("upstream served no blob after every mirror failed")
		}
		t.Logf("fell back through 4 failing mirrors in %v", time.Since(start))
	})
	t.Run("all fail", func(t *testing.T) {
		p, _ := newPuller(t, Config{Mirrors: map[string][]string{upstream: {"http://127.0.0.1:1"}}})
		_, err := p.Pull(context.Background(), upstream+"/team/missing:v1", nil)
		t.Log(err)
		if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "mirror http://127.0.0.1:1") {
			t.Errorf("error %v: want the registry's NotFound, mentioning the mirror's failure", err)
		}
	})
	t.Run("docker.io through a mirror", func(t *testing.T) {
		// No internet here: docker.io itself is never reached if the mirror has it.
		mirror := imagetest.StartRegistry(t)
		imagetest.Push(t, mirror, "library/busybox:latest", img)
		p, cs := newPuller(t, Config{Mirrors: map[string][]string{"docker.io": {"http://" + mirror}}})
		got, err := p.Pull(context.Background(), "busybox", nil)
		if err != nil {
			t.Fatal(err)
		}
		if got.Name != "docker.io/library/busybox:latest" || !strings.HasPrefix(got.RepoDigest, "docker.io/library/busybox@sha256:") {
			t.Errorf("Name %q RepoDigest %q", got.Name, got.RepoDigest)
		}
		checkPulled(t, cs, got, img)
	})
}

func TestPullTLSRegistry(t *testing.T) {
	// httptest's certificate is self-signed: only an insecure host (loopback is one)
	// may skip verification.
	host := imagetest.StartRegistry(t, imagetest.WithTLS())
	img := imagetest.BuildImage(t, twoLayerEntries()...)
	imagetest.Push(t, host, "tls/app:v1", img, ggcrremote.WithTransport(wrapTransport(newPolicyTransport(newHostPolicy(nil, slog.Default())), 0)))
	p, cs := newPuller(t, Config{})
	got, err := p.Pull(context.Background(), host+"/tls/app:v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	checkPulled(t, cs, got, img)
}

// TestCancelMidDownload cancels pulls whose layer download hangs and checks they
// return at once, cleanly, and that a download shared by two pulls goes on while one
// of them still wants it.
func TestCancelMidDownload(t *testing.T) {
	big := imagetest.NewLayer(t, imagetest.OCI, imagetest.Uncompressed, imagetest.RandomFile("big", 4<<20, 3))
	img := imagetest.NewImage(t, imagetest.ImageOptions{}, big)
	stall := imagetest.NewStaller()
	counter := &imagetest.BlobCounter{}
	host := imagetest.StartRegistry(t, imagetest.WithBlobCounter(counter), imagetest.WithStalledBlobs(imagetest.Blobs(imagetest.Digest(t, big)), 1<<20, stall))
	imagetest.Push(t, host, "slow:v1", img)
	p, cs := newPuller(t, Config{})

	type result struct {
		img *Image
		err error
	}
	pull := func(ctx context.Context) chan result {
		ch := make(chan result, 1)
		go func() {
			img, err := p.Pull(ctx, host+"/slow:v1", nil)
			ch <- result{img, err}
		}()
		return ch
	}
	waitStall := func() {
		select {
		case <-stall.Stalled():
		case <-time.After(10 * time.Second):
			t.Fatal("download never started")
		}
	}

	// One pull alone: cancelling it ends the download.
	ctx, cancel := context.WithCancel(context.Background())
	ch := pull(ctx)
	waitStall()
	start := time.Now()
	cancel()
	r := <-ch
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled pull returned %v", r.err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("cancelled pull took %v to return", d)
	}
	t.Logf("cancelled pull returned in %v: %v", time.Since(start), r.err)
	noIngest(t, cs)
	if cs.Has(imagetest.Digest(t, big)) {
		t.Fatal("half-downloaded layer in the store")
	}
	p.flights.mu.Lock()
	if n := len(p.flights.flights); n != 0 {
		t.Errorf("%d downloads still registered", n)
	}
	p.flights.mu.Unlock()
	// Nothing of the pull may still run: no goroutine in the puller's code (idle
	// HTTP connections of the transport do not count).
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	for _, g := range strings.Split(stacks, "\n\n") {
		if strings.Contains(g, "image/remote.(*Puller)") || strings.Contains(g, "image/remote.(*flightGroup)") ||
			strings.Contains(g, "image/content.(*Store)") {
			t.Errorf("goroutine left behind by a cancelled pull:\n%s", g)
		}
	}

	// Two pulls share one download: cancelling one leaves the other's running.
	ctx1, cancel1 := context.WithCancel(context.Background())
	ch1 := pull(ctx1)
	waitStall()
	ch2 := pull(context.Background())
	time.Sleep(100 * time.Millisecond) // let the second pull join the download
	cancel1()
	if r := <-ch1; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled pull returned %v", r.err)
	}
	stall.Release()
	r = <-ch2
	if r.err != nil {
		t.Fatalf("the pull that was not cancelled failed: %v", r.err)
	}
	checkPulled(t, cs, r.img, img)
	if n := counter.Gets(imagetest.Digest(t, big)); n != 2 {
		t.Errorf("layer requested %d times, want 2 (the cancelled download, then one shared)", n)
	}
}

// TestPullLargeImage measures pulling a ~50 MB image of five layers.
func TestPullLargeImage(t *testing.T) {
	if testing.Short() {
		t.Skip("large pull skipped in -short mode")
	}
	var layers []v1.Layer
	for i := range 5 {
		layers = append(layers, imagetest.NewLayer(t, imagetest.OCI, imagetest.Uncompressed, imagetest.RandomFile("data", 10<<20, uint64(100+i))))
	}
	img := imagetest.NewImage(t, imagetest.ImageOptions{}, layers...)
	host := imagetest.StartRegistry(t)
	imagetest.Push(t, host, "large:v1", img)
	p, cs := newPuller(t, Config{})
	start := time.Now()
	got, err := p.Pull(context.Background(), host+"/large:v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	d := time.Since(start)
	var total int64
	for _, l := range got.Layers {
		total += l.Size
	}
	t.Logf("pulled %.1f MB in %d layers in %v (%.0f MB/s)", float64(total)/1e6, len(got.Layers), d, float64(total)/1e6/d.Seconds())
	checkPulled(t, cs, got, img)
}
