package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	ggcrremote "github.com/google/go-containerregistry/pkg/v1/remote"
	digest "github.com/opencontainers/go-digest"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
	"github.com/crisp-runtime/crisp/internal/image/remote"
	"github.com/crisp-runtime/crisp/internal/mount"
	"github.com/crisp-runtime/crisp/internal/store"
	"github.com/crisp-runtime/crisp/internal/testutil"
)

// rootWhy is what the image service tests need root for (testutil.RequiresRoot).
const rootWhy = "unpacks layers and mounts overlays"

type fixture struct {
	t    *testing.T
	root string
	db   *store.Store
	svc  *Service
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	testutil.RequiresRoot(t, rootWhy)
	root := t.TempDir()
	f := &fixture{t: t, root: root}
	f.open()
	t.Cleanup(func() { f.db.Close() })
	return f
}

// open (re)opens the store and service, as a criserver restart does.
func (f *fixture) open() {
	f.t.Helper()
	if f.db != nil {
		f.db.Close()
	}
	db, err := store.Open(filepath.Join(f.root, "meta.db"))
	if err != nil {
		f.t.Fatal(err)
	}
	f.db = db
	svc, err := New(Config{Root: filepath.Join(f.root, "images")}, db, slog.New(slog.DiscardHandler))
	if err != nil {
		f.t.Fatal(err)
	}
	f.svc = svc
}

