package snapshot

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"
)

// applyAll applies layers bottom-up and returns their chain IDs.
func applyAll(t testing.TB, s *Snapshotter, layers ...[]byte) []digest.Digest {
	t.Helper()
	var parent digest.Digest
	var out []digest.Digest
	for i, data := range layers {
		c := chainID(parent, data)
		info, err := s.Apply(context.Background(), c, parent, fmt.Sprintf("layer%d", i), bytes.NewReader(data))
		if err != nil {
			t.Fatalf("apply layer %d: %v", i, err)
		}
		if info.ChainID != c || info.Parent != parent {
			t.Fatalf("apply layer %d: info %+v, want chain %s parent %s", i, info, c, parent)
		}
		out = append(out, c)
		parent = c
	}
	return out
}

// threeLayers is an image exercising whiteouts, opaque dirs and every entry type.
func threeLayers(t testing.TB) [][]byte {
	var out [][]byte
	for _, es := range threeLayersEntries() {
		out = append(out, layerTar(t, es...))
	}
	return out
}

func TestThreeLayerImageMounted(t *testing.T) {
	f := newFixture(t, "")
	chain := applyAll(t, f.s, threeLayers(t)...)

	// The layer dirs carry overlay's forms of the OCI whiteouts.
	l1, err := f.s.Stat(chain[1])
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := describe(filepath.Join(l1.Dir, "del/gone")); d != "char 0000 0:0 0:0" {
		t.Errorf("whiteout in layer dir: %s, want a 0:0 char device", d)
	}
	if d, _ := describe(filepath.Join(l1.Dir, "opq")); !strings.Contains(d, "trusted.overlay.opaque=y") {
		t.Errorf("opaque dir in layer dir: %s, want trusted.overlay.opaque=y", d)
	}
	if _, err := os.Lstat(filepath.Join(l1.Dir, "opq/.wh..wh..opq")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("opaque marker written as a file: %v", err)
	}

	ms, err := f.s.Prepare("ctr1", chain[2])
	if err != nil {
		t.Fatal(err)
	}
	if ms[0].Type != "overlay" {
		t.Fatalf("mounts %+v, want overlay", ms)
	}
	if got, want := option(ms, "lowerdir"), ""; got == want {
		t.Fatalf("no lowerdir in %+v", ms)
	}
	lowers := strings.Split(option(ms, "lowerdir"), ":")
	var wantLowers []string
	for i := len(chain) - 1; i >= 0; i-- {
		info, err := f.s.Stat(chain[i])
		if err != nil {
			t.Fatal(err)
		}
		wantLowers = append(wantLowers, info.Dir)
	}
	if !slices.Equal(lowers, wantLowers) {
		t.Errorf("lowerdir %v, want topmost first %v", lowers, wantLowers)
	}
	again, err := f.s.Mounts("ctr1")
	if err != nil || fmt.Sprint(again) != fmt.Sprint(ms) {
		t.Errorf("Mounts = %+v, %v; want what Prepare returned, %+v", again, err, ms)
	}

	mnt := mountAll(t, ms)
	want := map[string]string{
		"bin":             "dir 0755 0:0",
		"bin/tool":        `file 0750 1000:1001 "#!tool" user.origin=l0`,
		"bin/tool2":       `file 0750 1000:1001 "#!tool" user.origin=l0`,
		"bin/su":          `file 4755 0:0 "su"`,
		"etc":             "dir 0755 0:0",
		"etc/hosts":       `file 0644 0:0 "l1 hosts"`,
		"etc/l2":          `file 0400 0:0 "two"`,
		"del":             "dir 0755 0:0",
		"del/stays":       `file 0600 0:0 "stay"`,
		"opq":             "dir 0711 0:0",
		"opq/new":         `file 0644 0:0 "new"`,
		"link":            "symlink -> etc/hosts",
		"abs":             "symlink -> /etc/passwd",
		"dev":             "dir 0755 0:0",
		"dev/null":        "char 0666 0:0 1:3",
		"home":            "dir 0755 0:0",
		"home/u":          "dir 0700 1000:1000",
		"home/u/.profile": `file 0644 1000:1000 "export X=1"`,
		"usr":             "dir 0755 0:0",
		"usr/lib":         "dir 0755 0:0",
		"usr/lib/libx.so": `file 0644 0:0 "elf"`,
		"lib":             "symlink -> usr/lib",
	}
	if d := diffTrees(want, tree(t, mnt)); d != "" {
		t.Errorf("mounted rootfs differs from the image:\n%s", d)
	}
	var a, b unix.Stat_t
	if err := unix.Lstat(filepath.Join(mnt, "bin/tool"), &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lstat(filepath.Join(mnt, "bin/tool2"), &b); err != nil {
		t.Fatal(err)
	}
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("hard link lost: bin/tool ino %d nlink %d, bin/tool2 ino %d", a.Ino, a.Nlink, b.Ino)
	}

	// Writes land in the upper dir and nowhere else.
	if err := os.WriteFile(filepath.Join(mnt, "newfile"), []byte("written"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "etc/hosts"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(mnt, "bin/su")); err != nil {
		t.Fatal(err)
	}
	upper := option(ms, "upperdir")
	if d, _ := describe(filepath.Join(upper, "newfile")); d != `file 0644 0:0 "written"` {
		t.Errorf("upper newfile: %q", d)
	}
	if d, _ := describe(filepath.Join(upper, "etc/hosts")); d != `file 0644 0:0 "changed"` {
		t.Errorf("upper etc/hosts: %q", d)
	}
	if d, _ := describe(filepath.Join(upper, "bin/su")); !strings.HasPrefix(d, "char ") || !strings.HasSuffix(d, " 0:0") {
		t.Errorf("upper bin/su: %q, want a whiteout", d)
	}
	for i, c := range chain {
		info, _ := f.s.Stat(c)
		if _, err := os.Lstat(filepath.Join(info.Dir, "newfile")); err == nil {
			t.Errorf("write reached layer %d", i)
		}
	}
	if d, _ := describe(filepath.Join(wantLowers[1], "etc/hosts")); d != `file 0644 0:0 "l1 hosts"` {
		t.Errorf("layer 1 etc/hosts changed: %s", d)
	}

	if err := f.s.RemoveActive("ctr1"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("RemoveActive while mounted: %v, want FailedPrecondition", err)
	}
	unmount(t, mnt)
	if err := f.s.RemoveActive("ctr1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Dir(upper)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("active dir still there: %v", err)
	}
	if _, err := f.s.Mounts("ctr1"); !errdefs.IsNotFound(err) {
		t.Errorf("Mounts after RemoveActive: %v, want NotFound", err)
	}
	if err := f.s.RemoveActive("ctr1"); err != nil {
		t.Errorf("second RemoveActive: %v", err)
	}
}

func TestPrepareEmptyRootfs(t *testing.T) {
	f := newFixture(t, "")
	ms, err := f.s.Prepare("empty", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].Type != "bind" || !slices.Equal(ms[0].Options, []string{"rw", "rbind"}) {
		t.Fatalf("mounts %+v, want one rw bind mount", ms)
	}
	mnt := mountAll(t, ms)
	if err := os.WriteFile(filepath.Join(mnt, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(ms[0].Source, "f")); err != nil {
		t.Errorf("write did not land in the snapshot: %v", err)
	}
	unmount(t, mnt)
	if err := f.s.RemoveActive("empty"); err != nil {
		t.Fatal(err)
	}
	if got := names(t, f.root); len(got) != 0 {
		t.Errorf("left in root: %v", got)
	}
}

func TestSharedLayers(t *testing.T) {
	f := newFixture(t, "")
	data := threeLayers(t)[0]
	c := chainID("", data)
	first, err := f.s.Apply(context.Background(), c, "", "l0", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	// A second image with the same layer: the stream must not even be read.
	var untouched failReader
	second, err := f.s.Apply(context.Background(), c, "", "l0-again", &untouched)
	if err != nil {
		t.Fatal(err)
	}
	if second != first || untouched.reads != 0 {
		t.Errorf("second Apply = %+v (stream read %d times), want %+v unread", second, untouched.reads, first)
	}

	// Many pulls of one new layer at once: one unpacks, the others get its result.
	l1 := threeLayers(t)[1]
	c1 := chainID(c, l1)
	const n = 8
	var wg sync.WaitGroup
	var reads atomic.Int32
	infos := make([]Info, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &countingReader{r: bytes.NewReader(l1), reads: &reads}
			infos[i], errs[i] = f.s.Apply(context.Background(), c1, c, "l1", r)
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || infos[i] != infos[0] {
			t.Errorf("concurrent Apply %d = %+v, %v; want %+v", i, infos[i], errs[i], infos[0])
		}
	}
	list, err := f.s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 {
		t.Errorf("List = %+v, want 2 snapshots", list)
	}
	if got := names(t, f.root); len(got) != 2 {
		t.Errorf("root holds %v, want two layer dirs", got)
	}
	if d := diffTrees(tree(t, first.Dir), tree(t, filepath.Join(f.root, filepath.Base(first.Dir)))); d != "" {
		t.Error(d)
	}
}

// failReader fails every read and counts them.
type failReader struct{ reads int }

func (r *failReader) Read([]byte) (int, error) {
	r.reads++
	return 0, errors.New("must not be read")
}

// countingReader counts the streams that were read at all.
type countingReader struct {
	r     io.Reader
	once  sync.Once
	reads *atomic.Int32
}

func (r *countingReader) Read(p []byte) (int, error) {
	r.once.Do(func() { r.reads.Add(1) })
	return r.r.Read(p)
}

func TestMaliciousLayersRefused(t *testing.T) {
	requireOverlay(t)
	// Outside the snapshot root: must stay exactly as it is.
	sentinel := t.TempDir()
	if err := os.WriteFile(filepath.Join(sentinel, "keep"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, etcEvilErr := os.Lstat("/etc/evil")
	passwd := identify(t, "/etc/passwd")
	up := strings.Repeat("../", 12)

	tests := []struct {
		name  string
		base  [][]entry // applied first, must succeed
		evil  []entry   // must be refused
		entry string    // the entry the error must name
	}{
		{name: "dot-dot entry", evil: []entry{fileE("ok", "ok", 0o644), fileE("../escape", "x", 0o644)}, entry: "../escape"},
		{name: "deep dot-dot entry", evil: []entry{fileE("a/../../../escape", "x", 0o644)}, entry: "../../escape"},
		{name: "absolute entry", evil: []entry{fileE("/etc/evil", "x", 0o644)}, entry: "/etc/evil"},
		{
			name:  "symlink then through it, one layer",
			evil:  []entry{symlinkE("evil", sentinel), fileE("evil/file", "x", 0o644)},
			entry: "evil/file",
		},
		{
			name:  "relative symlink then through it",
			evil:  []entry{symlinkE("up", up+strings.TrimPrefix(sentinel, "/")), fileE("up/keep", "x", 0o644)},
			entry: "up/keep",
		},
		{
			name:  "symlink then a dir through it",
			evil:  []entry{symlinkE("evil", sentinel), dirE("evil/sub/", 0o755)},
			entry: "evil/sub",
		},
		{
			name:  "symlink in a lower layer",
			base:  [][]entry{{symlinkE("evil", sentinel)}},
			evil:  []entry{fileE("evil/file", "x", 0o644)},
			entry: "evil/file",
		},
		{
			name:  "symlink two layers down under a merged dir",
			base:  [][]entry{{dirE("d/", 0o755), symlinkE("d/evil", sentinel)}, {fileE("d/other", "o", 0o644)}},
			evil:  []entry{fileE("d/evil/keep", "x", 0o644)},
			entry: "d/evil/keep",
		},
		{
			name:  "whiteout through a lower symlink",
			base:  [][]entry{{symlinkE("evil", sentinel)}},
			evil:  []entry{fileE("evil/.wh.keep", "", 0o644)},
			entry: "evil/.wh.keep",
		},
		{name: "hard link to an absolute path", evil: []entry{hardlinkE("pw", "/etc/passwd")}, entry: "pw"},
		{name: "hard link with dot-dot", evil: []entry{hardlinkE("pw", "../../../../etc/passwd")}, entry: "pw"},
		{
			name:  "hard link through a symlink",
			evil:  []entry{symlinkE("etc", "/etc"), hardlinkE("pw", "etc/passwd")},
			entry: "pw",
		},
		{
			name:  "hard link through a lower symlink",
			base:  [][]entry{{symlinkE("etc", "/etc")}},
			evil:  []entry{hardlinkE("pw", "etc/passwd")},
			entry: "pw",
		},
		// Layers the unpack cannot create: refused before it tries, naming the entry.
		{name: "hard link to a missing target", evil: []entry{hardlinkE("pw", "nope")}, entry: "pw"},
		{name: "hard link to a later entry", evil: []entry{hardlinkE("pw", "later"), fileE("later", "x", 0o644)}, entry: "pw"},
		{
			name:  "hard link into a lower layer",
			base:  [][]entry{{fileE("f", "lower", 0o644)}},
			evil:  []entry{hardlinkE("pw", "f")},
			entry: "pw",
		},
		{name: "hard link to itself", evil: []entry{fileE("a", "a", 0o644), hardlinkE("a", "a")}, entry: "a"},
		{name: "hard link to a directory", evil: []entry{dirE("d/", 0o755), hardlinkE("pw", "d")}, entry: "pw"},
		{name: "hard link beneath a file", evil: []entry{fileE("f", "x", 0o644), hardlinkE("pw", "f/x")}, entry: "pw"},
		{name: "whiteout of dot-dot", evil: []entry{dirE("d/", 0o755), fileE("d/.wh...", "", 0o644)}, entry: "d/.wh..."},
		{name: "whiteout of dot at the root", evil: []entry{fileE(".wh..", "", 0o644)}, entry: ".wh.."},
		{name: "whiteout of dot", evil: []entry{fileE("d/.wh..", "", 0o644)}, entry: "d/.wh.."},
		{name: "whiteout of nothing", evil: []entry{fileE("d/.wh.", "", 0o644)}, entry: "d/.wh."},
		{
			name:  "opaque marker beneath a file",
			evil:  []entry{fileE("f", "x", 0o644), fileE("f/.wh..wh..opq", "", 0o644)},
			entry: "f/.wh..wh..opq",
		},
		{name: "entry beneath a file", evil: []entry{fileE("f", "x", 0o644), fileE("f/x", "x", 0o644)}, entry: "f/x"},
		// The filter knows the layer's directories; a later entry replacing one is seen.
		{
			name:  "dir replaced by a symlink later in the same tar",
			evil:  []entry{dirE("d/", 0o755), fileE("d/f", "f", 0o644), symlinkE("d", sentinel), fileE("d/keep", "x", 0o644)},
			entry: "d/keep",
		},
		{
			name:  "parent dir made for an entry, then replaced by a symlink",
			evil:  []entry{fileE("a/b/f", "f", 0o644), symlinkE("a", sentinel), fileE("a/keep", "x", 0o644)},
			entry: "a/keep",
		},
		{
			name:  "dir replaced by a hard link",
			evil:  []entry{fileE("t", "t", 0o644), dirE("d/", 0o755), fileE("d/f", "f", 0o644), hardlinkE("d", "t"), fileE("d/x", "x", 0o644)},
			entry: "d/x",
		},
		{
			name:  "entry beneath a whiteout",
			base:  [][]entry{{dirE("d/", 0o755), fileE("d/old", "o", 0o644)}},
			evil:  []entry{fileE(".wh.d", "", 0o644), fileE("d/new", "n", 0o644)},
			entry: "d/new",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "")
			var parent digest.Digest
			var base []Info
			for _, es := range tc.base {
				data := layerTar(t, es...)
				info, err := f.s.Apply(context.Background(), chainID(parent, data), parent, "base", bytes.NewReader(data))
				if err != nil {
					t.Fatalf("base layer: %v", err)
				}
				base = append(base, info)
				parent = info.ChainID
			}
			baseTrees := map[string]map[string]string{}
			for _, b := range base {
				baseTrees[b.Dir] = tree(t, b.Dir)
			}
			outside := names(t, f.dir)

			data := layerTar(t, tc.evil...)
			const layerName = "sha256:evil-layer"
			_, err := f.s.Apply(context.Background(), chainID(parent, data), parent, layerName, bytes.NewReader(data))
			if err == nil {
				t.Fatal("malicious layer accepted")
			}
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), layerName) || !strings.Contains(err.Error(), strconv.Quote(tc.entry)) {
				t.Errorf("error %q: want InvalidArgument naming %s and entry %q", err, layerName, tc.entry)
			}
			t.Log(err)

			// Nothing of the layer remains: no dir, no metadata.
			list, lerr := f.s.List()
			if lerr != nil || len(list) != len(base) {
				t.Errorf("List = %+v, %v; want only the %d base layers", list, lerr, len(base))
			}
			if _, err := f.s.Stat(chainID(parent, data)); !errdefs.IsNotFound(err) {
				t.Errorf("Stat of the refused layer: %v, want NotFound", err)
			}
			if got := len(names(t, f.root)); got != len(base) {
				t.Errorf("root holds %v, want only the %d base layer dirs", names(t, f.root), len(base))
			}
			for dir, want := range baseTrees {
				if d := diffTrees(want, tree(t, dir)); d != "" {
					t.Errorf("base layer %s changed:\n%s", dir, d)
				}
			}
			if u, i, err := f.s.Usage(); err != nil || len(base) == 0 && (u != 0 || i != 0) {
				t.Errorf("Usage = %d, %d, %v after a refused base layer; want 0", u, i, err)
			}
			// Nothing outside the root changed.
			if got := names(t, f.dir); !slices.Equal(got, outside) {
				t.Errorf("next to the root: %v, was %v", got, outside)
			}
			if got := tree(t, sentinel); len(got) != 1 || got["keep"] != `file 0644 0:0 "keep"` {
				t.Errorf("sentinel dir outside the root changed: %v", got)
			}
			if got := identify(t, "/etc/passwd"); got != passwd {
				t.Errorf("/etc/passwd changed: %+v, was %+v", got, passwd)
			}
			if _, err := os.Lstat("/etc/evil"); etcEvilErr != nil && err == nil {
				t.Error("/etc/evil was created")
			}
			for _, p := range []string{"/escape", filepath.Join(f.dir, "escape"), filepath.Join(filepath.Dir(f.dir), "escape")} {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("%s was created", p)
				}
			}
		})
	}
}