// tree mounts the image's rootfs and returns every path in it with a short
// description (type, and content for small files).
func (f *fixture) tree(img *Image) map[string]string {
	f.t.Helper()
	key := "tree-" + strings.TrimPrefix(img.ID, "sha256:")[:12]
	ms, err := f.svc.PrepareRootfs(key, img)
	if err != nil {
		f.t.Fatal(err)
	}
	defer f.svc.RemoveRootfs(key)
	target := f.t.TempDir()
	var mms []mount.Mount
	for _, m := range ms {
		mms = append(mms, mount.Mount{Type: m.Type, Source: m.Source, Options: m.Options})
	}
	if err := mount.All(mms, target); err != nil {
		f.t.Fatal(err)
	}
	defer mount.Unmount(target)
	out := map[string]string{}
	err = filepath.WalkDir(target, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(target, p)
		if rel == "." {
			return nil
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			out[rel] = "-> " + l
		case d.IsDir():
			out[rel] = "dir"
		default:
			data, _ := os.ReadFile(p)
			if len(data) > 64 {
				out[rel] = "big"
			} else {
				out[rel] = string(data)
			}
		}
		return nil
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return out
}

func TestPullUnpacksExactRootfs(t *testing.T) {
	f := newFixture(t)
	host := imagetest.StartRegistry(t)
	for _, tc := range []struct {
		name   string
		format imagetest.Format
		comps  [3]imagetest.Compression
	}{
		{"oci", imagetest.OCI, [3]imagetest.Compression{imagetest.Gzip, imagetest.Zstd, imagetest.Uncompressed}},
		{"docker", imagetest.Docker, [3]imagetest.Compression{imagetest.Gzip, imagetest.Gzip, imagetest.Uncompressed}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := imagetest.NewImage(t, imagetest.ImageOptions{Format: tc.format, Config: v1.Config{User: "1000:1000", Cmd: []string{"/bin/sh"}}},
				imagetest.NewLayer(t, tc.format, tc.comps[0],
					imagetest.Dir("etc"), imagetest.File("etc/removeme", "gone"), imagetest.File("etc/keep", "kept"),
					imagetest.Dir("data"), imagetest.Dir("data/old"), imagetest.File("data/old/a", "a"), imagetest.File("data/old/b", "b"),
					imagetest.Symlink("link", "etc/keep"), imagetest.Hardlink("etc/hard", "etc/keep")),
				imagetest.NewLayer(t, tc.format, tc.comps[1],
					imagetest.Whiteout("etc/removeme"), imagetest.Opaque("data/old"), imagetest.File("data/old/c", "c")),
				imagetest.NewLayer(t, tc.format, tc.comps[2], imagetest.File("etc/keep", "changed")),
			)
			ref := host + "/exact/" + tc.name + ":v1"
			imagetest.Push(t, host, strings.TrimPrefix(ref, host+"/"), img)
			got, err := f.svc.Pull(context.Background(), ref, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got.ID != imagetest.ConfigDigest(t, img).String() {
				t.Errorf("ID %s, want the config digest %s", got.ID, imagetest.ConfigDigest(t, img))
			}
			want := map[string]string{
				"etc": "dir", "etc/keep": "changed", "etc/hard": "kept", "link": "-> etc/keep",
				"data": "dir", "data/old": "dir", "data/old/c": "c",
			}
			tree := f.tree(got)
			if !equalMaps(tree, want) {
				t.Errorf("rootfs:\n got %v\nwant %v", tree, want)
			}
		})
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestPullMultiPlatformPicksAmd64(t *testing.T) {
	f := newFixture(t)
	host := imagetest.StartRegistry(t)
	idx, amd64, _ := imagetest.MultiPlatformIndex(t, imagetest.OCI)
	imagetest.Push(t, host, "multi:latest", idx)
	img, err := f.svc.Pull(context.Background(), host+"/multi", nil)
	if err != nil {
		t.Fatal(err)
	}
	if img.ID != imagetest.ConfigDigest(t, amd64).String() {
		t.Fatalf("pulled %s, want the amd64 image %s", img.ID, imagetest.ConfigDigest(t, amd64))
	}
	if tree := f.tree(img); tree["etc/arch"] != "amd64\n" {
		t.Fatalf("etc/arch = %q", tree["etc/arch"])
	}
	idxDigest := imagetest.Digest(t, idx)
	if len(img.RepoDigests) != 1 || !strings.HasSuffix(img.RepoDigests[0], "@"+idxDigest.String()) {
		t.Errorf("repo digests %v, want the index digest %s", img.RepoDigests, idxDigest)
	}
	if len(img.RepoTags) != 1 || img.RepoTags[0] != host+"/multi:latest" {
		t.Errorf("repo tags %v", img.RepoTags)
	}
	// By digest and by tag@digest resolve to the same image.
	for _, ref := range []string{host + "/multi@" + idxDigest.String(), host + "/multi:latest@" + idxDigest.String()} {
		again, err := f.svc.Pull(context.Background(), ref, nil)
		if err != nil || again.ID != img.ID {
			t.Errorf("pull %s: %v %v", ref, again, err)
		}
		if got, err := f.svc.Get(ref); err != nil || got.ID != img.ID {
			t.Errorf("get %s: %v", ref, err)
		}
	}
}

func TestRemoveTagsImagesAndFrees(t *testing.T) {
	f := newFixture(t)
	host := imagetest.StartRegistry(t)
	base := imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("base", "shared"))
	one := imagetest.NewImage(t, imagetest.ImageOptions{}, base, imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("one", "1")))
	two := imagetest.NewImage(t, imagetest.ImageOptions{}, base, imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("two", "2")))
	imagetest.Push(t, host, "one:a", one)
	imagetest.Push(t, host, "one:b", one)
	imagetest.Push(t, host, "two:latest", two)
	ctx := context.Background()
	for _, ref := range []string{host + "/one:a", host + "/one:b", host + "/two:latest"} {
		if _, err := f.svc.Pull(ctx, ref, nil); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(f.svc.List()); n != 2 {
		t.Fatalf("%d images, want 2 (one with two tags)", n)
	}
	snaps, _ := f.svc.snaps.List()
	if len(snaps) != 3 {
		t.Fatalf("%d snapshots, want 3 (the base layer shared)", len(snaps))
	}
	// Removing one of two tags keeps the image.
	if err := f.svc.Remove(ctx, host+"/one:a"); err != nil {
		t.Fatal(err)
	}
	img, err := f.svc.Get(host + "/one:b")
	if err != nil || len(img.RepoTags) != 1 {
		t.Fatalf("after removing one tag: %v %v", img, err)
	}
	if _, err := f.svc.Get(host + "/one:a"); err == nil {
		t.Fatal("removed tag still resolves")
	}
	// A restart sees exactly the same.
	f.open()
	if n := len(f.svc.List()); n != 2 {
		t.Fatalf("after restart: %d images", n)
	}
	// Removing the last tag removes the image; the shared base layer stays for two.
	if err := f.svc.Remove(ctx, host+"/one:b"); err != nil {
		t.Fatal(err)
	}
	snaps, _ = f.svc.snaps.List()
	if len(snaps) != 2 {
		t.Fatalf("%d snapshots after removing one, want 2", len(snaps))
	}
	blobsBefore := f.blobs()
	twoImg, _ := f.svc.Get(host + "/two:latest")
	if err := f.svc.Remove(ctx, twoImg.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.svc.Remove(ctx, twoImg.ID); err != nil {
		t.Fatalf("removing a removed image: %v", err)
	}
	snaps, _ = f.svc.snaps.List()
	if len(snaps) != 0 || len(f.blobs()) != 0 || len(f.svc.List()) != 0 {
		t.Fatalf("left after removing every image: %d snapshots, blobs %v (had %d)", len(snaps), f.blobs(), len(blobsBefore))
	}
}

func (f *fixture) blobs() []digest.Digest {
	var out []digest.Digest
	_ = f.svc.content.Walk(func(d digest.Digest, _ int64) error { out = append(out, d); return nil })
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func TestConcurrentPullsDownloadOnce(t *testing.T) {
	f := newFixture(t)
	var counter imagetest.BlobCounter
	host := imagetest.StartRegistry(t, imagetest.WithBlobCounter(&counter))
	img := imagetest.BusyboxImage(t, imagetest.OCI, imagetest.Gzip)
	imagetest.Push(t, host, "busybox:1", img)
	var wg sync.WaitGroup
	ids := make([]string, 10)
	errs := make([]error, 10)
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := f.svc.Pull(context.Background(), host+"/busybox:1", nil)
			errs[i] = err
			if err == nil {
				ids[i] = got.ID
			}
		}()
	}
	wg.Wait()
	for i := range 10 {
		if errs[i] != nil || ids[i] != imagetest.ConfigDigest(t, img).String() {
			t.Fatalf("pull %d: %v %s", i, errs[i], ids[i])
		}
	}
	for d, n := range counter.Counts() {
		if n != 1 {
			t.Errorf("blob %s downloaded %d times", d, n)
		}
	}
	if tree := f.tree(f.svc.List()[0]); tree["bin/busybox"] != "big" || tree["bin/sh"] != "-> busybox" {
		t.Errorf("busybox rootfs: busybox %q sh %q", tree["bin/busybox"], tree["bin/sh"])
	}
}

func TestBadBlobsLeaveNothing(t *testing.T) {
	f := newFixture(t)
	img := imagetest.BusyboxImage(t, imagetest.OCI, imagetest.Gzip)
	layer := imagetest.LayerDigests(t, img)[0]
	// A blob that arrives whole but is not what the manifest names is the registry's
	// to fix (FailedPrecondition, as containerd's content store says); a connection
	// that breaks mid-blob is a network fault worth retrying (Unavailable).
	for _, tc := range []struct {
		name string
		opt  imagetest.RegistryOption
		kind func(error) bool
	}{
		{"tampered", imagetest.WithTamperedBlobs(imagetest.Blobs(layer)), errdefs.IsFailedPrecondition},
		{"truncated", imagetest.WithTruncatedBlobs(imagetest.Blobs(layer), 1000), errdefs.IsFailedPrecondition},
		{"dying", imagetest.WithDyingBlobs(imagetest.Blobs(layer), 1000), errdefs.IsUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := imagetest.StartRegistry(t, tc.opt)
			imagetest.Push(t, bad, "busybox:1", img)
			if _, err := f.svc.Pull(context.Background(), bad+"/busybox:1", nil); err == nil {
				t.Fatal("pull of a bad blob succeeded")
			} else if !strings.Contains(err.Error(), layer.Encoded()[:12]) {
				t.Errorf("error does not name the layer: %v", err)
			} else if !tc.kind(err) {
				t.Errorf("error of the wrong kind: %v", err)
			}
			snaps, _ := f.svc.snaps.List()
			if len(f.svc.List()) != 0 || len(snaps) != 0 {
				t.Fatalf("a failed pull left images or snapshots")
			}
			for _, d := range f.blobs() {
				if d == layer {
					t.Fatalf("bad layer blob stored")
				}
			}
			entries, _ := os.ReadDir(filepath.Join(f.root, "images", "content", "ingest"))
			if len(entries) != 0 {
				t.Fatalf("ingest files left: %d", len(entries))
			}
			noUnpackLeft(t, f)
		})
	}
	good := imagetest.StartRegistry(t)
	imagetest.Push(t, good, "busybox:1", img)
	if _, err := f.svc.Pull(context.Background(), good+"/busybox:1", nil); err != nil {
		t.Fatalf("pull after failures: %v", err)
	}
}

// TestPullAuth: credentials a registry rejects or lacks are Unauthenticated (401) or
// PermissionDenied (403), never "cannot reach the registry"; the message names the
// registry and says the credentials were refused, and never echoes the secret.
func TestPullAuth(t *testing.T) {
	f := newFixture(t)
	img := imagetest.NewImage(t, imagetest.ImageOptions{}, imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("x", "y")))
	basic := imagetest.StartRegistry(t, imagetest.WithBasicAuth("alice", "s3cret"))
	imagetest.Push(t, basic, "private:1", img, ggcrremote.WithAuth(&authn.Basic{Username: "alice", Password: "s3cret"}))
	token := imagetest.StartRegistry(t, imagetest.WithTokenAuth(imagetest.TokenAuth{Username: "bob", Password: "hunter2", RefreshToken: "refresh-1", Token: "bearer-1"}))
	imagetest.Push(t, token, "private:1", img, ggcrremote.WithAuth(&authn.Bearer{Token: "bearer-1"}))
	// A registry that knows the user but does not let them pull.
	forbidden := imagetest.StartRegistry(t, imagetest.WithErrorStatus(http.StatusForbidden, func(r *http.Request) bool {
		return r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/manifests/")
	}))
	imagetest.Push(t, forbidden, "private:1", img)

	for _, tc := range []struct {
		name string
		host string
		auth *remote.Auth
		kind func(error) bool
		say  string
	}{
		{"basic, none given", basic, nil, errdefs.IsUnauthorized, "requires credentials and none were given"},
		{"basic, wrong password", basic, &remote.Auth{Username: "alice", Password: "wrong-pw"}, errdefs.IsUnauthorized, "rejected the credentials"},
		{"token, none given", token, nil, errdefs.IsUnauthorized, "requires credentials and none were given"},
		{"token, wrong password", token, &remote.Auth{Username: "bob", Password: "wrong-pw"}, errdefs.IsUnauthorized, "rejected the credentials"},
		{"token, wrong identity token", token, &remote.Auth{IdentityToken: "wrong-pw"}, errdefs.IsUnauthorized, "rejected the credentials"},
		{"token, wrong registry token", token, &remote.Auth{RegistryToken: "wrong-pw"}, errdefs.IsUnauthorized, "rejected the credentials"},
		{"forbidden", forbidden, &remote.Auth{Username: "carol", Password: "wrong-pw"}, errdefs.IsPermissionDenied, "the credentials do not allow pulling it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.svc.Pull(context.Background(), tc.host+"/private:1", tc.auth)
			t.Log(err)
			if err == nil || !tc.kind(err) || errdefs.IsUnavailable(err) {
				t.Fatalf("pull = %v, want it refused for the credentials", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, "registry "+tc.host) || !strings.Contains(msg, tc.say) {
				t.Errorf("error does not name the registry %s and say %q: %v", tc.host, tc.say, err)
			}
			if strings.Contains(msg, "wrong-pw") {
				t.Errorf("error echoes the secret: %v", err)
			}
		})
	}
	if _, err := f.svc.Pull(context.Background(), basic+"/private:1", &remote.Auth{Username: "alice", Password: "s3cret"}); err != nil {
		t.Fatalf("pull with credentials: %v", err)
	}
	if _, err := f.svc.Pull(context.Background(), token+"/private:1", &remote.Auth{Username: "bob", Password: "hunter2"}); err != nil {
		t.Fatalf("pull with credentials from a token registry: %v", err)
	}
}