// TestTrickyLayersAccepted: layers that look like the refused ones but where the mounted
// image shows no symlink on the way are unpacked.
func TestTrickyLayersAccepted(t *testing.T) {
	tests := []struct {
		name   string
		layers [][]entry
		want   map[string]string // in the mounted rootfs, a subset
	}{
		{
			name: "symlink replaced by a dir in the same layer",
			layers: [][]entry{{
				symlinkE("s", "/etc"), dirE("s/", 0o755), fileE("s/f", "f", 0o644),
			}},
			want: map[string]string{"s": "dir 0755 0:0", "s/f": `file 0644 0:0 "f"`},
		},
		{
			name: "lower symlink removed by a whiteout",
			layers: [][]entry{
				{symlinkE("s", "/etc")},
				{fileE(".wh.s", "", 0o644)},
				{fileE("s/f", "f", 0o644)},
			},
			want: map[string]string{"s": "dir 0755 0:0", "s/f": `file 0644 0:0 "f"`},
		},
		{
			name: "lower symlink under a dir made opaque",
			layers: [][]entry{
				{dirE("d/", 0o755), symlinkE("d/s", "/etc")},
				{dirE("d/", 0o755), fileE("d/.wh..wh..opq", "", 0o644), fileE("d/s/f", "f", 0o644)},
			},
			want: map[string]string{"d/s": "dir 0755 0:0", "d/s/f": `file 0644 0:0 "f"`},
		},
		{
			name: "lower symlink replaced by a dir",
			layers: [][]entry{
				{symlinkE("s", "/etc")},
				{dirE("s/", 0o700), fileE("s/f", "f", 0o644)},
			},
			want: map[string]string{"s": "dir 0700 0:0", "s/f": `file 0644 0:0 "f"`},
		},
		{
			name: "symlinks pointing anywhere are just symlinks",
			layers: [][]entry{{
				symlinkE("a", "/etc/passwd"), symlinkE("b", "../../../etc"), hardlinkE("c", "a"),
			}},
			want: map[string]string{"a": "symlink -> /etc/passwd", "b": "symlink -> ../../../etc", "c": "symlink -> /etc/passwd"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "")
			var datas [][]byte
			for _, es := range tc.layers {
				datas = append(datas, layerTar(t, es...))
			}
			chain := applyAll(t, f.s, datas...)
			ms, err := f.s.Prepare("c", chain[len(chain)-1])
			if err != nil {
				t.Fatal(err)
			}
			got := tree(t, mountAll(t, ms))
			for p, w := range tc.want {
				if got[p] != w {
					t.Errorf("%s: %q, want %q", p, got[p], w)
				}
			}
		})
	}
}