// rawTar builds a tar stream with headers exactly as given, for layers no honest
// builder would make.
func rawTar(t *testing.T, hdrs ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(make([]byte, h.Size)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestPullRefusesMaliciousLayers: a layer that would escape, that the unpack cannot
// create, that is not a valid (compressed) tar or that contradicts the image config is
// refused with InvalidArgument (the image's fault, cri's toStatus makes it the gRPC
// code), naming the image, the layer's digest and what is wrong, and nothing of it is
// kept.
func TestPullRefusesMaliciousLayers(t *testing.T) {
	f := newFixture(t)
	host := imagetest.StartRegistry(t)
	outside := t.TempDir()
	passwd, err := os.Stat("/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	reg := func(name string, size int64) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size}
	}
	// A valid two-file tar, and its gzip, to cut and corrupt.
	valid := rawTar(t, reg("a", 3000), reg("b", 3000))
	gz := imagetest.LayerFromTar(t, imagetest.OCI, imagetest.Gzip, valid)
	flipped := append([]byte(nil), gz.Blob()...)
	flipped[len(flipped)-6] ^= 0xff // in the gzip trailer's CRC: only the checksum can tell
	other := imagetest.LayerFromTar(t, imagetest.OCI, imagetest.Gzip, rawTar(t, reg("c", 10)))
	diffID, err := gz.DiffID()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		tar   []byte           // gzip'd into the layer, or
		layer *imagetest.Layer // the layer as is
		say   string           // what the error must say (the entry, for refused entries)
	}{
		{name: "dotdot", tar: rawTar(t, reg("../../../../"+outside+"/escape", 4)), say: `/escape"`},
		{name: "absolute", tar: rawTar(t, reg(outside+"/evil", 4)), say: `/evil"`},
		{name: "symlink then write", tar: rawTar(t,
			&tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: outside, Mode: 0o777},
			reg("link/planted", 4)), say: `"link/planted"`},
		{name: "hardlink to host passwd", tar: rawTar(t, &tar.Header{Name: "pw", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}), say: `"pw"`},
		{name: "hardlink to a missing target", tar: rawTar(t, &tar.Header{Name: "pw", Typeflag: tar.TypeLink, Linkname: "nope"}), say: `"pw"`},
		{name: "whiteout of dot", tar: rawTar(t, reg("d/.wh..", 0)), say: `"d/.wh.."`},
		{name: "opaque marker beneath a file", tar: rawTar(t, reg("f", 1), reg("f/.wh..wh..opq", 0)), say: `"f/.wh..wh..opq"`},
		{name: "entry beneath a file", tar: rawTar(t, reg("f", 1), reg("f/x", 1)), say: `"f/x"`},
		{name: "truncated tar", tar: valid[:2000], say: "truncated"},
		{name: "truncated tar, uncompressed", layer: imagetest.LayerFromTar(t, imagetest.OCI, imagetest.Uncompressed, valid[:2000]), say: "truncated"},
		{name: "not a tar", tar: bytes.Repeat([]byte("x"), 4096), say: "not a valid tar stream"},
		{name: "truncated gzip", layer: gz.WithBlob(gz.Blob()[:len(gz.Blob())/2]), say: "corrupt or truncated gzip data"},
		{name: "corrupt gzip", layer: gz.WithBlob(flipped), say: "corrupt or truncated gzip data"},
		{name: "wrong diff ID", layer: gz.WithBlob(other.Blob()), say: "but the image config says " + diffID.String()},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			layer := tc.layer
			if layer == nil {
				layer = imagetest.LayerFromTar(t, imagetest.OCI, imagetest.Gzip, tc.tar)
			}
			img := imagetest.NewImage(t, imagetest.ImageOptions{},
				imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("ok", "fine")), layer)
			ref := fmt.Sprintf("evil/%d:1", i)
			imagetest.Push(t, host, ref, img)
			_, err := f.svc.Pull(context.Background(), host+"/"+ref, nil)
			if err == nil {
				t.Fatal("malicious layer was accepted")
			}
			t.Log(err)
			bad := imagetest.LayerDigests(t, img)[1]
			if msg := err.Error(); !strings.Contains(msg, host+"/"+ref) || !strings.Contains(msg, bad.String()) || !strings.Contains(msg, tc.say) {
				t.Errorf("error does not name the image %s, the layer %s and say %q: %v", host+"/"+ref, bad, tc.say, err)
			}
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("error is not InvalidArgument: %v", err)
			}
			if entries, _ := os.ReadDir(outside); len(entries) != 0 {
				t.Fatalf("files written outside the snapshot: %v", entries)
			}
			if now, err := os.Stat("/etc/passwd"); err != nil || now.ModTime() != passwd.ModTime() || now.Size() != passwd.Size() {
				t.Fatalf("/etc/passwd changed")
			}
			if len(f.svc.List()) != 0 {
				t.Fatalf("image recorded")
			}
			noUnpackLeft(t, f)
		})
	}
	// The good lower layer may stay as a snapshot for a later pull; GC of a removal
	// frees it. Nothing of the bad layers is kept.
	snaps, _ := f.svc.snaps.List()
	if len(snaps) > 1 {
		t.Fatalf("%d snapshots left, want at most the shared good layer", len(snaps))
	}
}

// TestPullLargeImageTiming pulls and unpacks a ~50 MB, 5-layer image from the local
// registry and logs how long it takes (go test -v).
func TestPullLargeImageTiming(t *testing.T) {
	f := newFixture(t)
	host := imagetest.StartRegistry(t)
	var layers []v1.Layer
	for i := range 5 {
		entries := []imagetest.TarEntry{imagetest.Dir(fmt.Sprintf("l%d", i))}
		for j := range 100 {
			entries = append(entries, imagetest.RandomFile(fmt.Sprintf("l%d/f%d", i, j), 100<<10, uint64(i*1000+j)))
		}
		layers = append(layers, imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, entries...))
	}
	img := imagetest.NewImage(t, imagetest.ImageOptions{}, layers...)
	imagetest.Push(t, host, "large:1", img)
	start := time.Now()
	got, err := f.svc.Pull(context.Background(), host+"/large:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pull+unpack of a %.1f MB image in 5 layers (500 files): %v", float64(got.Size)/1e6, time.Since(start))
	if got.Size < 50e6 {
		t.Errorf("image is %d bytes, want ~50 MB", got.Size)
	}
}

// TestImageIdentityAcrossReferences pulls one image by tag, by digest, by a second tag,
// under a second repository and through an index: every pull returns the same ID (the
// config digest), and RepoDigest picks the repo digest of the repository a container
// names.
func TestImageIdentityAcrossReferences(t *testing.T) {
	f := newFixture(t)
	host := imagetest.StartRegistry(t)
	idx, amd64, _ := imagetest.MultiPlatformIndex(t, imagetest.OCI)
	imagetest.Push(t, host, "app:v1", amd64)
	imagetest.Push(t, host, "app:v2", amd64)
	imagetest.Push(t, host, "other/app:v1", amd64)
	imagetest.Push(t, host, "multi:v1", idx)
	id := imagetest.ConfigDigest(t, amd64).String()
	mdig := imagetest.Digest(t, amd64).String()
	idig := imagetest.Digest(t, idx).String()
	refs := []string{
		host + "/app:v1",
		host + "/app@" + mdig,
		host + "/app:v2",
		host + "/other/app:v1",
		host + "/multi:v1",
	}
	for _, ref := range refs {
		img, err := f.svc.Pull(context.Background(), ref, nil)
		if err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		if img.ID != id {
			t.Errorf("pull %s: id %s, want the config digest %s", ref, img.ID, id)
		}
	}
	if n := len(f.svc.List()); n != 1 {
		t.Fatalf("%d images after pulling one image five ways", n)
	}
	img, err := f.svc.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	wantDigests := []string{host + "/app@" + mdig, host + "/other/app@" + mdig, host + "/multi@" + idig}
	if !equalSets(img.RepoDigests, wantDigests) {
		t.Errorf("repo digests %v, want %v", img.RepoDigests, wantDigests)
	}
	for ref, want := range map[string]string{
		host + "/app:v1":                       host + "/app@" + mdig,
		host + "/app:v2":                       host + "/app@" + mdig,
		host + "/app@" + mdig:                  host + "/app@" + mdig,
		host + "/other/app:v1":                 host + "/other/app@" + mdig,
		host + "/multi:v1":                     host + "/multi@" + idig,
		host + "/multi@" + mdig:                host + "/multi@" + idig, // the platform manifest of the index
		host + "/app:v1@" + mdig:               host + "/app@" + mdig,
		id:                                     img.RepoDigests[0], // kubelet without user_specified_image
		strings.TrimPrefix(id, "sha256:")[:12]: img.RepoDigests[0],
	} {
		if got := img.RepoDigest(ref); got != want {
			t.Errorf("RepoDigest(%s) = %s, want %s", ref, got, want)
		}
		if got, err := f.svc.Get(ref); err != nil || got.ID != id {
			t.Errorf("Get(%s): %v", ref, err)
		}
	}
	if got := (&Image{ID: id}).RepoDigest("x/y:z"); got != id {
		t.Errorf("RepoDigest of an image without repo digests = %s, want its ID", got)
	}
}