// errReader fails after its data.
type errReader struct {
	r   io.Reader
	err error
	// before runs once, when the data is used up.
	before func()
}

func (r *errReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err == io.EOF {
		if r.before != nil {
			r.before()
			r.before = nil
		}
		return n, r.err
	}
	return n, err
}

func TestInterruptedApply(t *testing.T) {
	f := newFixture(t, "")
	base := applyAll(t, f.s, layerTar(t, fileE("base", "b", 0o644)))[0]
	var entries []entry
	for i := range 50 {
		entries = append(entries, fileE(fmt.Sprintf("d%d/f", i), strings.Repeat("x", 4096), 0o644))
	}
	data := layerTar(t, entries...)
	half := data[:len(data)/2]

	errNet := errors.New("connection reset by peer")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// invalid: the layer's own fault (InvalidArgument); a failing reader or context is
	// not, whatever the tar reader makes of the cut.
	tests := []struct {
		name    string
		ctx     context.Context
		r       io.Reader
		want    error
		invalid bool
	}{
		{name: "reader fails", ctx: context.Background(), r: &errReader{r: bytes.NewReader(half), err: errNet}, want: errNet},
		{name: "reader fails mid-header", ctx: context.Background(), r: &errReader{r: bytes.NewReader(data[:700]), err: errNet}, want: errNet},
		{name: "truncated stream", ctx: context.Background(), r: bytes.NewReader(half), want: io.ErrUnexpectedEOF, invalid: true},
		{name: "truncated in a header", ctx: context.Background(), r: bytes.NewReader(data[:700]), want: io.ErrUnexpectedEOF, invalid: true},
		{name: "not a tar", ctx: context.Background(), r: bytes.NewReader(bytes.Repeat([]byte("x"), 4096)), want: tar.ErrHeader, invalid: true},
		{name: "context canceled", ctx: ctx, r: &errReader{r: bytes.NewReader(half), err: nil, before: cancel}, want: context.Canceled},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.r
			if er, ok := r.(*errReader); ok && er.err == nil {
				// Keep the stream alive (and valid) so that only the context stops it.
				r = io.MultiReader(er, bytes.NewReader(data[len(half):]))
				er.err = io.EOF
			}
			_, err := f.s.Apply(tc.ctx, chainID(base, data), base, "sha256:cut", r)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), "sha256:cut") {
				t.Fatalf("Apply = %v, want %v naming the layer", err, tc.want)
			}
			if errdefs.IsInvalidArgument(err) != tc.invalid {
				t.Errorf("Apply = %v: InvalidArgument is %v, want %v", err, errdefs.IsInvalidArgument(err), tc.invalid)
			}
			if got := names(t, f.root); len(got) != 1 {
				t.Errorf("root holds %v, want only the base layer", got)
			}
			if list, _ := f.s.List(); len(list) != 1 {
				t.Errorf("List = %+v, want only the base layer", list)
			}
		})
	}

	// A crash leaves a temp dir, a dir whose record never got written, a record whose
	// dir is gone (with a child): reopening cleans all of it.
	if err := os.MkdirAll(filepath.Join(f.root, tmpPrefix+"123/a/b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(f.root, "4242/fs"), 0o755); err != nil {
		t.Fatal(err)
	}
	ghost := digest.FromString("ghost")
	if err := f.st.Put(layerBucket, ghost.String(), layerRecord{ID: 777}); err != nil {
		t.Fatal(err)
	}
	ghostChild := digest.FromString("ghost child")
	if err := os.Mkdir(filepath.Join(f.root, "778"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := f.st.Put(layerBucket, ghostChild.String(), layerRecord{ID: 778, Parent: ghost}); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(f.root, f.st)
	if err != nil {
		t.Fatal(err)
	}
	baseInfo, err := s2.Stat(base)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(t, f.root); !slices.Equal(got, []string{filepath.Base(baseInfo.Dir)}) {
		t.Errorf("after reopening, root holds %v; want only the base layer", got)
	}
	for _, c := range []digest.Digest{ghost, ghostChild} {
		if _, err := s2.Stat(c); !errdefs.IsNotFound(err) {
			t.Errorf("record without a dir kept: %s: %v", c, err)
		}
	}
	info, err := s2.Apply(context.Background(), chainID(base, data), base, "again", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := strconv.Atoi(filepath.Base(info.Dir)); n <= 4242 {
		t.Errorf("new layer dir %s reuses a number seen before", info.Dir)
	}
}

func TestRemove(t *testing.T) {
	f := newFixture(t, "")
	chain := applyAll(t, f.s, threeLayers(t)[:2]...)
	if err := f.s.Remove(chain[0]); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), chain[1].String()) {
		t.Errorf("Remove of a parent: %v, want FailedPrecondition naming the child", err)
	}
	if _, err := f.s.Prepare("ctr", chain[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.Prepare("ctr", chain[1]); !errdefs.IsAlreadyExists(err) {
		t.Errorf("duplicate Prepare: %v, want AlreadyExists", err)
	}
	if _, err := f.s.Prepare("other", digest.FromString("nope")); !errdefs.IsNotFound(err) {
		t.Errorf("Prepare on an unknown parent: %v, want NotFound", err)
	}
	if err := f.s.Remove(chain[1]); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "ctr") {
		t.Errorf("Remove of a layer in use by a container: %v, want FailedPrecondition naming it", err)
	}
	if _, err := f.s.Apply(context.Background(), digest.FromString("x"), digest.FromString("nope"), "x", bytes.NewReader(nil)); !errdefs.IsNotFound(err) {
		t.Errorf("Apply on an unknown parent: %v, want NotFound", err)
	}
	if err := f.s.RemoveActive("ctr"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []digest.Digest{chain[1], chain[0], chain[0], digest.FromString("unknown")} {
		if err := f.s.Remove(c); err != nil {
			t.Errorf("Remove %s: %v", c, err)
		}
	}
	if _, err := f.s.Stat(chain[0]); !errdefs.IsNotFound(err) {
		t.Errorf("Stat after Remove: %v, want NotFound", err)
	}
	if got := names(t, f.root); len(got) != 0 {
		t.Errorf("left in root: %v", got)
	}
}

func TestUsage(t *testing.T) {
	f := newFixture(t, "")
	const big = 1 << 20
	entries := []entry{fileE("big", strings.Repeat("b", big), 0o644), dirE("d/", 0o755)}
	for i := range 10 {
		entries = append(entries, fileE(fmt.Sprintf("d/%d", i), "small", 0o644))
	}
	entries = append(entries, hardlinkE("big2", "big"))
	chain := applyAll(t, f.s, layerTar(t, entries...))
	info, _ := f.s.Stat(chain[0])
	bytes0, inodes0, err := f.s.Usage()
	if err != nil {
		t.Fatal(err)
	}
	// root + big (linked twice, counted once) + d + 10 files.
	if inodes0 != 13 || info.Inodes != 13 {
		t.Errorf("inodes %d (layer %d), want 13", inodes0, info.Inodes)
	}
	if bytes0 < big || bytes0 > big+128<<10 || bytes0 != info.Size {
		t.Errorf("bytes %d (layer %d), want a little over %d", bytes0, info.Size, big)
	}

	ms, err := f.s.Prepare("ctr", chain[0])
	if err != nil {
		t.Fatal(err)
	}
	mnt := mountAll(t, ms)
	if err := os.WriteFile(filepath.Join(mnt, "written"), bytes.Repeat([]byte("w"), 256<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	// Blocks are allocated at writeback on ext4.
	unix.Sync()
	bytes1, inodes1, err := f.s.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if bytes1 < bytes0+256<<10 || inodes1 != inodes0+2 {
		t.Errorf("after writing 256 KiB into a container: %d bytes, %d inodes; want >= %d, %d (upper root + file)", bytes1, inodes1, bytes0+256<<10, inodes0+2)
	}
	// The container's own share: only its upper dir, none of the image's layers.
	cb, ci, err := f.s.ActiveUsage("ctr")
	if err != nil {
		t.Fatal(err)
	}
	if cb < 256<<10 || cb > 256<<10+64<<10 || ci != 2 {
		t.Errorf("ActiveUsage = %d bytes, %d inodes; want ~256 KiB and 2 (upper root + file)", cb, ci)
	}
	if _, _, err := f.s.ActiveUsage("nope"); !errdefs.IsNotFound(err) {
		t.Errorf("ActiveUsage of unknown key = %v, want NotFound", err)
	}
}

func TestManyLayers(t *testing.T) {
	requireOverlay(t)
	// A short root, as /var/lib/crisp/snapshots is in production: t.TempDir's paths are
	// long enough to halve the layers that fit.
	base, err := os.MkdirTemp("", "s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	f := newFixture(t, base)
	const n = 120
	var layers [][]byte
	for i := range n {
		layers = append(layers, layerTar(t, fileE(fmt.Sprintf("f%03d", i), strconv.Itoa(i), 0o644)))
	}
	chain := applyAll(t, f.s, layers...)
	ms, err := f.s.Prepare("ctr", chain[n-1])
	if err != nil {
		t.Fatal(err)
	}
	got := tree(t, mountAll(t, ms))
	if len(got) != n || got["f000"] != `file 0644 0:0 "0"` || got[fmt.Sprintf("f%03d", n-1)] != fmt.Sprintf(`file 0644 0:0 "%d"`, n-1) {
		t.Errorf("mounted %d layers, see %d entries: %v", n, len(got), got)
	}

	// Too many for one mount: a clear error rather than EINVAL from mount(2).
	lowers := make([]string, 300)
	for i := range lowers {
		lowers[i] = "/var/lib/crisp/snapshots/" + strconv.Itoa(1000+i)
	}
	if _, err := f.s.mounts(filepath.Join(f.root, "1"), lowers); !errdefs.IsInvalidArgument(err) {
		t.Errorf("300 layers: %v, want InvalidArgument", err)
	}
}

// BenchmarkApply50MB unpacks ~50 MB layers: many small files (file creation bound) and
// a few large ones (bandwidth bound).
func BenchmarkApply50MB(b *testing.B) {
	for _, shape := range []struct{ dirs, files, size int }{{100, 10, 50 << 10}, {2, 5, 5 << 20}} {
		b.Run(fmt.Sprintf("%dx%dKiB", shape.dirs*shape.files, shape.size>>10), func(b *testing.B) {
			f := newFixture(b, "")
			var entries []entry
			body := strings.Repeat("0123456789abcdef", shape.size/16)
			for d := range shape.dirs {
				entries = append(entries, dirE(fmt.Sprintf("d%d/", d), 0o755))
				for i := range shape.files {
					entries = append(entries, fileE(fmt.Sprintf("d%d/f%d", d, i), body, 0o644))
				}
			}
			data := layerTar(b, entries...)
			b.SetBytes(int64(len(data)))
			b.ResetTimer()
			for i := range b.N {
				c := digest.FromString(strconv.Itoa(i))
				if _, err := f.s.Apply(context.Background(), c, "", "bench", bytes.NewReader(data)); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := f.s.Remove(c); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