func equalSets(a, b []string) bool {
	a, b = append([]string(nil), a...), append([]string(nil), b...)
	sort.Strings(a)
	sort.Strings(b)
	return strings.Join(a, "\n") == strings.Join(b, "\n")
}

// TestPullDeadlineLeavesNothing pulls with a deadline while the registry stalls the
// layer: Pull returns context.DeadlineExceeded right after the deadline, and no image,
// blob of the layer, ingest file or snapshot remains; once the registry is fast
// again the same pull succeeds.
func TestPullDeadlineLeavesNothing(t *testing.T) {
	f := newFixture(t)
	layer := imagetest.NewLayer(t, imagetest.OCI, imagetest.Uncompressed, imagetest.RandomFile("big", 4<<20, 7))
	img := imagetest.NewImage(t, imagetest.ImageOptions{}, layer)
	stall := imagetest.NewStaller()
	host := imagetest.StartRegistry(t, imagetest.WithStalledBlobs(imagetest.Blobs(imagetest.Digest(t, layer)), 1<<20, stall))
	imagetest.Push(t, host, "slow:v1", img)

	const deadline = 500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	_, err := f.svc.Pull(ctx, host+"/slow:v1", nil)
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("pull past its deadline returned %v, want context.DeadlineExceeded", err)
	}
	select {
	case <-stall.Stalled():
	default:
		t.Fatal("the layer download never reached the stalled registry")
	}
	if took > deadline+time.Second {
		t.Errorf("pull returned %v after a %v deadline", took, deadline)
	}
	t.Logf("pull with a %v deadline returned after %v: %v", deadline, took, err)
	if imgs := f.svc.List(); len(imgs) != 0 {
		t.Errorf("images after a failed pull: %v", imgs)
	}
	if f.svc.content.Has(imagetest.Digest(t, layer)) {
		t.Error("the half-downloaded layer is in the content store")
	}
	entries, err := os.ReadDir(filepath.Join(f.root, "images", "content", "ingest"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("ingest file left behind: %s", e.Name())
	}
	diffID, err := layer.DiffID()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.snaps.Stat(digest.Digest(diffID.String())); err == nil {
		t.Error("a snapshot of the layer exists after the failed pull")
	}
	noUnpackLeft(t, f)

	stall.Release()
	got, err := f.svc.Pull(context.Background(), host+"/slow:v1", nil)
	if err != nil {
		t.Fatalf("pull after the registry recovered: %v", err)
	}
	if got.ID != imagetest.ConfigDigest(t, img).String() {
		t.Errorf("pulled %s", got.ID)
	}
	if tree := f.tree(got); tree["big"] != "big" {
		t.Errorf("rootfs after the second pull: %v", tree)
	}
}

// A pull cut short after its layers were stored but before the image was recorded
// leaves content no record owns: the next start frees it, and lists the writable
// snapshots so that the CRI can remove those no container owns.
func TestRestartFreesInterruptedPull(t *testing.T) {
	f := newFixture(t)
	host := imagetest.StartRegistry(t)
	keep := imagetest.NewImage(t, imagetest.ImageOptions{}, imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("keep", "k")))
	lost := imagetest.NewImage(t, imagetest.ImageOptions{}, imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("lost", "l")))
	imagetest.Push(t, host, "keep:1", keep)
	imagetest.Push(t, host, "lost:1", lost)
	ctx := context.Background()
	kept, err := f.svc.Pull(ctx, host+"/keep:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	blobsKept := f.blobs()
	img, err := f.svc.Pull(ctx, host+"/lost:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.PrepareRootfs("ctr-1", kept); err != nil {
		t.Fatal(err)
	}
	// The crash: the image's records never written.
	if err := f.db.Delete(imageBucket, img.ID); err != nil {
		t.Fatal(err)
	}
	for _, ref := range append(img.RepoTags, img.RepoDigests...) {
		if err := f.db.Delete(refBucket, ref); err != nil {
			t.Fatal(err)
		}
	}
	f.open()
	if got := f.blobs(); !slices.Equal(got, blobsKept) {
		t.Errorf("blobs after restart %v, want those of the kept image %v", got, blobsKept)
	}
	if snaps, _ := f.svc.snaps.List(); len(snaps) != 1 {
		t.Errorf("%d layer snapshots after restart, want 1", len(snaps))
	}
	keys, err := f.svc.RootfsKeys()
	if err != nil || !slices.Equal(keys, []string{"ctr-1"}) {
		t.Fatalf("RootfsKeys = %v, %v; want [ctr-1]", keys, err)
	}
	if err := f.svc.RemoveRootfs("ctr-1"); err != nil {
		t.Fatal(err)
	}
}

// TestStalledPullFailsTogether: pulls waiting for the same stalled layer fail together
// at the progress timeout (not one timeout after another, each downloading again), and
// the failed pulls leave nothing: no blob, not even the manifest and config they
// stored, no snapshot.
func TestStalledPullFailsTogether(t *testing.T) {
	f := newFixture(t)
	const timeout = 500 * time.Millisecond
	svc, err := New(Config{Root: filepath.Join(f.root, "images2"), Remote: remote.Config{ProgressTimeout: timeout}}, f.db, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	layer := imagetest.NewLayer(t, imagetest.OCI, imagetest.Uncompressed, imagetest.RandomFile("big", 1<<20, 7))
	img := imagetest.NewImage(t, imagetest.ImageOptions{}, layer)
	stall := imagetest.NewStaller()
	var counter imagetest.BlobCounter
	host := imagetest.StartRegistry(t, imagetest.WithBlobCounter(&counter), imagetest.WithStalledBlobs(imagetest.Blobs(imagetest.Digest(t, layer)), 1000, stall))
	imagetest.Push(t, host, "slow:v1", img)

	const pulls = 3
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, pulls)
	took := make([]time.Duration, pulls)
	for i := range pulls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = svc.Pull(context.Background(), host+"/slow:v1", nil)
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	for i := range pulls {
		var st *remote.StalledError
		if !errors.As(errs[i], &st) {
			t.Errorf("pull %d: %v, want the stall", i, errs[i])
		}
		if took[i] > 3*timeout {
			t.Errorf("pull %d ended after %v with a %v progress timeout", i, took[i], timeout)
		}
	}
	if n := counter.Gets(imagetest.Digest(t, layer)); n != 1 {
		t.Errorf("the stalled layer was downloaded %d times", n)
	}
	var left []digest.Digest
	_ = svc.content.Walk(func(d digest.Digest, _ int64) error { left = append(left, d); return nil })
	if len(left) != 0 {
		t.Errorf("blobs left by the failed pulls: %v", left)
	}
	if snaps, _ := svc.snaps.List(); len(snaps) != 0 {
		t.Errorf("snapshots left by the failed pulls: %d", len(snaps))
	}
	stall.Release()
	if _, err := svc.Pull(context.Background(), host+"/slow:v1", nil); err != nil {
		t.Fatalf("pull after the registry recovered: %v", err)
	}
}
